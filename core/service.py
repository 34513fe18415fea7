"""The contract of a long-running service started by ``bergstream run``."""

from __future__ import annotations

from typing import Protocol


class Service(Protocol):
    """Something ``bergstream run`` starts and stops: the proxy, an ISK gateway, ...

    ``start`` returns once the service accepts work; ``stop`` returns once it released
    everything (ports, files, processes).
    """

    name: str

    async def start(self) -> None:
        """Start serving; return when ready."""
        ...

    async def stop(self) -> None:
        """Stop serving and release every resource; safe to call twice."""
        ...
