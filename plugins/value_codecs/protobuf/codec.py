"""The ``protobuf`` value codec (:class:`~bergstream.core.api.ValueCodec`, registry type
``PROTOBUF``).

A payload (Confluent magic byte and schema id stripped) is a message-index list followed by a
serialized message. The list is zigzag varints: the single byte ``00`` for the file's first
message, otherwise a count then the indexes (``02 00`` also names the first message,
``04 02 00`` the first nested message of the second one). Only the schema's **first message**
(index ``[0]``, Confluent's default) is decoded: :meth:`ProtobufCodec.iceberg_type` is its type,
and a record whose list names another message fails (null row, bytes kept) with a cause giving
the indexes as they were read and the message they name.

Decoding first runs a compiled kernel over the wire format (:mod:`.decode_kernel`, a program
per message from :mod:`.program`): it decodes the rows it can prove are exactly upb's
deterministic serialization of their value (index list ``00``), straight into Arrow columns.
The other rows (and every row of a schema the kernel does not handle: one with a group) take
the upb path described next, and are merged back in their places; both paths give the same
values, ``keep_bytes`` and errors.

The upb path parses each payload with the upb runtime into a message class of a private
descriptor pool (built once per schema), then reads the messages column by column with direct
attribute access and builds the Arrow arrays of the whole batch at once. A row keeps its bytes
unless re-encoding it gives them back exactly, which is checked per row: the index list must be
the short form ``00`` and the message must equal its own deterministic re-serialization after
unknown fields are discarded. That rules out fields out of number order, unpacked
(or split) packed fields, explicit proto3 defaults, duplicate fields, unknown fields (and
extensions, which the pool leaves out), non-minimal varints, maps out of key order, and closed
enum values the enum lacks. Values Arrow cannot hold exactly also keep the bytes: timestamps or
durations with nanoseconds below a microsecond or not normalized, and NaN floats (their payload
bits may change through a 64-bit float).

Rows fail (null, bytes kept, a cause) when the index list is truncated or corrupt, names another
message, the message does not parse (truncated, bad UTF-8 in a proto3 string, trailing garbage
that is not a valid field), a proto2 string or map key is not UTF-8 (upb does not check them),
or a timestamp or duration is beyond the range of 64-bit microseconds.

:meth:`ProtobufCodec.encode` writes, after the index list ``00``, upb's deterministic
serialization of each value: a compiled writer (:mod:`.encoder`) for the rows it
handles, and for the others (maps of two or more entries, whose order upb decides, NaN, values
out of their field's range) messages built from the Arrow values and serialized by upb.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass
from pyiceberg.types import IcebergType, StructType

from bergstream.core.api import (
    DecodedValues,
    RegisteredSchema,
    SchemaNotExpressible,
    arrow_type,
)
from bergstream.plugins.value_codecs.protobuf.decode_kernel import ProtoFastDecoder
from bergstream.plugins.value_codecs.protobuf.encoder import encode_upb, encoder_for
from bergstream.plugins.value_codecs.protobuf.program import compile_program
from bergstream.plugins.value_codecs.protobuf.schema import (
    ProtoSchema,
    build_pool,
    load_proto_schema,
    message_at,
    root_file,
)
from bergstream.plugins.value_codecs.protobuf.types import (
    WRAPPERS,
    iceberg_type,
    is_map,
    is_optional,
    message_kind,
)
from bergstream.plugins.value_codecs.shared.arena_columns import payload_buffers
from bergstream.plugins.value_codecs.shared.schema_cache import Resolve, SchemaCache

__all__ = ["ProtobufCodec", "read_indexes"]


F = FieldDescriptor
_MICROS = 1_000_000
_NANOS = 1_000_000_000
# Seconds whose microseconds still fit in an int64.
_MAX_SECONDS = (2**63 - 1) // _MICROS - 1
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def read_indexes(data: bytes, pos: int, end: int) -> tuple[list[int], int]:
    """The message-index list at ``data[pos:end]`` (zigzag varints: a count, then the
    indexes; a count of 0 means ``[0]``) and the position after it. Raises ``ValueError``."""
    values: list[int] = []
    count = -1
    while count < 0 or len(values) < count:
        shift = result = 0
        while True:
            if pos >= end:
                raise ValueError("truncated message-index list")
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift > 63:
                raise ValueError("corrupt message-index list: varint too long")
        number = (result >> 1) ^ -(result & 1)
        if count < 0:
            if number < 0 or number > end - pos:
                raise ValueError(f"corrupt message-index list: count {number}")
            count = number
            if count == 0:
                return [0], pos
        else:
            values.append(number)
    return values, pos


class _Flags:
    """Per-row outcome of a batch: bytes kept, causes, failed rows."""

    def __init__(self, rows: int) -> None:
        self.keep = np.zeros(rows, dtype=bool)
        self.failed = np.zeros(rows, dtype=bool)
        self.errors: list[str | None] = [None] * rows

    def fail(self, row: int, cause: str) -> None:
        self.keep[row] = True
        self.failed[row] = True
        if self.errors[row] is None:
            self.errors[row] = cause


# ---------------------------------------------------------------- readers (message -> Arrow)


class _ValueReader:
    """Turns a list of values of one kind (Python scalars or messages) into an Arrow array."""

    def read(
        self, values: list[Any], rows: np.ndarray, mask: np.ndarray | None, flags: _Flags
    ) -> pa.Array:
        """The array of ``values`` (``rows[i]`` is the batch row of ``values[i]``; ``mask``
        true where the value is absent)."""
        raise NotImplementedError


class _ScalarReader(_ValueReader):
    def __init__(self, type_: pa.DataType, field_type: int, path: str) -> None:
        self.type = type_
        self.field_type = field_type
        self.path = path

    def read(
        self, values: list[Any], rows: np.ndarray, mask: np.ndarray | None, flags: _Flags
    ) -> pa.Array:
        try:
            array = pa.array(values, self.type, mask=mask)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
            if self.field_type != F.TYPE_STRING:
                raise
            # upb does not check UTF-8 in proto2 strings and hands back bytes.
            values = list(values)
            for i, value in enumerate(values):
                if not isinstance(value, str):
                    flags.fail(int(rows[i]), f"string field {self.path} is not UTF-8")
                    values[i] = ""
            array = pa.array(values, self.type, mask=mask)
        if self.field_type == F.TYPE_FLOAT and len(array):
            nan = pc.is_nan(array).fill_null(False).to_numpy(zero_copy_only=False)
            if nan.any():
                flags.keep[rows[nan]] = True
        return array


class _EnumReader(_ValueReader):
    def __init__(self, names: dict[int, str]) -> None:
        self.names = _Names(names)

    def read(
        self, values: list[Any], rows: np.ndarray, mask: np.ndarray | None, flags: _Flags
    ) -> pa.Array:
        return pa.array(list(map(self.names.__getitem__, values)), pa.large_string(), mask=mask)


class _Names(dict[int, str]):
    """Enum names by number; a number without a name reads as its decimal digits."""

    def __missing__(self, number: int) -> str:
        return str(number)


class _TimeReader(_ValueReader):
    """Timestamp (since the epoch) or Duration messages as int64 microseconds."""

    def __init__(self, type_: pa.DataType, duration: bool, path: str) -> None:
        self.type = type_
        self.duration = duration
        self.path = path

    def read(
        self, values: list[Any], rows: np.ndarray, mask: np.ndarray | None, flags: _Flags
    ) -> pa.Array:
        count = len(values)
        seconds = np.fromiter(map(_SECONDS, values), np.int64, count)
        nanos = np.fromiter(map(_NANOS_OF, values), np.int64, count)
        if self.duration:
            exact = (
                (np.abs(nanos) < _NANOS)
                & (nanos % 1000 == 0)
                & ~((seconds > 0) & (nanos < 0))
                & ~((seconds < 0) & (nanos > 0))
            )
        else:
            exact = (nanos >= 0) & (nanos < _NANOS) & (nanos % 1000 == 0)
        inexact = ~exact
        if inexact.any():
            flags.keep[rows[inexact]] = True
        huge = np.abs(seconds) > _MAX_SECONDS
        if huge.any():
            what = "duration" if self.duration else "timestamp"
            for i in np.flatnonzero(huge):
                flags.fail(int(rows[i]), f"{what} {self.path} is out of the microsecond range")
            seconds = np.where(huge, 0, seconds)
        micros = seconds * _MICROS + nanos // 1000
        return pa.array(micros, self.type, mask=mask)


_SECONDS = operator.attrgetter("seconds")
_NANOS_OF = operator.attrgetter("nanos")
_VALUE = operator.attrgetter("value")


class _WrapperReader(_ValueReader):
    def __init__(self, inner: _ValueReader) -> None:
        self.inner = inner

    def read(
        self, values: list[Any], rows: np.ndarray, mask: np.ndarray | None, flags: _Flags
    ) -> pa.Array:
        return self.inner.read(list(map(_VALUE, values)), rows, mask, flags)


class _EmptyReader(_ValueReader):
    def read(
        self, values: list[Any], rows: np.ndarray, mask: np.ndarray | None, flags: _Flags
    ) -> pa.Array:
        return pa.array(np.ones(len(values), dtype=bool), pa.bool_(), mask=mask)


class _FieldReader:
    """One field of a message: its values over a list of parent messages."""

    def __init__(
        self,
        name: str,
        mode: str,
        type_: pa.DataType,
        value: _ValueReader,
        key: _ValueReader | None = None,
        presence: bool = False,
        path: str = "",
    ) -> None:
        self.get = operator.attrgetter(name)
        self.has = operator.methodcaller("HasField", name)
        self.mode = mode  # "single", "list" or "map"
        self.type = type_
        self.value = value
        self.key = key
        self.presence = presence
        self.path = path

    def read(self, parents: list[Message], rows: np.ndarray, flags: _Flags) -> pa.Array:
        """The field's column over ``parents``."""
        values = list(map(self.get, parents))
        if self.mode == "single":
            mask = None
            if self.presence:
                present = np.fromiter(map(self.has, parents), bool, len(parents))
                mask = None if present.all() else ~present
            return self.value.read(values, rows, mask, flags)
        if self.mode == "map":
            # Sorted like deterministic serialization (UTF-8 order is code point order).
            try:
                values = [sorted(m.items()) for m in values]
            except UnicodeDecodeError:
                pairs = zip(values, rows.tolist(), strict=True)
                values = [self._sorted_items(m, row, flags) for m, row in pairs]
        lengths = np.fromiter(map(len, values), np.int64, len(values))
        child_rows = np.repeat(rows, lengths)
        offsets = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if self.mode == "list":
            flat = list(itertools.chain.from_iterable(values))
            elements = self.value.read(flat, child_rows, None, flags)
            return pa.LargeListArray.from_arrays(pa.array(offsets), elements, type=self.type)
        assert self.key is not None
        entries = list(itertools.chain.from_iterable(values))
        keys = self.key.read([k for k, _ in entries], child_rows, None, flags)
        items = self.value.read([v for _, v in entries], child_rows, None, flags)
        return pa.MapArray.from_arrays(
            pa.array(offsets.astype(np.int32)), keys, items, type=self.type
        )

    def _sorted_items(self, entries: Any, row: int, flags: _Flags) -> list[tuple[Any, Any]]:
        """The sorted entries of one map, or none (the row failed) if a key is not UTF-8:
        upb does not check proto2 map keys, and raises when it hands such a key out."""
        try:
            return sorted(entries.items())
        except UnicodeDecodeError:
            flags.fail(row, f"map key of field {self.path} is not UTF-8")
            return []


