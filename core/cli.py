"""The ``bergstream`` command line.

Core commands live here; plugins add theirs through the ``register_commands`` hook, so this module
imports no plugin.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bergstream.core import __version__
from bergstream.core.logs import LOG_FORMATS, configure_logging

if TYPE_CHECKING:
    from bergstream.core.plugins import PluginRegistry


def _registry() -> PluginRegistry:
    from bergstream.core.plugins import PluginError, load_registry

    try:
        return load_registry()
    except PluginError as error:
        raise click.ClickException(str(error)) from None


class _RootGroup(click.Group):
    """The root command: core's commands, and the plugins' (``register_commands``) added the
    first time a command core does not have is asked for or the commands are listed, so
    ``--version`` and core's own commands start without loading any plugin."""

    _plugins_loaded = False

    def load_plugin_commands(self) -> None:
        """Add every plugin's commands (once); a plugin that fails to load is a warning."""
        from bergstream.core.plugins import (
            PluginError,
            load_registry,
            remember_command_registry,
        )

        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        try:
            registry = load_registry()
        except PluginError as error:
            click.echo(f"warning: {error}", err=True)
            return
        remember_command_registry(registry)
        registry.manager.hook.register_commands(cli=self)

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command, the plugins' included."""
        self.load_plugin_commands()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """Core's command ``cmd_name``, else a plugin's."""
        command = super().get_command(ctx, cmd_name)
        if command is None and not self._plugins_loaded:
            self.load_plugin_commands()
            command = super().get_command(ctx, cmd_name)
        return command


@click.group(cls=_RootGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="bergstream")
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="More log output: -v for debug, -vv adds the Kafka client's every request.",
)
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    envvar="BERGSTREAM_LOG_FORMAT",
    default=None,
    help="Log lines as text or JSON (default: text, or `logging.format` of a run's config).",
)
@click.pass_context
def cli(ctx: click.Context, verbose: int, log_format: str | None) -> None:
    """bergstream: Kafka and Apache Iceberg as one dataset."""
    ctx.obj = {"verbose": verbose, "log_format": log_format}
    level = logging.WARNING - 10 * min(verbose + 1, 2)
    configure_logging(level, "json" if log_format == "json" else "text", trace_clients=verbose >= 2)


@cli.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def plugins_command(as_json: bool) -> None:
    """List installed plugins, their version and what each registers."""
    infos = _registry().plugin_infos()
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "name": info.name,
                        "distribution": info.distribution,
                        "version": info.version,
                        "hooks": list(info.hooks),
                        "registers": [
                            {"kind": kind, "name": name} for kind, name in info.registrations
                        ],
                    }
                    for info in infos
                ],
                indent=2,
            )
        )
        return
    if not infos:
        click.echo("no plugins installed")
        return
    for info in infos:
        origin = f"{info.distribution} {info.version}" if info.distribution else "local"
        click.echo(f"{info.name} ({origin})")
        click.echo(f"  hooks: {', '.join(info.hooks) or '-'}")
        for kind, name in info.registrations:
            click.echo(f"  {kind}: {name}")


@cli.group("config")
def config_group() -> None:
    """Work with config files."""


