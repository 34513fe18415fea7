"""The base of every config model: unknown keys are errors and a loaded config is immutable."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A config model that refuses unknown keys (typos surface at load time) and is frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")


def is_host(text: str) -> bool:
    """Whether ``text`` is an IPv4/IPv6 address (IPv6 possibly in brackets) or a DNS name."""
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        ipaddress.ip_address(bare)
        return True
    except ValueError:
        pass
    labels = bare.rstrip(".").split(".")
    return 0 < len(bare) <= 253 and all(_HOST_LABEL.match(label) for label in labels)


def check_bootstrap(value: str) -> str:
    """Validate a comma-separated ``host:port`` list (a Kafka bootstrap string): each host an
    address or a DNS name, each port 1-65535."""
    for part in value.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"'{part.strip()}' is not host:port (e.g. 127.0.0.1:9092)")
        if not 1 <= int(port) <= 65535:
            raise ValueError(f"'{part.strip()}': port {port} is outside 1-65535")
        if not is_host(host):
            raise ValueError(
                f"'{part.strip()}': '{host}' is not an IP address or host name "
                "(IPv6 goes in brackets: [::1]:9092)"
            )
    return value


#: A Kafka bootstrap string, checked to be a ``host:port`` list.
Bootstrap = Annotated[str, AfterValidator(check_bootstrap)]
