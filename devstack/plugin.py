"""The dev stack's commands, added to ``bergstream`` through the ``register_commands`` hook:
``stack up|down|status|env`` and ``quickstart``. The stack and the quickstart are imported only
when a command runs, so ``bergstream --help`` stays fast."""

from __future__ import annotations

import json
import logging

import click

from bergstream.core.api import LogComponent, hookimpl

__all__ = ["quickstart_command", "register_commands", "stack_group"]


@click.group("stack")
def stack_group() -> None:
    """The local stack of real components: Kafka (KRaft), an S3 server, Redis, a Schema
    Registry and, on request, PostgreSQL, Kafka Connect (Debezium), a Kerberos KDC and an OIDC
    provider (Keycloak), Apache Iceberg's REST catalog server."""


@stack_group.command("up")
@click.option(
    "--component",
    "components",
    multiple=True,
    type=click.Choice(
        [
            *("kafka", "s3", "redis", "schema-registry", "postgres", "connect", "kdc", "oidc"),
            "rest-catalog",
        ]
    ),
    help="Only these (default: all but postgres, connect, kdc, oidc and rest-catalog; connect "
    "brings kafka along, rest-catalog s3).",
)
@click.option(
    "--brokers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Kafka nodes (each broker and controller); new topics get min(3, N) replicas.",
)
@click.option(
    "--security",
    default="plaintext",
    show_default=True,
    type=click.Choice(["plaintext", "sasl_ssl", "ssl"]),
    help="Kafka clients: no authentication, TLS with SCRAM/PLAIN users, or mutual TLS.",
)
@click.option(
    "--sasl-mechanism",
    "sasl_mechanisms",
    multiple=True,
    type=click.Choice(["scram-sha-512", "oauthbearer", "gssapi"]),
    help="With --security sasl_ssl: what the client files log in with (the first one given; "
    "repeat to enable several). oauthbearer starts Keycloak (component oidc), gssapi a Kerberos "
    "KDC (component kdc). Default: the running cluster's, scram-sha-512 for a new one.",
)
def stack_up_command(
    components: tuple[str, ...], brokers: int, security: str, sasl_mechanisms: tuple[str, ...]
) -> None:
    """Start the stack in the background under $BERGSTREAM_HOME; print its env when ready."""
    from bergstream.devstack.stack import StackError, stack_up

    try:
        env = stack_up(
            components=set(components) or None,
            brokers=brokers,
            security=security,
            sasl_mechanisms=sasl_mechanisms or None,
        )
    except StackError as error:
        raise click.ClickException(str(error)) from None
    click.echo(env.as_exports())


@stack_group.command("down")
def stack_down_command() -> None:
    """Stop every process the stack started, by PID."""
    from bergstream.devstack.stack import stack_down

    stopped = stack_down()
    click.echo("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


@stack_group.command("status")
def stack_status_command() -> None:
    """Show each component's PID, address and whether it runs."""
    from bergstream.devstack.stack import stack_status

    click.echo(json.dumps(stack_status(), indent=2, default=str))


@stack_group.command("env")
def stack_env_command() -> None:
    """Print the stack's ``export NAME=VALUE`` lines again."""
    from bergstream.devstack.stack import StackError, stack_env

    try:
        click.echo(stack_env().as_exports())
    except StackError as error:
        raise click.ClickException(str(error)) from None


@click.command("quickstart")
@click.option("--records", default=300_000, show_default=True, help="Payments to produce.")
@click.option("--hours", default=24.0, show_default=True, help="Time span of their timestamps.")
@click.option(
    "--cold-fraction",
    default=0.7,
    show_default=True,
    type=click.FloatRange(0.05, 0.95),
    help="Older share moved to the coldset and deleted from Kafka.",
)
@click.option(
    "--catalog-port", type=int, help="ISK catalog port [18181 or $BERGSTREAM_ISK_CATALOG_PORT]"
)
@click.option("--s3-port", type=int, help="ISK S3 gateway port [19000 or $BERGSTREAM_ISK_S3_PORT]")
@click.option(
    "--proxy-port", type=int, help="KSI proxy bootstrap port [19092 or $BERGSTREAM_PROXY_PORT]"
)
def quickstart_command(
    records: int,
    hours: float,
    cold_fraction: float,
    catalog_port: int | None,
    s3_port: int | None,
    proxy_port: int | None,
) -> None:
    """Start the stack, fill a topic, move its older part to Iceberg, and query it all."""
    import asyncio

    from bergstream.devstack.quickstart.run import (
        QuickstartError,
        QuickstartOptions,
        run_quickstart,
    )
    from bergstream.devstack.stack import StackError

    # The quickstart prints its own plain lines; the Kafka client's info (group joins,
    # reconnects) would only bury them. Errors still show.
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    if records < 10:
        raise click.BadParameter("at least 10", param_hint="--records")
    options = QuickstartOptions(
        records=records,
        hours=hours,
        cold_fraction=cold_fraction,
        catalog_port=catalog_port,
        s3_port=s3_port,
        proxy_port=proxy_port,
    )
    try:
        asyncio.run(run_quickstart(options, click.echo))
    except (QuickstartError, StackError, RuntimeError, OSError, ValueError) as error:
        raise click.ClickException(str(error)) from None


@hookimpl
def register_commands(cli: click.Group) -> None:
    """Add ``stack`` (up, down, status, env) and ``quickstart`` to the command line."""
    cli.add_command(stack_group)
    cli.add_command(quickstart_command)


@hookimpl
def register_log_components() -> list[LogComponent]:
    """The local stack logs as ``stack``, the demo as ``quickstart``."""
    return [
        LogComponent(logger="bergstream.stack", component="stack"),
        LogComponent(logger="bergstream.devstack", component="stack"),
        LogComponent(logger="bergstream.devstack.quickstart", component="quickstart"),
    ]