class _StructReader(_ValueReader):
    def __init__(self, type_: pa.StructType, fields: list[_FieldReader]) -> None:
        self.type = type_
        self.fields = fields

    def read(
        self, values: list[Any], rows: np.ndarray, mask: np.ndarray | None, flags: _Flags
    ) -> pa.Array:
        children = [field.read(values, rows, flags) for field in self.fields]
        return self.assemble(children, len(values), mask)

    def assemble(self, children: list[pa.Array], count: int, mask: np.ndarray | None) -> pa.Array:
        """The struct array of ``children`` (null where ``mask``)."""
        if not children:
            return pa.array([{}] * count, self.type, mask=mask)
        arrow_mask = pa.array(mask, pa.bool_()) if mask is not None else None
        return pa.StructArray.from_arrays(children, fields=list(self.type), mask=arrow_mask)


def _value_reader(field: FieldDescriptor, type_: pa.DataType, path: str) -> _ValueReader:
    if field.type == F.TYPE_ENUM:
        return _EnumReader({v.number: v.name for v in reversed(field.enum_type.values)})
    if field.message_type is None:
        return _ScalarReader(type_, field.type, path)
    desc = field.message_type
    kind = message_kind(desc)
    if kind in ("timestamp", "duration"):
        return _TimeReader(type_, kind == "duration", path)
    if kind == "wrapper":
        return _WrapperReader(_ScalarReader(type_, WRAPPERS[desc.full_name], path))
    if kind == "empty":
        return _EmptyReader()
    return _struct_reader(desc, type_, path)


