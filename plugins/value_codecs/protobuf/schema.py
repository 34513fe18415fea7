"""Protobuf schemas from a registry turned into descriptors, in a private pool per schema.

A registry returns a ``PROTOBUF`` schema in one of two forms, under the same schema type:
``.proto`` text (what Java or Go producers and people register) or base64 of a serialized
``FileDescriptorProto`` (what confluent-kafka's Python serializer registers). Both are accepted,
for the schema and each of its references (fetched with ``resolve``, keyed by the reference's
name, which is what importers ``import``).

Text is compiled with the ``protoc`` bundled in grpcio-tools (no system protoc), against the
base64 files through ``--descriptor_set_in``. Imports of ``google/protobuf/*.proto`` (the
well-known types) are served by the protobuf runtime's own copies, never by the registry's: a
reference under that prefix is not fetched.

Extensions declared in the schema are left out of the pool, so extension data in a payload is
read as unknown fields (which the codec cannot give back: such rows keep their bytes).

The result, :class:`ProtoSchema`, is a serialized ``FileDescriptorSet`` (picklable; no registry
needed to rebuild the pool from it). The root file is renamed :data:`ROOT_FILE`, as no other
file imports it.
"""

from __future__ import annotations

import base64
import binascii
import os
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from google.protobuf import (
    any_pb2,
    api_pb2,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    source_context_pb2,
    struct_pb2,
    timestamp_pb2,
    type_pb2,
    wrappers_pb2,
)
from google.protobuf.descriptor import Descriptor, FileDescriptor
from google.protobuf.message import DecodeError

from bergstream.core.api import RegisteredSchema, SchemaNotExpressible, SchemaReference

__all__ = [
    "ROOT_FILE",
    "WELL_KNOWN_PREFIX",
    "ProtoSchema",
    "build_pool",
    "load_proto_schema",
    "message_at",
    "root_file",
]

Resolve = Callable[[SchemaReference], RegisteredSchema]

#: The name the root file gets in its pool.
ROOT_FILE = "bergstream_root.proto"
#: Imports under this prefix come from the protobuf runtime.
WELL_KNOWN_PREFIX = "google/protobuf/"

_WELL_KNOWN_MODULES = (
    descriptor_pb2,
    any_pb2,
    source_context_pb2,
    type_pb2,
    api_pb2,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
)
# The runtime's well-known files, in dependency order.
_WELL_KNOWN: tuple[descriptor_pb2.FileDescriptorProto, ...] = tuple(
    descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
    for module in _WELL_KNOWN_MODULES
)
_WELL_KNOWN_NAMES = frozenset(f.name for f in _WELL_KNOWN)

# protoc keeps process-wide state; one compilation at a time.
_PROTOC_LOCK = threading.Lock()


@dataclass(frozen=True)
class ProtoSchema:
    """A schema with its references: a serialized ``FileDescriptorSet`` of every file that is
    not a runtime well-known file, in dependency order, the root named :data:`ROOT_FILE`."""

    files: bytes


def load_proto_schema(schema: RegisteredSchema, resolve: Resolve | None) -> ProtoSchema:
    """The files of ``schema`` and of its references (fetched with ``resolve``). Raises
    :class:`SchemaNotExpressible` when a file does not compile, a reference cannot be
    resolved, or the result does not load into a descriptor pool."""
    sources: dict[str, descriptor_pb2.FileDescriptorProto | str] = {}
    _collect(schema.references, resolve, sources, ())
    sources[ROOT_FILE] = _parse_form(schema.schema, ROOT_FILE)
    texts = {name: s for name, s in sources.items() if isinstance(s, str)}
    compiled = _compile(texts, [s for s in sources.values() if not isinstance(s, str)])
    files: list[descriptor_pb2.FileDescriptorProto] = []
    for name, source in sources.items():
        fdp = compiled[name] if isinstance(source, str) else source
        _strip_extensions(fdp)
        files.append(fdp)
    proto = ProtoSchema(descriptor_pb2.FileDescriptorSet(file=files).SerializeToString())
    build_pool(proto)  # fail here, not on first decode
    return proto


def build_pool(proto: ProtoSchema) -> descriptor_pool.DescriptorPool:
    """A new pool holding the runtime's well-known files and the files of ``proto``. Raises
    :class:`SchemaNotExpressible` if they do not load (a missing import, a name defined twice)."""
    pool = descriptor_pool.DescriptorPool()
    files = descriptor_pb2.FileDescriptorSet.FromString(proto.files).file
    try:
        for fdp in _dependency_order([*_WELL_KNOWN, *files]):
            pool.Add(fdp)
    except (TypeError, ValueError, KeyError) as exc:
        raise SchemaNotExpressible(f"the Protobuf schema does not load: {exc}") from None
    return pool


def root_file(pool: descriptor_pool.DescriptorPool) -> FileDescriptor:
    """The root file of a pool made by :func:`build_pool`."""
    return pool.FindFileByName(ROOT_FILE)


def message_at(file: FileDescriptor, indexes: Iterable[int]) -> Descriptor | None:
    """The message a Confluent message-index list names in ``file`` (first index among the
    file's top-level messages, the next ones among nested messages), or None."""
    options = list(file.message_types_by_name.values())
    found: Descriptor | None = None
    for index in indexes:
        if not 0 <= index < len(options):
            return None
        found = options[index]
        options = list(found.nested_types)
    return found


