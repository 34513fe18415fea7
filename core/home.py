"""Where bergstream keeps its state on this machine: one rule for every component.

``$BERGSTREAM_HOME`` (default ``./.bergstream``) holds the local stack's state and the default
lake; ``$BERGSTREAM_CACHE`` (default ``~/.cache/bergstream``) holds downloads shared by every home.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["bergstream_cache", "bergstream_home"]


def bergstream_home(home: Path | str | None = None) -> Path:
    """``home``, else ``$BERGSTREAM_HOME``, else ``./.bergstream``; absolute, not created."""
    if home is None:
        home = os.environ.get("BERGSTREAM_HOME") or ".bergstream"
    return Path(home).expanduser().resolve()


def bergstream_cache(cache: Path | str | None = None) -> Path:
    """``cache``, else ``$BERGSTREAM_CACHE``, else ``~/.cache/bergstream``; absolute, not made."""
    if cache is None:
        cache = os.environ.get("BERGSTREAM_CACHE") or Path.home() / ".cache" / "bergstream"
    return Path(cache).expanduser().resolve()