def _struct_reader(desc: Descriptor, type_: pa.StructType, path: str) -> _StructReader:
    readers = []
    for field, arrow_field in zip(desc.fields, type_, strict=True):
        child_path = f"{path}.{field.name}" if path else field.name
        if is_map(field):
            entry = field.message_type
            key = _value_reader(entry.fields_by_name["key"], arrow_field.type.key_type, child_path)
            value = _value_reader(
                entry.fields_by_name["value"], arrow_field.type.item_type, child_path
            )
            readers.append(
                _FieldReader(field.name, "map", arrow_field.type, value, key, path=child_path)
            )
        elif field.is_repeated:
            element = _value_reader(field, arrow_field.type.value_type, child_path)
            readers.append(_FieldReader(field.name, "list", arrow_field.type, element))
        else:
            value = _value_reader(field, arrow_field.type, child_path)
            readers.append(
                _FieldReader(
                    field.name, "single", arrow_field.type, value, presence=is_optional(field)
                )
            )
    return _StructReader(type_, readers)


# ---------------------------------------------------------------- writers (Python -> message)

_Setter = Callable[[Message, Any], None]
_Convert = Callable[[Any], Any]


def _scalar_convert(field_type: int) -> _Convert | None:
    if field_type in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return int  # Decimal -> int
    return None


