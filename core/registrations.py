"""Typed registrations that plugins return from the registration hooks.

Every registration has a ``name`` (the ``type`` a config file uses), a pydantic ``config_model``
that validates its config block and, except for a config section, a factory. Names are unique per
kind across all installed plugins; a clash is an error naming both plugins (see
:mod:`bergstream.core.plugins`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

if TYPE_CHECKING:
    from bergstream.core.backends import (
        CacheBackend,
        FileSynthesizer,
        IndexBackend,
        ServiceContext,
        ValueCodec,
    )
    from bergstream.core.proxy.api import FilterFactory, FilterFactoryContext
    from bergstream.core.service import Service


class EmptyConfig(BaseModel, extra="forbid"):
    """Config model of a plugin that takes no settings."""


@dataclass(frozen=True, kw_only=True)
class Registration:
    """Common fields of every registration."""

    name: str
    config_model: type[BaseModel]
    description: str = ""

    kind: ClassVar[str] = "registration"


@dataclass(frozen=True, kw_only=True)
class FilterRegistration(Registration):
    """A proxy filter factory, used as ``virtual_clusters[].filters[].type``: ``factory`` is a
    :class:`FilterFactory` subclass, or any callable ``(config, context)`` returning one (such as
    a function that imports the filter's modules on first use)."""

    factory: Callable[[Any, FilterFactoryContext], FilterFactory[Any]]
    kind: ClassVar[str] = "filter"


@dataclass(frozen=True, kw_only=True)
class CacheBackendRegistration(Registration):
    """A cache backend for synthesized files, chosen by a ``CacheBackendChoice`` (ISK's
    ``cache``)."""

    factory: Callable[[Any, ServiceContext], CacheBackend]
    kind: ClassVar[str] = "cache backend"


@dataclass(frozen=True, kw_only=True)
class IndexBackendRegistration(Registration):
    """An index backend (chunk -> offsets, counts, bounds), chosen by an ``IndexBackendChoice``
    (ISK's ``index``)."""

    factory: Callable[[Any, ServiceContext], IndexBackend]
    kind: ClassVar[str] = "index backend"


@dataclass(frozen=True, kw_only=True)
class ValueCodecRegistration(Registration):
    """A value codec turning Kafka record values into columns and back."""

    factory: Callable[[Any, ServiceContext], ValueCodec]
    #: False for a codec of plain values that reads no registered schema (a ``ShapeCodec``):
    #: a rule naming it needs no ``codecs.schema_registry``
    needs_registry: bool = True
    kind: ClassVar[str] = "value codec"


@dataclass(frozen=True, kw_only=True)
class FileSynthesizerRegistration(Registration):
    """A synthesizer that builds one kind of Iceberg file (data, manifest, ...) on demand."""

    factory: Callable[[Any, ServiceContext], FileSynthesizer]
    kind: ClassVar[str] = "file synthesizer"


@dataclass(frozen=True, kw_only=True)
class ServiceRegistration(Registration):
    """A long-running service that ``bergstream run`` starts, used as ``services[].type``."""

    factory: Callable[[Any, ServiceContext], Service]
    kind: ClassVar[str] = "service"


@dataclass(frozen=True, kw_only=True)
class ConfigSectionRegistration(Registration):
    """The settings of a config section that core leaves to a plugin, named by its dotted path
    (``lake.pipeline``): the config loader validates the section with ``config_model`` and keeps
    the result in ``BergstreamConfig.sections[name]``."""

    kind: ClassVar[str] = "config section"


@dataclass(frozen=True)
class LogComponent:
    """Log records of logger ``logger`` and of the loggers below it (``logger.x.y``) belong to
    ``component``: the ``component`` field of every log line (text and JSON), the longest
    registered prefix winning. Returned by ``register_log_components``."""

    logger: str
    component: str
