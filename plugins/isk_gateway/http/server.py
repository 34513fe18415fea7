"""The ISK HTTP service: the REST catalog and the S3 gateway on two listeners, one provider."""

from __future__ import annotations

import ssl

from aiohttp import web

from bergstream.plugins.isk_gateway.http.catalog import CatalogSettings, RestCatalogApp
from bergstream.plugins.isk_gateway.http.config import IskHttpConfig, IskHttpTlsConfig
from bergstream.plugins.isk_gateway.http.principals import PrincipalDirectory
from bergstream.plugins.isk_gateway.http.s3 import S3Gateway
from bergstream.plugins.isk_gateway.tables.provider import TableProvider

__all__ = ["IskHttpConfig", "IskHttpService", "IskHttpTlsConfig"]


class IskHttpService:
    """A :class:`~bergstream.core.api.Service` serving the catalog and the S3 gateway."""

    name = "isk-http"

    def __init__(
        self,
        config: IskHttpConfig,
        provider: TableProvider,
        principals: PrincipalDirectory | None = None,
    ) -> None:
        self.config = config
        self.provider = provider
        #: With principals, every request runs as one (see :mod:`.principals`).
        self.principals = principals
        self._runners: list[web.AppRunner] = []
        self.catalog_url: str | None = None
        self.s3_url: str | None = None
        #: The REST catalog once started (the status page authenticates as it does).
        self.catalog: RestCatalogApp | None = None

    async def start(self) -> None:
        """Bind both listeners; return once they accept connections."""
        if self._runners:
            return
        c = self.config
        context = c.tls.server_context() if c.tls is not None else None
        scheme = "https" if context is not None else "http"
        try:
            s3_port = await self._listen(
                S3Gateway(
                    self.provider,
                    bucket=c.bucket,
                    access_key=c.access_key,
                    secret_key=c.secret_key.get_secret_value(),
                    region=c.region,
                    principals=self.principals,
                ).app(),
                c.s3_host,
                c.s3_port,
                context,
            )
            self.s3_url = f"{scheme}://{_url_host(c.s3_host)}:{s3_port}"
            settings = CatalogSettings(
                bucket=c.bucket,
                s3_endpoint=c.s3_public_endpoint or self.s3_url,
                access_key=c.access_key,
                secret_key=c.secret_key.get_secret_value(),
                region=c.region,
                prefix=c.prefix,
                client_id=c.client_id,
                client_secret=c.client_secret.get_secret_value() if c.client_secret else None,
                token_ttl_seconds=c.token_ttl_seconds,
                credentials_ttl_seconds=c.credentials_ttl_seconds,
                principals=self.principals,
            )
            self.catalog = RestCatalogApp(self.provider, settings)
            catalog_port = await self._listen(
                self.catalog.app(),
                c.catalog_host,
                c.catalog_port,
                context,
            )
            self.catalog_url = f"{scheme}://{_url_host(c.catalog_host)}:{catalog_port}"
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Close both listeners and their connections; safe to call twice."""
        runners, self._runners = self._runners, []
        for runner in reversed(runners):
            await runner.cleanup()

    async def _listen(
        self, app: web.Application, host: str, port: int, context: ssl.SSLContext | None
    ) -> int:
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        self._runners.append(runner)
        await web.TCPSite(runner, host, port, ssl_context=context).start()
        return int(runner.addresses[0][1])


def _url_host(host: str) -> str:
    """``host`` as it goes into a URL; a wildcard bind address becomes the loopback address."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