def _time_parts(micros: int, duration: bool) -> tuple[int, int]:
    if not duration:
        seconds, rest = divmod(micros, _MICROS)
        return seconds, rest * 1000
    sign = -1 if micros < 0 else 1
    seconds, rest = divmod(abs(micros), _MICROS)
    return sign * seconds, sign * rest * 1000


def _element_writer(field: FieldDescriptor) -> tuple[bool, Callable[[Any, Any], Any]]:
    """How one value of ``field`` is written: ``(True, fill(message, value))`` for a
    message-typed value, ``(False, convert(value))`` for a scalar one."""
    if field.type == F.TYPE_ENUM:
        numbers = {v.name: v.number for v in field.enum_type.values}

        def enum_number(value: str) -> int:
            number = numbers.get(value)
            return int(value) if number is None else number

        return False, enum_number
    if field.message_type is None:
        convert = _scalar_convert(field.type)
        return False, convert if convert is not None else _identity
    desc = field.message_type
    kind = message_kind(desc)
    if kind in ("timestamp", "duration"):
        duration = kind == "duration"

        def fill_time(message: Message, micros: int) -> None:
            message.seconds, message.nanos = _time_parts(micros, duration)  # type: ignore[attr-defined]

        return True, fill_time
    if kind == "wrapper":
        convert = _scalar_convert(WRAPPERS[desc.full_name]) or _identity

        def fill_wrapper(message: Message, value: Any) -> None:
            message.value = convert(value)  # type: ignore[attr-defined]

        return True, fill_wrapper
    if kind == "empty":
        return True, _fill_nothing
    return True, _struct_writer(desc)


