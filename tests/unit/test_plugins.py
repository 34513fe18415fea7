"""Plugin discovery, typed registrations and conflict errors."""

from __future__ import annotations

import inspect

import pytest
from pydantic import BaseModel

from bergstream.core import hookspecs
from bergstream.core.hookspecs import hookimpl
from bergstream.core.plugins import REGISTRATION_HOOKS, PluginError, load_registry
from bergstream.core.registrations import (
    CacheBackendRegistration,
    ConfigSectionRegistration,
    FilterRegistration,
)


class Cfg(BaseModel):
    pass


def _filter_plugin(name: str):
    class Plugin:
        @hookimpl
        def register_filters(self):
            return [FilterRegistration(name=name, factory=object, config_model=Cfg)]

    return Plugin()


def test_registrations_are_indexed_by_kind_and_name():
    registry = load_registry([_filter_plugin("a"), _filter_plugin("b")], entry_points=False)
    assert sorted(registry.registrations("filter")) == ["a", "b"]
    assert registry.get("filter", "a").name == "a"
    assert registry.registrations("cache backend") == {}


def test_conflicting_names_name_both_plugins():
    with pytest.raises(PluginError) as info:
        load_registry([_filter_plugin("same"), _filter_plugin("same")], entry_points=False)
    message = str(info.value)
    assert "filter 'same' is registered by both plugin" in message
    assert "uninstall one of them or rename" in message


def test_wrong_registration_type_is_an_error():
    class Plugin:
        @hookimpl
        def register_filters(self):
            return [CacheBackendRegistration(name="x", factory=object, config_model=Cfg)]

    with pytest.raises(PluginError, match="must return FilterRegistration objects"):
        load_registry([Plugin()], entry_points=False)


def test_two_plugins_cannot_define_the_same_config_section():
    class Plugin:
        @hookimpl
        def register_config_sections(self):
            return [ConfigSectionRegistration(name="lake.pipeline", config_model=Cfg)]

    registry = load_registry([Plugin()], entry_points=False)
    assert registry.get("config section", "lake.pipeline").config_model is Cfg
    with pytest.raises(PluginError, match=r"config section 'lake\.pipeline' is registered by both"):
        load_registry([Plugin(), Plugin()], entry_points=False)


def test_missing_plugin_lists_installed():
    registry = load_registry([_filter_plugin("a")], entry_points=False)
    with pytest.raises(PluginError, match="no filter plugin named 'zz' is installed; installed: a"):
        registry.get("filter", "zz")


def test_plugin_infos_list_hooks_and_registrations():
    registry = load_registry([_filter_plugin("a")], entry_points=False)
    [info] = registry.plugin_infos()
    assert info.hooks == ("register_filters",)
    assert info.registrations == (("filter", "a"),)


def _hookspec_functions():
    return [
        (name, fn)
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(fn, "bergstream_spec")
    ]


def test_every_hook_is_documented():
    specs = _hookspec_functions()
    assert len(specs) >= 7
    for name, fn in specs:
        doc = inspect.getdoc(fn) or ""
        assert len(doc.split()) >= 12, f"hook {name} needs a docstring saying what it registers"


def test_every_registration_hook_is_a_hookspec():
    names = {name for name, _ in _hookspec_functions()}
    for hook_name, _ in REGISTRATION_HOOKS.values():
        assert hook_name in names


def test_a_misspelled_hook_is_an_error_naming_plugin_hook_and_nearest_one():
    class Misspelled:
        @hookimpl
        def register_filtres(self):
            return []

    with pytest.raises(PluginError) as caught:
        load_registry([Misspelled()], entry_points=False)
    message = str(caught.value)
    assert "'register_filtres', which is no bergstream hook" in message
    assert "did you mean 'register_filters'?" in message


def test_an_optional_hook_without_spec_is_allowed():
    class Optional:
        @hookimpl(optionalhook=True)
        def register_things_of_tomorrow(self):
            return []

    load_registry([Optional()], entry_points=False)


@pytest.mark.parametrize("declared", [None, hookspecs.API_VERSION, "1.0"])
def test_plugins_built_for_this_api_load(declared):
    plugin = _filter_plugin("a")
    if declared is not None:
        plugin.BERGSTREAM_API = declared
    assert list(load_registry([plugin], entry_points=False).registrations("filter")) == ["a"]


@pytest.mark.parametrize(
    ("declared", "says"),
    [
        ("2.0", "was built for bergstream API 2.0"),
        ("0.9", "was built for bergstream API 0.9"),
        ("1.99", "was built for bergstream API 1.99"),
        ("one", "must be a 'MAJOR.MINOR' string"),
    ],
)
def test_plugins_built_for_another_api_are_refused_by_name(declared, says):
    plugin = _filter_plugin("a")
    plugin.BERGSTREAM_API = declared
    with pytest.raises(PluginError, match=says):
        load_registry([plugin], entry_points=False)


def test_the_api_version_is_major_dot_minor():
    from bergstream.core.api import API_VERSION

    major, minor = API_VERSION.split(".")
    assert major.isdigit() and minor.isdigit()


def test_two_plugins_giving_one_logger_two_components_are_named():
    from bergstream.core.registrations import LogComponent

    def plugin(component: str):
        class Plugin:
            @hookimpl
            def register_log_components(self):
                return [LogComponent(logger="acme", component=component)]

        return Plugin()

    with pytest.raises(PluginError, match="logger 'acme' logs as component"):
        load_registry([plugin("a"), plugin("b")], entry_points=False)
    load_registry([plugin("a"), plugin("a")], entry_points=False)  # the same answer twice is fine