def _collect(
    references: Iterable[SchemaReference],
    resolve: Resolve | None,
    sources: dict[str, descriptor_pb2.FileDescriptorProto | str],
    chain: tuple[str, ...],
) -> None:
    """Fetch references depth first into ``sources`` (dependencies before dependents)."""
    for ref in references:
        if ref.name.startswith(WELL_KNOWN_PREFIX) or ref.name in sources:
            continue
        if ref.name in chain:
            raise SchemaNotExpressible(f"circular schema references through {ref.name}")
        if resolve is None:
            raise SchemaNotExpressible(
                f"schema references {ref.name} ({ref.subject} v{ref.version}) and no resolver "
                "was given"
            )
        target = resolve(ref)
        if target.schema_type.upper() != "PROTOBUF":
            raise SchemaNotExpressible(
                f"reference {ref.name} is {target.schema_type}, not Protobuf"
            )
        _collect(target.references, resolve, sources, (*chain, ref.name))
        sources[ref.name] = _parse_form(target.schema, ref.name)


def _parse_form(text: str, name: str) -> descriptor_pb2.FileDescriptorProto | str:
    """A base64 ``FileDescriptorProto`` (renamed ``name``), or the text itself if it is not
    one (.proto text always has characters base64 lacks: spaces, ``;``, braces)."""
    stripped = text.strip()
    if not stripped:
        return text
    try:
        fdp = descriptor_pb2.FileDescriptorProto.FromString(
            base64.b64decode(stripped, validate=True)
        )
    except (binascii.Error, ValueError, DecodeError):
        return text
    fdp.name = name
    return fdp


def _compile(
    texts: dict[str, str], binary: list[descriptor_pb2.FileDescriptorProto]
) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """``texts`` (import path -> .proto text) compiled by the bundled protoc, importing the
    ``binary`` files and the well-known ones."""
    if not texts:
        return {}
    from grpc_tools import _protoc_compiler

    with tempfile.TemporaryDirectory(prefix="bergstream-proto-") as work:
        source_dir = os.path.join(work, "src")
        for name, text in texts.items():
            path = os.path.join(source_dir, name)
            if not os.path.realpath(path).startswith(os.path.realpath(source_dir) + os.sep):
                raise SchemaNotExpressible(f"reference name {name!r} is not a relative path")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as out:
                out.write(text)
        deps_path = os.path.join(work, "deps.desc")
        with open(deps_path, "wb") as out:
            deps = descriptor_pb2.FileDescriptorSet(file=[*_WELL_KNOWN, *binary])
            out.write(deps.SerializeToString())
        out_path = os.path.join(work, "out.desc")
        args = [
            b"protoc",
            f"-I{source_dir}".encode(),
            f"-I{_well_known_dir()}".encode(),
            f"--descriptor_set_in={deps_path}".encode(),
            f"--descriptor_set_out={out_path}".encode(),
            *(name.encode() for name in texts),
        ]
        with _PROTOC_LOCK:
            status = _protoc_compiler.run_main(args)
        if status != 0:
            raise SchemaNotExpressible(
                "the .proto text does not compile: " + _protoc_errors(source_dir, texts)
            )
        with open(out_path, "rb") as produced:
            result = descriptor_pb2.FileDescriptorSet.FromString(produced.read())
    return {fdp.name: fdp for fdp in result.file}


def _protoc_errors(source_dir: str, texts: dict[str, str]) -> str:
    """protoc's messages for the failing text (``run_main`` only prints them to fd 2)."""
    from grpc_tools import _protoc_compiler

    for name in reversed(list(texts)):  # the root last in ``texts``: it sees every error
        try:
            with _PROTOC_LOCK:
                include = [source_dir.encode(), _well_known_dir().encode()]
                _protoc_compiler.get_protos(name.encode(), include)
        except _protoc_compiler.ProtocErrors as exc:
            return "; ".join(
                f"{e.filename.decode(errors='replace')}:{e.line}:{e.column}: "
                f"{e.message.decode(errors='replace')}"
                for e in exc.errors()
            )[:500]
        except Exception:  # only a better message was sought
            break
    return "protoc rejected it"


def _well_known_dir() -> str:
    import grpc_tools

    return os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")


def _strip_extensions(fdp: descriptor_pb2.FileDescriptorProto) -> None:
    fdp.ClearField("extension")
    stack = list(fdp.message_type)
    while stack:
        message = stack.pop()
        message.ClearField("extension")
        stack.extend(message.nested_type)


def _dependency_order(
    files: list[descriptor_pb2.FileDescriptorProto],
) -> list[descriptor_pb2.FileDescriptorProto]:
    """``files`` with every file after its dependencies; a well-known file given twice (the
    runtime's and protoc's copy) only once, the first; another duplicate is an error."""
    by_name: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    for fdp in files:
        if fdp.name in by_name:
            if fdp.name in _WELL_KNOWN_NAMES:
                continue
            raise SchemaNotExpressible(f"file {fdp.name} is defined twice")
        by_name[fdp.name] = fdp
    ordered: list[descriptor_pb2.FileDescriptorProto] = []
    done: set[str] = set()

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if name in done:
            return
        if name in chain:
            raise SchemaNotExpressible(f"circular imports through {name}")
        fdp = by_name.get(name)
        if fdp is None:
            raise SchemaNotExpressible(f"import {name} is missing (no reference gives it)")
        for dep in fdp.dependency:
            visit(dep, (*chain, name))
        done.add(name)
        ordered.append(fdp)

    for name in by_name:
        visit(name, ())
    return ordered