def _identity(value: Any) -> Any:
    return value


def _fill_nothing(message: Message, value: Any) -> None:
    return None


def _struct_writer(desc: Descriptor) -> Callable[[Message, dict[str, Any]], None]:
    setters = [(field.name, _field_setter(field)) for field in desc.fields]

    def fill(message: Message, value: dict[str, Any]) -> None:
        for name, setter in setters:
            setter(message, value[name])

    return fill


def _field_setter(field: FieldDescriptor) -> _Setter:
    name = field.name
    if is_map(field):
        entry = field.message_type
        _, key_convert = _element_writer(entry.fields_by_name["key"])
        nested, value_write = _element_writer(entry.fields_by_name["value"])

        def set_map(message: Message, value: Any) -> None:
            container = getattr(message, name)
            for key, item in value:
                key = key_convert(key)
                if nested:
                    target = container[key]
                    target.SetInParent()
                    value_write(target, item)
                else:
                    container[key] = value_write(item)

        return set_map
    nested, write = _element_writer(field)
    if field.is_repeated:
        if nested:

            def set_messages(message: Message, value: Any) -> None:
                container = getattr(message, name)
                for item in value:
                    write(container.add(), item)

            return set_messages

        def set_scalars(message: Message, value: Any) -> None:
            getattr(message, name).extend([write(item) for item in value])

        return set_scalars
    if nested:
        # An empty message reads as true when present; false (never decoded) means absent.
        absent = (None, False) if message_kind(field.message_type) == "empty" else (None,)

        def set_message(message: Message, value: Any) -> None:
            if value in absent:
                return
            target = getattr(message, name)
            target.SetInParent()
            write(target, value)

        return set_message

    def set_scalar(message: Message, value: Any) -> None:
        if value is not None:
            setattr(message, name, write(value))

    return set_scalar


def _plain_type(type_: pa.DataType) -> pa.DataType:
    """``type_`` with timestamps as int64 (so encoding sees microseconds, not datetimes)."""
    if pa.types.is_timestamp(type_):
        return pa.int64()
    if pa.types.is_struct(type_):
        return pa.struct([f.with_type(_plain_type(f.type)) for f in type_])
    if pa.types.is_large_list(type_):
        return pa.large_list(type_.value_field.with_type(_plain_type(type_.value_type)))
    if pa.types.is_map(type_):
        return pa.map_(
            type_.key_field.with_type(_plain_type(type_.key_type)),
            type_.item_field.with_type(_plain_type(type_.item_type)),
        )
    return type_


# ---------------------------------------------------------------- the codec

#: Rows parsed and read at a time.
_CHUNK = 1024


def _large_binary(payloads: pa.Array) -> pa.Array:
    """``payloads`` as one ``large_binary`` array."""
    if isinstance(payloads, pa.ChunkedArray):
        payloads = payloads.combine_chunks()
    if not pa.types.is_large_binary(payloads.type):
        payloads = payloads.cast(pa.large_binary())
    return payloads


def _concat(chunks: list[pa.Array], type_: pa.DataType) -> pa.Array:
    if len(chunks) == 1:
        return chunks[0]
    if not chunks:
        return pa.array([], type_)
    return pa.concat_arrays(chunks)


