"""The settings of the ISK HTTP listeners (``isk``'s ``http`` block): pydantic only, so the
plugin registry loads them without the HTTP server."""

from __future__ import annotations

import re
import ssl
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator

from bergstream.core.api import StrictModel

__all__ = ["IskHttpConfig", "IskHttpTlsConfig"]

_PREFIX = re.compile(r"[A-Za-z0-9._~-]+")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


class IskHttpTlsConfig(StrictModel):
    """HTTPS on both listeners (the proxy's server TLS keys: cert_file, key_file, ca_file)."""

    cert_file: Path = Field(description="certificate (chain, PEM) both listeners present")
    key_file: Path = Field(description="private key (PEM) of cert_file")
    ca_file: Path | None = Field(
        None, description="if set, clients must present a certificate this CA (PEM) signed"
    )

    @field_validator("cert_file", "key_file", "ca_file")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"file {value} does not exist: give the path of a PEM file")
        return value

    @model_validator(mode="after")
    def _loads(self) -> IskHttpTlsConfig:
        self.server_context()  # a key that does not match its certificate fails the config
        return self

    def server_context(self) -> ssl.SSLContext:
        """The listeners' TLS context; ``ValueError`` naming the file that cannot be used."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as error:
            raise ValueError(
                f"cannot use the certificate {self.cert_file} with the key {self.key_file}: "
                f"{error} (both PEM, the key unencrypted and matching the certificate)"
            ) from None
        if self.ca_file is not None:
            try:
                context.load_verify_locations(cafile=self.ca_file)
            except (ssl.SSLError, OSError) as error:
                raise ValueError(
                    f"ca_file: cannot load CA certificates from {self.ca_file}: {error}"
                ) from None
            context.verify_mode = ssl.CERT_REQUIRED
        return context


class IskHttpConfig(StrictModel):
    """Listen addresses, the root key pair of vended S3 credentials, optional HTTPS and OAuth of
    one ISK gateway."""

    catalog_host: str = "127.0.0.1"
    catalog_port: int = Field(18181, ge=0, le=65535, description="0 picks a free port")
    s3_host: str = "127.0.0.1"
    s3_port: int = Field(19000, ge=0, le=65535, description="0 picks a free port")
    s3_public_endpoint: str | None = Field(
        None,
        description="S3 endpoint vended by LoadTable; default http(s)://<s3_host>:<s3_port>",
    )
    access_key: str = Field(min_length=1)
    secret_key: SecretStr
    region: str = Field("us-east-1", min_length=1)
    bucket: str = "bergstream"
    client_id: str | None = Field(None, description="OAuth client id; enables bearer auth")
    client_secret: SecretStr | None = None
    prefix: str | None = Field(None, description="serve the catalog under /v1/<prefix>/ too")
    token_ttl_seconds: int = Field(3600, gt=0)
    credentials_ttl_seconds: int = Field(
        3600,
        gt=0,
        le=43200,
        description="lifetime of the temporary S3 credentials LoadTable vends (at most 12 h)",
    )
    tls: IskHttpTlsConfig | None = Field(
        None, description="serve the catalog and the S3 gateway over HTTPS; plain HTTP if unset"
    )

    @field_validator("bucket")
    @classmethod
    def _valid_bucket(cls, value: str) -> str:
        if not _BUCKET.fullmatch(value) or ".." in value:
            raise ValueError("not a valid S3 bucket name (3-63 of a-z, 0-9, '.', '-')")
        return value

    @field_validator("prefix")
    @classmethod
    def _valid_prefix(cls, value: str | None) -> str | None:
        if value is not None and not _PREFIX.fullmatch(value):
            raise ValueError("prefix must be one path segment of letters, digits, . _ ~ -")
        return value

    @field_validator("s3_public_endpoint")
    @classmethod
    def _valid_endpoint(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("s3_public_endpoint must start with http:// or https://")
        return value.rstrip("/") if value else value

    @model_validator(mode="after")
    def _oauth_pair(self) -> IskHttpConfig:
        if (self.client_id is None) != (self.client_secret is None):
            raise ValueError("set both client_id and client_secret, or neither")
        return self