@config_group.command("check")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@click.argument("file", type=click.Path(path_type=Path))
def config_check(file: Path, as_json: bool) -> None:
    """Validate FILE: exit 0 if good, else print every problem and exit 1."""
    from bergstream.core.config import ConfigError, load_config
    from bergstream.core.config_checks import nothing_to_run
    from bergstream.core.runner import build_services

    registry = _registry()
    try:
        config = load_config(file, registry=registry)
        idle = nothing_to_run(config, lake_runs=True)
        if idle:
            raise ConfigError(idle)
        # What `run` does with a loaded file before anything listens or connects.
        build_services(config, registry)
    except ConfigError as error:
        if as_json:
            problems = [problem.as_json() for problem in error.problems]
            click.echo(json.dumps({"file": str(file), "ok": False, "problems": problems}))
        else:
            for problem in error.problems:
                click.echo(str(problem), err=True)
            click.echo(f"{file}: {len(error.problems)} problem(s)", err=True)
        sys.exit(1)
    counts = {
        "virtual_clusters": len(config.virtual_clusters),
        "filters": sum(len(c.filters) for c in config.virtual_clusters),
        "services": len(config.services),
        "lake": config.lake is not None,
    }
    if as_json:
        click.echo(json.dumps({"file": str(file), "ok": True, "problems": [], **counts}))
        return
    click.echo(
        f"{file}: OK ({counts['virtual_clusters']} virtual cluster(s), {counts['filters']} "
        f"filter(s), {counts['services']} service(s){', a lake' if counts['lake'] else ''})"
    )


@config_group.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of YAML.")
@click.argument("file", type=click.Path(path_type=Path))
def config_show(file: Path, as_json: bool) -> None:
    """Print FILE as bergstream resolves it: defaults filled in, ${VAR}s substituted, each
    plugin's settings validated, secrets masked."""
    import yaml

    from bergstream.core.config import ConfigError, load_config
    from bergstream.core.config_show import resolved_config

    try:
        config = load_config(file, registry=_registry())
    except ConfigError as error:
        raise click.ClickException(f"{error}\n{file}: {len(error.problems)} problem(s)") from None
    resolved = resolved_config(config)
    if as_json:
        click.echo(json.dumps(resolved, indent=2))
    else:
        click.echo(yaml.safe_dump(resolved, sort_keys=False, allow_unicode=True), nl=False)


@cli.command("run")
@click.option(
    "-c",
    "--config",
    "config_file",
    required=True,
    type=click.Path(path_type=Path),
    help="Config file to run.",
)
@click.pass_context
def run_command(ctx: click.Context, config_file: Path) -> None:
    """Start everything the config file configures; SIGTERM or Ctrl-C stops it cleanly."""
    from bergstream.core.config import ConfigError, load_config
    from bergstream.core.config_checks import nothing_to_run
    from bergstream.core.plugins import PluginError
    from bergstream.core.runner import run_until_signalled

    registry = _registry()
    try:
        config = load_config(config_file, registry=registry)
        idle = nothing_to_run(config, lake_runs=False)
        if idle:
            raise ConfigError(idle)
    except ConfigError as error:
        raise click.ClickException(str(error)) from None
    options = ctx.obj or {}
    level = (
        logging.DEBUG
        if options.get("verbose")
        else logging.getLevelNamesMapping()[config.logging.level.upper()]
    )
    configure_logging(
        level,
        options.get("log_format") or config.logging.format,
        trace_clients=options.get("verbose", 0) >= 2,
    )
    try:
        run_until_signalled(config, registry)
    except ConfigError as error:
        raise click.ClickException(str(error)) from None
    except (PluginError, OSError, ValueError, RuntimeError) as error:
        # Start-up failures (a port in use, a plugin that cannot start with these settings)
        # are the operator's to fix: one line, not a traceback.
        raise click.ClickException(f"{config_file}: cannot start: {error}") from None


def build_cli() -> click.Group:
    """The root command with every plugin's subcommands added (``register_commands``)."""
    cli.load_plugin_commands()
    return cli


def main() -> None:
    """Entry point of the ``bergstream`` console script."""
    # kio (the proxy's Kafka protocol library) imports hypothesis when it is installed (a
    # development setup) to register test-data strategies: 2.4 s of start-up measured here, and
    # a .hypothesis folder in the working directory. No command generates test data, so the
    # command hides hypothesis from kio (importing it raises ImportError, which kio expects).
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]
    # A crash in native code (Arrow, numba kernels, SQLite, librdkafka) then leaves every
    # thread's Python stack on stderr, where the service's log is, instead of a bare exit -11.
    faulthandler.enable()
    cli(prog_name="bergstream")
