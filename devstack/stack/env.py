"""What clients need to reach a running local stack."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

__all__ = ["S3_REGION", "StackEnv"]

#: The region every S3 client is told to use (clients refuse or call AWS without one).
S3_REGION = "us-east-1"


@dataclass(frozen=True)
class StackEnv:
    """Addresses and keys of a running local stack. A field is None when that component is not
    part of the stack (``stack up`` with a subset of components)."""

    home: Path
    kafka_bootstrap: str | None = None
    s3_endpoint: str | None = None
    s3_access_key: str | None = None
    s3_secret_key: str | None = None
    s3_region: str = S3_REGION
    redis_url: str | None = None
    schema_registry_url: str | None = None

    def as_dict(self) -> dict[str, str]:
        """The environment variables (``BERGSTREAM_*``) for this stack, absent components left
        out."""
        out = {"BERGSTREAM_HOME": str(self.home)}
        if self.kafka_bootstrap is not None:
            out["BERGSTREAM_KAFKA_BOOTSTRAP"] = self.kafka_bootstrap
        if self.s3_endpoint is not None:
            out["BERGSTREAM_S3_ENDPOINT"] = self.s3_endpoint
            out["BERGSTREAM_S3_ACCESS_KEY"] = self.s3_access_key or ""
            out["BERGSTREAM_S3_SECRET_KEY"] = self.s3_secret_key or ""
            out["BERGSTREAM_S3_REGION"] = self.s3_region
        if self.redis_url is not None:
            out["BERGSTREAM_REDIS_URL"] = self.redis_url
        if self.schema_registry_url is not None:
            out["BERGSTREAM_SCHEMA_REGISTRY_URL"] = self.schema_registry_url
        return out

    def as_exports(self) -> str:
        """Shell lines ``export NAME=VALUE`` (values shell-quoted), one per variable, for
        ``eval "$(bergstream stack env)"``."""
        return "\n".join(
            f"export {name}={shlex.quote(value)}" for name, value in self.as_dict().items()
        )
