"""Plugin discovery and the registry of everything plugins registered.

Plugins come from the ``bergstream`` entry-point group (built-in and third-party alike) or are
passed in directly (tests). Registrations are collected once; two plugins registering the same
name for the same kind is an error that names both.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pluggy

from bergstream.core import hookspecs
from bergstream.core.logs import add_components
from bergstream.core.registrations import (
    CacheBackendRegistration,
    ConfigSectionRegistration,
    FileSynthesizerRegistration,
    FilterRegistration,
    IndexBackendRegistration,
    LogComponent,
    Registration,
    ServiceRegistration,
    ValueCodecRegistration,
)

ENTRY_POINT_GROUP = "bergstream"

#: kind (as used in config errors) -> (hook name, registration class)
REGISTRATION_HOOKS: dict[str, tuple[str, type[Registration]]] = {
    "filter": ("register_filters", FilterRegistration),
    "file synthesizer": ("register_file_synthesizers", FileSynthesizerRegistration),
    "cache backend": ("register_cache_backends", CacheBackendRegistration),
    "index backend": ("register_index_backends", IndexBackendRegistration),
    "value codec": ("register_value_codecs", ValueCodecRegistration),
    "service": ("register_services", ServiceRegistration),
    "config section": ("register_config_sections", ConfigSectionRegistration),
}


class PluginError(Exception):
    """A plugin failed to load or registered something invalid or conflicting."""


@dataclass(frozen=True)
class PluginInfo:
    """What ``bergstream plugins`` shows for one plugin."""

    name: str
    distribution: str | None
    version: str | None
    hooks: tuple[str, ...]
    registrations: tuple[tuple[str, str], ...]  # (kind, name)


@dataclass
class PluginRegistry:
    """All loaded plugins and their registrations, by kind and name."""

    manager: pluggy.PluginManager
    _by_kind: dict[str, dict[str, Registration]] = field(default_factory=dict)
    _owner: dict[tuple[str, str], str] = field(default_factory=dict)
    _dists: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)

    def registrations(self, kind: str) -> dict[str, Any]:
        """Registrations of one kind (``filter``, ``cache backend``, ...), by name."""
        if kind not in REGISTRATION_HOOKS:
            raise KeyError(f"unknown registration kind '{kind}'")
        return dict(self._by_kind.get(kind, {}))

    def get(self, kind: str, name: str) -> Any:
        """One registration; :class:`PluginError` naming the installed ones if it is missing."""
        found = self._by_kind.get(kind, {}).get(name)
        if found is None:
            names = ", ".join(sorted(self._by_kind.get(kind, {}))) or "none"
            raise PluginError(f"no {kind} plugin named '{name}' is installed; installed: {names}")
        return found

    def plugin_infos(self) -> list[PluginInfo]:
        """Describe every loaded plugin: distribution, version, hooks and registrations."""
        infos = []
        for name, plugin in sorted(self.manager.list_name_plugin(), key=lambda item: item[0]):
            if plugin is None:
                continue
            hooks = tuple(
                sorted(caller.name for caller in self.manager.get_hookcallers(plugin) or [])
            )
            regs = tuple(
                sorted(
                    [(kind, reg) for (kind, reg), owner in self._owner.items() if owner == name]
                    + self._commands_and_components(plugin)
                )
            )
            dist, ver = self._dists.get(name, (None, None))
            infos.append(PluginInfo(name, dist, ver, hooks, regs))
        return infos

    def _commands_and_components(self, plugin: object) -> list[tuple[str, str]]:
        """The commands a plugin adds (``register_commands``, called on a scratch group) and
        the log components it names (``register_log_components``)."""
        import click

        found: list[tuple[str, str]] = []
        for caller in self.manager.get_hookcallers(plugin) or []:
            for impl in caller.get_hookimpls():
                if impl.plugin is not plugin:
                    continue
                if caller.name == "register_commands":
                    scratch = click.Group("scratch")
                    impl.function(cli=scratch)
                    found += [("command", command) for command in scratch.commands]
                elif caller.name == "register_log_components":
                    found += [("log component", c.component) for c in impl.function() or ()]
        return sorted(set(found))

    def collect(self) -> None:
        """Call every registration hook once and index the results, checking for conflicts."""
        self._by_kind.clear()
        self._owner.clear()
        for kind, (hook_name, reg_class) in REGISTRATION_HOOKS.items():
            hook = getattr(self.manager.hook, hook_name)
            table: dict[str, Registration] = {}
            for impl in hook.get_hookimpls():
                owner = impl.plugin_name
                result = impl.function()
                for reg in result or []:
                    if not isinstance(reg, reg_class):
                        raise PluginError(
                            f"plugin '{owner}' returned {type(reg).__name__} from {hook_name}; "
                            f"it must return {reg_class.__name__} objects"
                        )
                    if reg.name in table:
                        raise PluginError(
                            f"{kind} '{reg.name}' is registered by both plugin "
                            f"'{self._owner[(kind, reg.name)]}' and plugin '{owner}': uninstall "
                            f"one of them or rename the {kind}"
                        )
                    table[reg.name] = reg
                    self._owner[(kind, reg.name)] = owner
            self._by_kind[kind] = table
        self._collect_log_components()

    def _collect_log_components(self) -> None:
        """Add every plugin's ``register_log_components`` to the log lines' component table."""
        found: dict[str, tuple[str, str]] = {}  # logger -> (component, plugin)
        for impl in self.manager.hook.register_log_components.get_hookimpls():
            for entry in impl.function() or []:
                if not isinstance(entry, LogComponent):
                    raise PluginError(
                        f"plugin '{impl.plugin_name}' returned {type(entry).__name__} from "
                        "register_log_components; it must return LogComponent objects"
                    )
                known = found.get(entry.logger)
                if known is not None and known[0] != entry.component:
                    raise PluginError(
                        f"logger '{entry.logger}' logs as component '{known[0]}' for plugin "
                        f"'{known[1]}' and as '{entry.component}' for plugin "
                        f"'{impl.plugin_name}': one of them must use another logger name"
                    )
                found[entry.logger] = (entry.component, impl.plugin_name)
        add_components({logger: component for logger, (component, _) in found.items()})


def _new_manager() -> pluggy.PluginManager:
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    return manager


def load_registry(
    extra_plugins: Iterable[ModuleType | object] = (), *, entry_points: bool = True
) -> PluginRegistry:
    """Discover plugins (entry points, then ``extra_plugins``) and collect their registrations."""
    manager = _new_manager()
    registry = PluginRegistry(manager)
    if entry_points:
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if manager.has_plugin(ep.name):
                continue
            try:
                plugin = ep.load()
            except Exception as error:  # a broken third-party plugin must say which one it is
                raise PluginError(
                    f"plugin '{ep.name}' ({ep.value}) failed to import: {error!r}"
                ) from error
            manager.register(plugin, name=ep.name)
            dist = ep.dist
            registry._dists[ep.name] = (
                dist.metadata["Name"] if dist else None,
                dist.version if dist else None,
            )
    for plugin in extra_plugins:
        manager.register(plugin)
    for name, plugin in manager.list_name_plugin():
        if plugin is not None:
            check_api_version(name, plugin)
    check_unknown_hooks(manager)
    registry.collect()
    return registry


#: The registry the ``bergstream`` command loaded to find the command it runs (set by the CLI).
_command_registry: PluginRegistry | None = None


def remember_command_registry(registry: PluginRegistry) -> None:
    """Keep ``registry`` as the one :func:`command_registry` returns (the CLI calls this after
    loading the plugins to find a plugin's command)."""
    global _command_registry
    _command_registry = registry


def command_registry() -> PluginRegistry:
    """The registry for a plugin's command: the one ``bergstream`` loaded to find that command,
    so the plugins are not discovered twice; else (a command called outside the CLI, a test)
    a new :func:`load_registry`."""
    return _command_registry if _command_registry is not None else load_registry()


def check_api_version(name: str, plugin: object) -> None:
    """Refuse a plugin that declares (``BERGSTREAM_API``) an API version this core cannot serve:
    another major version, or a newer minor one."""
    wanted = getattr(plugin, hookspecs.PLUGIN_API_ATTRIBUTE, None)
    if wanted is None:
        return
    have_major, have_minor = _api_version(hookspecs.API_VERSION)
    match = re.fullmatch(r"(\d+)\.(\d+)", str(wanted))
    if match is None:
        raise PluginError(
            f"plugin '{name}' sets {hookspecs.PLUGIN_API_ATTRIBUTE} = {wanted!r}: it must be a "
            f"'MAJOR.MINOR' string such as {hookspecs.API_VERSION!r}"
        )
    major, minor = int(match[1]), int(match[2])
    if major != have_major or minor > have_minor:
        raise PluginError(
            f"plugin '{name}' was built for bergstream API {wanted}; this bergstream has API "
            f"{hookspecs.API_VERSION}: install a release of the plugin built for API "
            f"{have_major}.x (x <= {have_minor}), or a bergstream whose API is {major}.{minor} "
            "or a later minor"
        )


def _api_version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def check_unknown_hooks(manager: pluggy.PluginManager) -> None:
    """Refuse a ``hookimpl`` whose name is no hookspec (a misspelled hook would otherwise never
    be called), naming the plugin, the function and the nearest hook; then pluggy's own
    ``check_pending``."""
    specs = sorted(
        name
        for name in vars(hookspecs)
        if getattr(getattr(hookspecs, name), "bergstream_spec", None) is not None
    )
    for hook_name, caller in sorted(vars(manager.hook).items()):
        if hook_name.startswith("_") or caller.has_spec():
            continue
        for impl in caller.get_hookimpls():
            if impl.opts.get("optionalhook"):
                continue
            nearest = difflib.get_close_matches(hook_name, specs, n=1)
            hint = f"did you mean '{nearest[0]}'? " if nearest else ""
            raise PluginError(
                f"plugin '{impl.plugin_name}' implements '{hook_name}', which is no bergstream "
                f"hook: {hint}the hooks are {', '.join(specs)}"
            )
    try:
        manager.check_pending()
    except pluggy.PluginValidationError as error:
        raise PluginError(str(error)) from None
