"""Every hook and every config key is documented under docs/."""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from bergstream.core import hookspecs
from bergstream.core.api import ApiKey
from bergstream.core.config import BergstreamConfig, ConfigError, parse_config
from bergstream.core.kafka_client import KafkaClientSettings
from bergstream.core.plugins import load_registry
from bergstream.core.sections import section_places
from tests.kits.hook_examples import context, hook_example, python_blocks, registered
from tests.unit.import_reader import PUBLIC, imports

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _model_of(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        found = _model_of(argument)
        if found is not None:
            return found
    return None


def _is_list(annotation: object) -> bool:
    """Whether a field holds a list (``list[X]`` or ``list[X] | None``)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return any(_is_list(member) for member in typing.get_args(annotation))
    return origin is list


def config_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted key paths of a config model, below list items too (the keys users write:
    aliases where a field has one). A ``kafka_client`` block is one key here: its own keys
    are documented once, in their own section (:func:`test_kafka_client_keys_are_documented`)."""
    keys = []
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        path = f"{prefix}{field.alias or name}"
        keys.append(path)
        nested = _model_of(field.annotation)
        if nested is not None and nested is not KafkaClientSettings:
            keys.extend(config_keys(nested, "" if _is_list(field.annotation) else f"{path}."))
    return keys


def config_fields(
    model: type[BaseModel], prefix: str = "", *, list_paths: bool = False
) -> dict[str, FieldInfo]:
    """Like :func:`config_keys`, with each key's field; with ``list_paths`` the keys of list
    items are ``list[].key`` instead of ``key``."""
    fields: dict[str, FieldInfo] = {}
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        path = f"{prefix}{field.alias or name}"
        fields[path] = field
        nested = _model_of(field.annotation)
        if nested is not None and nested is not KafkaClientSettings:
            if not _is_list(field.annotation):
                inner = f"{path}."
            else:
                inner = f"{path}[]." if list_paths else ""
            fields.update(config_fields(nested, inner, list_paths=list_paths))
    return fields


def table_rows(text: str) -> dict[str, list[str]]:
    """Markdown table rows by the backticked key in their first cell: the row's other cells."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 3 and re.fullmatch(r"`[^`]+`", cells[0]):
            rows.setdefault(cells[0].strip("`"), cells[1:])
    return rows


def default_problem(field: FieldInfo, stated: str) -> str | None:
    """What is wrong with the default column ``stated`` of a field, or None."""
    if field.is_required():
        return None if "required" in stated else f"says {stated!r}, not 'required'"
    default: Any = field.get_default(call_default_factory=True)
    if isinstance(default, bool):
        expected = ["true" if default else "false"]
    elif isinstance(default, int | float):
        number = int(default) if float(default).is_integer() else default
        found = re.search(rf"(?<![\d.]){re.escape(str(number))}(?:\.0)?(?![\d.])", stated)
        return None if found else f"says {stated!r}, not {number}"
    elif isinstance(default, str) and default:
        expected = [default]
    elif default in ([], {}):
        expected = [f"`{default}`"]
    else:  # None or a model: any description of what applies ("unset", a path, ...)
        return None if stated and stated != "-" else "states no default"
    if any(item in stated for item in expected):
        return None
    return f"says {stated!r}, not {expected[0]!r}"


def section_models() -> dict[str, type[BaseModel]]:
    """The model of each plugin-defined section (``lake.pipeline``, ...), by dotted path."""
    registry = load_registry()
    return {
        name: registration.config_model
        for name, registration in registry.registrations("config section").items()
    }


def file_fields() -> dict[str, FieldInfo]:
    """Every key of a config file: core's models, then each plugin-defined section's model at
    its path (the section's own key, a raw mapping in core, says "defaults below")."""
    fields = config_fields(BergstreamConfig)
    for name, model in section_models().items():
        fields.update(config_fields(model, f"{name}."))
    return fields


def test_every_plugin_defined_section_has_its_model():
    places = {".".join(map(str, loc)) for loc in section_places(BergstreamConfig)}
    assert places == {"lake"}
    assert set(section_models()) == {"lake.pipeline", "lake.maintenance"}
    assert "lake.pipeline.checkpoint_dir" in file_fields()


def test_every_config_key_states_its_default():
    rows = table_rows((DOCS / "configuration.md").read_text())
    wrong = {
        key: problem
        for key, field in file_fields().items()
        if key in rows and (problem := default_problem(field, rows[key][0]))
    }
    assert not wrong, f"defaults in docs/configuration.md: {wrong}"


def plugin_sections() -> list[Any]:
    registry = load_registry()
    params = []
    for kind in ("filter", "service"):
        for name, registration in sorted(registry.registrations(kind).items()):
            if registration.config_model is not None:
                params.append(
                    pytest.param(kind, name, registration.config_model, id=f"{kind}-{name}")
                )
    return params


@pytest.mark.parametrize(("kind", "name", "model"), plugin_sections())
def test_every_plugin_setting_is_documented_with_its_default(
    kind: str, name: str, model: type[BaseModel]
) -> None:
    text = (DOCS / "configuration.md").read_text()
    sections = re.split(r"^## ", text, flags=re.MULTILINE)
    heading = f"`{name}` {kind}"
    matching = [s for s in sections if heading in s.splitlines()[0]]
    assert matching, f"docs/configuration.md has no section '## The {heading}'"
    rows = table_rows(matching[0])
    fields = {
        f"config.{key}": field for key, field in config_fields(model, list_paths=True).items()
    }
    missing = [key for key in fields if key not in rows]
    assert not missing, f"{heading}: undocumented settings {missing}"
    wrong = {}
    for key, field in fields.items():
        parent = fields.get(key.rsplit(".", 1)[0].removesuffix("[]"))
        if field.is_required() and parent is not None and not parent.is_required():
            continue  # required inside an optional block: the block's default says what applies
        if problem := default_problem(field, rows[key][0]):
            wrong[key] = problem
    assert not wrong, f"{heading}: defaults in docs/configuration.md: {wrong}"


def test_every_config_key_is_documented():
    text = (DOCS / "configuration.md").read_text()
    keys = config_keys(BergstreamConfig)
    for name, model in section_models().items():
        keys.extend(config_keys(model, f"{name}."))
    assert "gateway.tls.cert_file" in keys and "target.bootstrap" in keys
    assert "lake.maintenance.retain_last" in keys
    missing = [key for key in keys if f"`{key}`" not in text]
    assert not missing, f"undocumented config keys in docs/configuration.md: {missing}"


def test_every_hook_is_documented_with_an_example():
    text = (DOCS / "hooks.md").read_text()
    names = [
        n
        for n, f in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(f, "bergstream_spec")
    ]
    for name in names:
        assert f"## `{name}`" in text, f"hook {name} has no section in docs/hooks.md"
        section = text.split(f"## `{name}`", 1)[1].split("\n## ", 1)[0]
        assert "@hookimpl" in section, f"hook {name} has no example in docs/hooks.md"


def test_every_hooks_example_imports_core_only_through_the_public_module() -> None:
    blocks = python_blocks((DOCS / "hooks.md").read_text())
    assert len(blocks) >= 9  # one per hook and the filter test kit's
    wrong = [
        module
        for block in blocks
        for _, module in imports(block, None)
        if module.split(".")[0] == "bergstream" and module != PUBLIC
    ]
    assert not wrong, f"docs/hooks.md imports {wrong}; examples use only {PUBLIC}"
    # The check sees a forbidden import however it is written.
    for written in ("from bergstream.core import config", "import bergstream.core.records"):
        assert [m for _, m in imports(written, None)] != [PUBLIC]


def test_the_public_module_is_documented_name_by_name() -> None:
    from bergstream.core import api

    text = (DOCS / "hooks.md").read_text()
    section = text.split("## The public module: `bergstream.core.api`", 1)[1].split("\n## ", 1)[0]
    shown = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", section))
    assert set(api.__all__) - shown == set(), "names of bergstream.core.api missing in hooks.md"
    names = {n for n in shown if not n.startswith("__") and (n[0].isupper() or "_" in n)}
    assert names - set(api.__all__) == set(), (
        "docs/hooks.md lists names bergstream.core.api does not export"
    )


async def test_testing_a_plugin_shows_a_filter_test_that_passes() -> None:
    text = (DOCS / "hooks.md").read_text()
    section = text.split("## Testing a plugin", 1)[1].split("\n## ", 1)[0]
    (block,) = python_blocks(section)
    module = types.ModuleType("hooks_md_testing")
    exec(compile(block, "docs/hooks.md (Testing a plugin)", "exec"), module.__dict__)
    tests = [f for n, f in vars(module).items() if n.startswith("test_") and callable(f)]
    assert tests, "the example defines no test"
    for test in tests:
        await test()


async def test_the_filter_example_refuses_produce_requests() -> None:
    from bergstream.core.proxy import codec
    from bergstream.core.proxy.api import ErrorResponse, FilterFactoryContext

    registration, config = registered("register_filters", "filter")
    factory = registration.factory(
        config, FilterFactoryContext("vc", BergstreamConfig(), load_registry(entry_points=False))
    )
    item = factory.create_filter()
    assert item.request_api_keys == frozenset({ApiKey.PRODUCE})
    header = codec.make_request_header(ApiKey.PRODUCE, 9, 1, "client")
    request = codec.build_request(ApiKey.PRODUCE, 9, acks=1)
    log = logging.LoggerAdapter(logging.getLogger("tests.hooks"), {})
    action = await item.on_request(header, request, types.SimpleNamespace(log=log))
    assert action == ErrorResponse(29)


async def test_the_file_synthesizer_example_builds_files_from_their_path() -> None:
    registration, config = registered("register_file_synthesizers", "file synthesizer")
    synthesizer = registration.factory(config, context())
    assert synthesizer.handles("offsets/3-6.txt") and not synthesizer.handles("data/x.parquet")
    assert await synthesizer.synthesize("offsets/3-6.txt") == b"3\n4\n5\n"


def test_the_cache_example_verifies_and_evicts() -> None:
    registration, _ = registered("register_cache_backends", "cache backend")
    cache = registration.factory(registration.config_model(max_entries=2), context())
    cache.put("a", b"1")
    cache.put("b", b"2")
    assert cache.get("a") == b"1"
    cache.put("c", b"3")  # evicts b, the least recently used
    assert (cache.get("b"), cache.get("c")) == (None, b"3")
    digest, _ = cache.entries["a"]
    cache.entries["a"] = (digest, b"corrupt")
    assert cache.get("a") is None
    cache.delete("c")
    assert cache.get("c") is None
    cache.close()


def test_the_index_example_returns_overlapping_chunks_in_order() -> None:
    from bergstream.core.backends import ChunkEntry

    registration, config = registered("register_index_backends", "index backend")
    index = registration.factory(config, context())
    chunks = [ChunkEntry("t", 0, start, start + 10, 10, 100) for start in (20, 0, 10)]
    index.put_chunks([*chunks, ChunkEntry("t", 1, 0, 5, 5, 50)])
    assert [c.start_offset for c in index.chunks("t", 0)] == [0, 10, 20]
    assert [c.start_offset for c in index.chunks("t", 0, 12, 21)] == [10, 20]
    assert index.chunks("t", 0, 30) == [] and index.chunks("u", 0) == []
    index.close()


def test_the_codec_example_decodes_keeps_odd_spellings_and_encodes_exact_bytes() -> None:
    import pyarrow as pa

    from bergstream.core.api import RegisteredSchema, SchemaNotExpressible

    registration, config = registered("register_value_codecs", "value codec")
    codec = registration.factory(config, context())
    schema = RegisteredSchema(
        1, "JSON", '{"type":"object","properties":{"id":{"type":"integer"},"c":{"type":"string"}}}'
    )
    assert [f.name for f in codec.iceberg_type(schema, None).fields] == ["id", "c"]
    payloads = [b'{"id":7,"c":"EUR"}', b'{"c": "x", "id": 1}', b"[1"]
    decoded = codec.decode(schema, pa.array(payloads, pa.large_binary()))
    assert decoded.values.to_pylist() == [{"id": 7, "c": "EUR"}, {"id": 1, "c": "x"}, None]
    assert decoded.keep_bytes.tolist() == [False, True, True]
    assert decoded.errors[0] is None and decoded.errors[2].startswith("not a JSON object")
    assert codec.encode(schema, decoded.values.slice(0, 1)).to_pylist() == [payloads[0]]
    with pytest.raises(SchemaNotExpressible):
        array_property = '{"properties":{"a":{"type":"array"}}}'
        codec.iceberg_type(RegisteredSchema(2, "JSON", array_property), None)


async def test_the_service_example_starts_and_stops() -> None:
    registration, _ = registered("register_services", "service")
    service = registration.factory(registration.config_model(interval_seconds=0.01), context())
    await service.start()
    await asyncio.sleep(0.1)
    await service.stop()
    beats = service.beats
    assert beats >= 2 and service.task is None
    await asyncio.sleep(0.05)
    assert service.beats == beats


def test_the_config_section_example_validates_its_section() -> None:
    registry = load_registry([hook_example("register_config_sections")], entry_points=False)
    text = "lake:\n  kafka_bootstrap: 127.0.0.1:9092\n  pipeline: {batch_records: 500}\n"
    config = parse_config(text, registry=registry, env={})
    assert config.sections["lake.pipeline"].batch_records == 500
    with pytest.raises(ConfigError) as error:
        parse_config(text.replace("batch_records", "batch_size"), registry=registry, env={})
    (problem,) = error.value.problems
    assert (problem.path, problem.line) == ("lake.pipeline.batch_size", 3)
    # lake.maintenance belongs to the built-in pipeline, not loaded here: the file is told so.
    with pytest.raises(ConfigError) as error:
        parse_config(text + "  maintenance: {}\n", registry=registry, env={})
    (problem,) = error.value.problems
    assert problem.path == "lake.maintenance"
    assert "no installed plugin defines a 'lake.maintenance' section" in problem.message


def test_the_command_example_adds_a_command() -> None:
    import click
    from click.testing import CliRunner

    @click.group()
    def root() -> None:
        """A root group."""

    registry = load_registry([hook_example("register_commands")], entry_points=False)
    registry.manager.hook.register_commands(cli=root)
    result = CliRunner().invoke(root, ["hello", "docs"])
    assert result.exit_code == 0 and result.output == "hello docs\n"


def test_every_hook_example_is_exercised() -> None:
    names = {
        n
        for n, f in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(f, "bergstream_spec")
    }
    tested = {
        n.removeprefix("test_the_").split("_example")[0]
        for n in globals()
        if n.startswith("test_the_") and "_example" in n
    }
    kinds = {
        "filter": "register_filters",
        "file_synthesizer": "register_file_synthesizers",
        "cache": "register_cache_backends",
        "index": "register_index_backends",
        "codec": "register_value_codecs",
        "service": "register_services",
        "config_section": "register_config_sections",
        "command": "register_commands",
        "log_components": "register_log_components",
    }
    assert {kinds[t] for t in tested} == names


def test_every_metric_is_documented_with_its_labels() -> None:
    from prometheus_client import Counter

    from bergstream.core import metrics
    from bergstream.plugins.isk_gateway import metrics as isk_metrics
    from bergstream.plugins.ksi_fetch_filter import metrics as ksi_metrics

    rows = table_rows((DOCS / "operations.md").read_text())
    modules = (metrics, isk_metrics, ksi_metrics)
    for metric in [getattr(module, name) for module in modules for name in module.__all__]:
        wire = metric._name + ("_total" if isinstance(metric, Counter) else "")
        assert wire in rows, f"{wire} is not in the metrics table of docs/operations.md"
        row = rows[wire]
        assert row[0] == ("counter" if isinstance(metric, Counter) else "gauge"), wire
        missing = [label for label in metric._labelnames if f"`{label}`" not in row[1]]
        assert not missing, f"{wire}: labels {missing} are not documented"


def test_kafka_client_keys_are_documented():
    text = (DOCS / "configuration.md").read_text()
    sections = re.split(r"^## ", text, flags=re.MULTILINE)
    (section,) = [s for s in sections if s.startswith("Kafka client settings")]
    rows = table_rows(section)
    fields = {
        field.alias or name: field for name, field in KafkaClientSettings.model_fields.items()
    }
    missing = [key for key in fields if key not in rows]
    assert not missing, f"Kafka client settings: undocumented keys {missing}"
    wrong = {
        key: problem
        for key, field in fields.items()
        if (problem := default_problem(field, rows[key][0]))
    }
    assert not wrong, f"Kafka client settings: defaults in docs/configuration.md: {wrong}"


def test_the_log_components_example_names_its_loggers_component() -> None:
    from bergstream.core.logs import component_of

    module = hook_example("register_log_components")
    load_registry([module], entry_points=False)
    assert component_of(module.log.name) == "audit"
    assert component_of("acme_audit") == "audit"
