"""The base of every config model: unknown keys are errors and a loaded config is immutable."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A config model that refuses unknown keys (typos surface at load time) and is frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def check_bootstrap(value: str) -> str:
    """Validate a comma-separated ``host:port`` list (a Kafka bootstrap string)."""
    for part in value.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"'{part}' is not host:port (e.g. 127.0.0.1:9092)")
    return value


#: A Kafka bootstrap string, checked to be a ``host:port`` list.
Bootstrap = Annotated[str, AfterValidator(check_bootstrap)]
