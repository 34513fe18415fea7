"""ISK over the secured stack (SASL_SSL, ACLs): ``bergstream run`` serving one ``isk`` service
that connects to Kafka as a properties file says, over HTTP or HTTPS."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

from bergstream.devstack.stack.ports import free_ports
from tests.kits.certs import ServerCertificate
from tests.support import ProxyProcess, start_bergstream_run

ACCESS_KEY = "isk-secure"
SECRET_KEY = "isk-secure-secret"


@dataclass
class Gateway:
    """A running ``bergstream run`` serving one ``isk`` service."""

    process: ProxyProcess
    catalog_url: str
    s3_url: str


def start_gateway(
    env: dict[str, str],
    workdir: Path,
    properties_file: Path | str,
    certs: ServerCertificate | None = None,
    more: str = "",
) -> Gateway:
    """``bergstream run`` of an isk service over the secured stack, connecting as
    ``properties_file`` says, over HTTPS with ``certs``; ``more``: top-level YAML after it
    (a ``lake:`` section)."""
    catalog_port, s3_port = free_ports(2)
    tls = (
        f'tls: {{cert_file: "{certs.cert_file}", key_file: "{certs.key_file}"}}'
        if certs is not None
        else ""
    )
    config = workdir / "isk.yaml"
    config.write_text(
        textwrap.dedent(
            f"""
            services:
              - type: isk
                config:
                  cluster: secure
                  kafka_bootstrap: "{env["BERGSTREAM_KAFKA_BOOTSTRAP"]}"
                  kafka_client:
                    properties_file: "{properties_file}"
                  chunk_records: 8
                  index_interval_seconds: 2
                  http:
                    catalog_port: {catalog_port}
                    s3_port: {s3_port}
                    access_key: {ACCESS_KEY}
                    secret_key: {SECRET_KEY}
                    {tls}
                  index: {{type: sqlite, config: {{path: "{workdir / "index.sqlite"}"}}}}
                  cache: {{type: local, config: {{directory: "{workdir / "cache"}"}}}}
            """
        )
        + more
    )
    running = start_bergstream_run(
        config,
        env["BERGSTREAM_KAFKA_BOOTSTRAP"],
        {**env, "BERGSTREAM_HOME": str(workdir / "home")},
        "the isk service",
    )
    scheme = "https" if certs is not None else "http"
    return Gateway(
        running, f"{scheme}://127.0.0.1:{catalog_port}", f"{scheme}://127.0.0.1:{s3_port}"
    )


def stop(gateway: Gateway) -> None:
    code = gateway.process.stop()
    assert code == 0, f"bergstream run exited with {code}:\n{gateway.process.log()}"