@dataclass(frozen=True)
class _Compiled:
    type: StructType
    arrow: pa.StructType
    plain: pa.DataType
    file: FileDescriptor
    descriptor: Descriptor
    message: type[Message]
    reader: _StructReader
    fill: Callable[[Message, dict[str, Any]], None]
    fast: ProtoFastDecoder | None  # None: the kernel does not handle the message


def _build(proto: ProtoSchema) -> _Compiled:
    """The compiled form of a loaded Protobuf schema: its first message's type, class,
    reader and writer."""
    pool = build_pool(proto)
    file = root_file(pool)
    messages = list(file.message_types_by_name.values())
    if not messages:
        raise SchemaNotExpressible("the Protobuf schema declares no message")
    descriptor = messages[0]
    type_ = iceberg_type(descriptor)
    arrow = arrow_type(type_)
    program = compile_program(descriptor)
    return _Compiled(
        type=type_,
        arrow=arrow,
        plain=_plain_type(arrow),
        file=file,
        descriptor=descriptor,
        message=GetMessageClass(descriptor),
        reader=_struct_reader(descriptor, arrow, ""),
        fill=_struct_writer(descriptor),
        fast=ProtoFastDecoder(program, arrow) if program is not None else None,
    )


class ProtobufCodec:
    """Protobuf values written with a registered schema (Confluent framing stripped, the
    message-index list not): the schema's first message as typed columns."""

    schema_types: tuple[str, ...] = ("PROTOBUF",)

    def __init__(self) -> None:
        self._schemas: SchemaCache[ProtoSchema, _Compiled] = SchemaCache(
            "PROTOBUF", "Protobuf", load_proto_schema, _build
        )

    def iceberg_type(self, schema: RegisteredSchema, resolve: Resolve) -> IcebergType:
        """The Iceberg type of the schema's first message (placeholder field ids); raises
        :class:`SchemaNotExpressible`."""
        return self._schemas.get(schema, resolve).type

    def arrow_type(self, schema: RegisteredSchema) -> pa.DataType:
        """The Arrow type :meth:`decode` gives for ``schema``."""
        return self._schemas.get(schema, None).arrow

    def decode(self, schema: RegisteredSchema, payloads: pa.Array) -> DecodedValues:
        """Decode ``payloads`` (``large_binary``, no nulls); a bad payload gives a null row,
        ``keep_bytes`` and its cause, never an exception."""
        return self._decode(self._schemas.get(schema, None), payloads, 0)

    def decode_framed(
        self, schema: RegisteredSchema, values: pa.Array, header: int
    ) -> DecodedValues:
        """:meth:`decode` of the payloads of ``values``, each after a ``header`` of that many
        bytes (the Confluent framing a caller checked), without copying them."""
        return self._decode(self._schemas.get(schema, None), values, header)

    def encode(self, schema: RegisteredSchema, values: pa.Array) -> pa.Array:
        """The canonical payloads of ``values`` (the type :meth:`decode` gives, no null rows):
        ``00`` then the message serialized deterministically by upb, or written the same by
        the compiled encoder (:mod:`.encoder`) for the rows it handles."""
        compiled = self._schemas.get(schema, None)
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if values.null_count:
            raise ValueError("a null row has no Protobuf payload")
        upb = functools.partial(encode_upb, compiled.message, compiled.fill, compiled.plain)
        encoder = encoder_for(compiled.message, compiled.descriptor, compiled.arrow)
        return upb(values) if encoder is None else encoder.encode(values, upb)

    def _decode(self, compiled: _Compiled, payloads: pa.Array, skip: int) -> DecodedValues:
        """The kernel's values for the rows it proves canonical, upb's for the others."""
        if compiled.fast is None:
            return self._decode_upb(compiled, payloads, skip)
        payloads = _large_binary(payloads)
        values, slow = compiled.fast.decode_fast(payloads, skip)
        rows = len(payloads)
        keep = np.zeros(rows, dtype=bool)
        errors: list[str | None] = [None] * rows
        if not slow.any():
            return DecodedValues(values=values, keep_bytes=keep, errors=errors)
        slow_rows = np.flatnonzero(slow)
        if len(slow_rows) == rows:
            return self._decode_upb(compiled, payloads, skip)
        other = self._decode_upb(compiled, payloads.take(pa.array(slow_rows)), skip)
        keep[slow_rows] = other.keep_bytes
        for row, error in zip(slow_rows.tolist(), other.errors, strict=True):
            errors[row] = error
        # Row i of the result: the kernel's row i, or (for the j-th slow row) upb's row j.
        where = np.arange(rows, dtype=np.int64)
        where[slow_rows] = rows + np.arange(len(slow_rows), dtype=np.int64)
        merged = pa.concat_arrays([values, other.values]).take(pa.array(where))
        return DecodedValues(values=merged, keep_bytes=keep, errors=errors)

    def _decode_upb(self, compiled: _Compiled, payloads: pa.Array, skip: int) -> DecodedValues:
        """Decode every row with upb (the reference the kernel's rows agree with)."""
        data, offsets_array = payload_buffers(payloads)
        rows = len(offsets_array) - 1
        # One copy of the batch as bytes: upb parses a bytes slice several times faster than
        # a memoryview (which it copies through the buffer protocol).
        view = data.tobytes()
        offsets = offsets_array.tolist()
        flags = _Flags(rows)
        reader = compiled.reader
        columns: list[list[pa.Array]] = [[] for _ in reader.fields]
        # Chunks keep the messages a column pass walks in the CPU cache (a pass over a whole
        # batch of messages runs about 3x slower).
        for first in range(0, rows, _CHUNK):
            last = min(first + _CHUNK, rows)
            messages = self._parse(compiled, view, offsets, skip, first, last, flags)
            row_ids = np.arange(first, last, dtype=np.int64)
            for column, field in zip(columns, reader.fields, strict=True):
                column.append(field.read(messages, row_ids, flags))
        children = [
            _concat(column, field.type)
            for column, field in zip(columns, reader.fields, strict=True)
        ]
        values = reader.assemble(children, rows, flags.failed if flags.failed.any() else None)
        return DecodedValues(values=values, keep_bytes=flags.keep, errors=flags.errors)

    def _parse(
        self,
        compiled: _Compiled,
        view: bytes,
        offsets: list[int],
        skip: int,
        first: int,
        last: int,
        flags: _Flags,
    ) -> list[Message]:
        """The messages of rows ``first`` to ``last`` (an empty one for a failed row), each
        row's ``keep_bytes`` set unless it re-serializes to its own bytes."""
        make = compiled.message
        messages: list[Message] = []
        append = messages.append
        keep = flags.keep
        for row in range(first, last):
            start, end = offsets[row] + skip, offsets[row + 1]
            message = make()
            append(message)
            if start < end and view[start] == 0:
                start += 1
            else:
                try:
                    indexes, start = read_indexes(view, start, end)
                except ValueError as exc:
                    flags.fail(row, str(exc))
                    continue
                if indexes != [0]:
                    flags.fail(row, self._other_message(compiled, indexes))
                    continue
                keep[row] = True  # [0] written the long way
            body = view[start:end]
            try:
                message.ParseFromString(body)
            except DecodeError as exc:
                flags.fail(row, f"corrupt payload: {exc}"[:200])
                message.Clear()
                continue
            message.DiscardUnknownFields()
            if message.SerializePartialToString(deterministic=True) != body:
                keep[row] = True
        return messages

    @staticmethod
    def _other_message(compiled: _Compiled, indexes: list[int]) -> str:
        named = message_at(compiled.file, indexes)
        what = f"message {named.full_name}" if named is not None else "no message of the schema"
        return (
            f"message indexes {indexes} name {what}; only the schema's first message "
            f"({compiled.descriptor.full_name}) is decoded"
        )
