"""The extension points of bergstream, one hookspec each.

A plugin is a module (or object) with functions named like the specs below, decorated with
``hookimpl`` from the public API (``from bergstream.core.api import hookimpl``), and published
under the ``bergstream`` entry-point group::

    [project.entry-points.bergstream]
    my_plugin = "my_package.plugin"

A function decorated with ``hookimpl`` whose name is no hookspec here (a misspelling) makes
loading the plugins fail with an error naming the plugin, the function and the nearest hook.
A plugin module may set ``BERGSTREAM_API = "MAJOR.MINOR"``, the :data:`API_VERSION` it was built
against: plugins built for another major version, or a newer minor one, are refused by name.

Registration hooks return a list of typed registrations; pluggy is only the registry, never on the
hot path. Built-in plugins register through the same entry-point group as third-party ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import click

    from bergstream.core.registrations import (
        CacheBackendRegistration,
        ConfigSectionRegistration,
        FileSynthesizerRegistration,
        FilterRegistration,
        IndexBackendRegistration,
        LogComponent,
        ServiceRegistration,
        ValueCodecRegistration,
    )

PROJECT = "bergstream"

#: The version of the public API (``bergstream.core.api``): ``MAJOR.MINOR``. MINOR grows when
#: names, hooks or optional fields are added (plugins built for an older minor keep working);
#: MAJOR grows when anything is removed or changes meaning (plugins must be rebuilt).
API_VERSION = "1.3"

#: The module attribute in which a plugin names the API version it was built against.
PLUGIN_API_ATTRIBUTE = "BERGSTREAM_API"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_filters() -> list[FilterRegistration]:
    """Register proxy filter factories.

    Return a list of :class:`~bergstream.core.registrations.FilterRegistration`. Each names a
    :class:`~bergstream.core.proxy.api.FilterFactory` subclass and the pydantic model that
    validates its ``config`` block. A virtual cluster uses it as
    ``filters: [{type: <name>, config: {...}}]``. Fetch interception (KSI) and any other
    API-level behaviour are filters.

    Example::

        @hookimpl
        def register_filters():
            return [FilterRegistration(name="add-header", factory=AddHeaderFactory,
                                       config_model=AddHeaderConfig)]
    """


@hookspec
def register_file_synthesizers() -> list[FileSynthesizerRegistration]:
    """Register synthesizers of Iceberg files (data files, manifests, metadata) built on demand.

    Return a list of :class:`~bergstream.core.registrations.FileSynthesizerRegistration`; the
    factory receives the validated config and a
    :class:`~bergstream.core.backends.ServiceContext` and returns a
    :class:`~bergstream.core.backends.FileSynthesizer`.
    """


@hookspec
def register_cache_backends() -> list[CacheBackendRegistration]:
    """Register cache backends that store synthesized files by path.

    Return a list of :class:`~bergstream.core.registrations.CacheBackendRegistration`; the factory
    returns a :class:`~bergstream.core.backends.CacheBackend`.
    """


@hookspec
def register_index_backends() -> list[IndexBackendRegistration]:
    """Register index backends mapping (topic, partition, chunk) to offsets, counts and bounds.

    Return a list of :class:`~bergstream.core.registrations.IndexBackendRegistration`; the factory
    returns an :class:`~bergstream.core.backends.IndexBackend`.
    """


@hookspec
def register_value_codecs() -> list[ValueCodecRegistration]:
    """Register value codecs that turn record values into columns and back, byte for byte.

    Return a list of :class:`~bergstream.core.registrations.ValueCodecRegistration`; the factory
    returns a :class:`~bergstream.core.backends.ValueCodec`.
    """


@hookspec
def register_services() -> list[ServiceRegistration]:
    """Register long-running services that ``bergstream run`` starts from ``services:``.

    Return a list of :class:`~bergstream.core.registrations.ServiceRegistration`; the factory
    returns a :class:`~bergstream.core.service.Service` whose ``start``/``stop`` the runner awaits.
    """


@hookspec
def register_config_sections() -> list[ConfigSectionRegistration]:
    """Register the settings of a config section that core leaves to a plugin.

    Return a list of :class:`~bergstream.core.registrations.ConfigSectionRegistration`. Its
    ``name`` is the section's dotted path, ``lake.<name>`` (the lake pipeline registers
    ``lake.pipeline`` and ``lake.maintenance``; core names no section). The config
    loader validates the section against ``config_model`` (defaults when the section is absent,
    every problem with its path and line) and puts the result in
    ``BergstreamConfig.sections[name]``. A section written in a file that no installed plugin
    registers is a problem naming what to install.

    Example::

        @hookimpl
        def register_config_sections():
            return [ConfigSectionRegistration(name="lake.pipeline",
                                              config_model=MyPipelineConfig)]
    """


@hookspec
def register_log_components() -> list[LogComponent]:
    """Say which component the plugin's loggers log as.

    Return a list of :class:`~bergstream.core.registrations.LogComponent`: a logger name (a
    prefix: its child loggers are included) and the component its records carry in the log
    lines' ``component`` field (``isk``, ``ksi``, ``pipeline``...). The longest registered prefix
    wins; two plugins giving one logger different components is an error naming both. Loggers
    nobody registers log as their name's second part (``bergstream.foo.bar`` is ``foo``).

    Example::

        @hookimpl
        def register_log_components():
            return [LogComponent(logger="my_package", component="audit")]
    """


@hookspec
def register_commands(cli: click.Group) -> None:
    """Add subcommands to the ``bergstream`` command line.

    ``cli`` is the root :class:`click.Group`; add commands or groups to it, as datasette's
    ``register_commands`` does. Keeps ``bergstream.core`` free of plugin imports.

    Example::

        @hookimpl
        def register_commands(cli):
            @cli.command()
            def hello():
                click.echo("hello")
    """
