"""Decode and encode Kafka requests and responses with kio, by (api key, version).

Requests carry header v1 or v2, responses header v0 or v1 (ApiVersions always v0); kio's payload
classes name their header class, so the codec never guesses. Decoding failures are sorted into
two kinds: :class:`UnsupportedMessage` (kio has no schema for the version, meets an unknown tagged
field or an unknown enum value: the frame is fine but opaque to the proxy, pass it raw) and
:class:`MalformedMessage` (the bytes do not parse: the connection should close).
"""

from __future__ import annotations

import datetime
import io
import struct
import uuid
from dataclasses import MISSING, Field, fields, is_dataclass
from functools import cache
from typing import Any, TypeVar

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.serial._introspect import EntityField, classify_field, is_optional
from kio.static.primitive import i32Timedelta, i64Timedelta
from kio.static.protocol import RequestHeader, RequestPayload, ResponsePayload

from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy.frames import REQUEST_PEEK_SIZE, Buffer
from bergstream.core.proxy.versions import api_name, is_supported

_I32 = struct.Struct(">i")
_REQUEST_PEEK = struct.Struct(">hh")

E = TypeVar("E")


class CodecError(Exception):
    """A message could not be decoded or encoded."""


class UnsupportedMessage(CodecError):
    """kio cannot represent this message (version, tagged field, enum value): pass it raw."""


class MalformedMessage(CodecError):
    """The bytes do not form a valid message of the declared API and version."""


def _readonly(data: Buffer) -> Buffer:
    if isinstance(data, bytearray):
        return memoryview(data).toreadonly()
    if isinstance(data, memoryview) and not data.readonly:
        return data.toreadonly()
    return data


@cache
def _reader(entity_type: type[Any]) -> Any:
    return entity_reader(entity_type)


@cache
def _writer(entity_type: type[Any]) -> Any:
    return entity_writer(entity_type)


def _read(entity_type: type[E], data: Buffer, offset: int, what: str) -> tuple[E, int]:
    try:
        return _reader(entity_type)(data, offset)  # type: ignore[no-any-return]
    except KeyError as error:
        if "tagged field" in str(error):
            raise UnsupportedMessage(f"{what}: {error.args[0]}") from error
        raise MalformedMessage(f"{what}: {error!r}") from error
    except ValueError as error:
        if "is not a valid" in str(error):  # an enum value kio does not know (error code, ...)
            raise UnsupportedMessage(f"{what}: {error}") from error
        raise MalformedMessage(f"{what}: {error}") from error
    except Exception as error:  # BufferUnderflow, UnicodeDecodeError, OverflowError, ...
        raise MalformedMessage(f"{what}: {type(error).__name__}: {error}") from error


def request_schema(api_key: int, api_version: int) -> type[RequestPayload]:
    """kio's request class; :class:`UnsupportedMessage` if kio does not know the version."""
    if not is_supported(api_key, api_version):
        raise UnsupportedMessage(f"no schema for {api_name(api_key)} v{api_version} request")
    return load_request_schema(api_key, api_version)


def response_schema(api_key: int, api_version: int) -> type[ResponsePayload]:
    """kio's response class; :class:`UnsupportedMessage` if kio does not know the version."""
    if not is_supported(api_key, api_version):
        raise UnsupportedMessage(f"no schema for {api_name(api_key)} v{api_version} response")
    return load_response_schema(api_key, api_version)


def decode_request_header(message: Buffer) -> tuple[RequestHeader, int]:
    """Decode the header of a request message; return it and its size in bytes."""
    if len(message) < REQUEST_PEEK_SIZE:
        raise MalformedMessage(f"request of {len(message)} bytes is shorter than a header")
    api_key, api_version = _REQUEST_PEEK.unpack_from(message, 0)
    schema = request_schema(api_key, api_version)
    data = _readonly(message)
    return _read(schema.__header_schema__, data, 0, "request header")


def decode_request(message: Buffer) -> tuple[RequestHeader, RequestPayload]:
    """Decode a request message (header and payload, no length prefix)."""
    header, offset = decode_request_header(message)
    schema = request_schema(header.request_api_key, header.request_api_version)
    data = _readonly(message)
    what = f"{api_name(header.request_api_key)} v{header.request_api_version} request"
    payload, size = _read(schema, data, offset, what)
    if offset + size != len(message):
        raise MalformedMessage(f"{what}: {len(message) - offset - size} bytes after the payload")
    return header, payload


def decode_response(api_key: int, api_version: int, message: Buffer) -> tuple[int, ResponsePayload]:
    """Decode a response message; return its correlation id and payload.

    An ApiVersions request in a version kio does not know is answered by brokers in v0
    (KIP-511), so such responses are decoded as v0.
    """
    if api_key == ApiKey.API_VERSIONS and not is_supported(api_key, api_version):
        try:
            return decode_response(api_key, 0, message)
        except MalformedMessage as error:  # a broker that does speak that newer version
            raise UnsupportedMessage(f"ApiVersions v{api_version} response: {error}") from None
    schema = response_schema(api_key, api_version)
    data = _readonly(message)
    header, offset = _read(schema.__header_schema__, data, 0, "response header")
    what = f"{api_name(api_key)} v{api_version} response"
    payload, size = _read(schema, data, offset, what)
    if offset + size != len(message):
        raise MalformedMessage(f"{what}: {len(message) - offset - size} bytes after the payload")
    return header.correlation_id, payload


def _frame(write: Any) -> bytes:
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    write(buffer)
    view = buffer.getbuffer()
    _I32.pack_into(view, 0, len(view) - 4)
    del view
    return buffer.getvalue()


def encode_request(header: RequestHeader, payload: RequestPayload) -> bytes:
    """Encode a request frame (length prefix, header, payload).

    The header's api key and version are checked against the payload's class, and the header
    class is the one the payload's version uses (v1 or v2), so a filter cannot send a frame the
    broker would misread.
    """
    header_schema = payload.__header_schema__
    if (header.request_api_key, header.request_api_version) != (
        payload.__api_key__,
        payload.__version__,
    ):
        raise CodecError(
            f"header says api {header.request_api_key} v{header.request_api_version} but the "
            f"payload is {type(payload).__name__} v{payload.__version__}"
        )
    if type(header) is not header_schema:
        header = header_schema(
            request_api_key=header.request_api_key,
            request_api_version=header.request_api_version,
            correlation_id=header.correlation_id,
            client_id=header.client_id,
        )

    def write(buffer: io.BytesIO) -> None:
        _writer(header_schema)(buffer, header)
        _writer(type(payload))(buffer, payload)

    try:
        return _frame(write)
    except Exception as error:
        raise CodecError(f"cannot encode {type(payload).__name__}: {error!r}") from error


def encode_response(correlation_id: int, payload: ResponsePayload) -> bytes:
    """Encode a response frame (length prefix, header v0/v1 as the payload's class says)."""
    header_schema = payload.__header_schema__
    header = header_schema(correlation_id=correlation_id)

    def write(buffer: io.BytesIO) -> None:
        _writer(header_schema)(buffer, header)
        _writer(type(payload))(buffer, payload)

    try:
        return _frame(write)
    except Exception as error:
        raise CodecError(f"cannot encode {type(payload).__name__}: {error!r}") from error


def make_request_header(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None
) -> RequestHeader:
    """A request header of the version (v1 or v2) the API version uses."""
    schema = request_schema(api_key, api_version).__header_schema__
    return schema(
        request_api_key=api_key,  # type: ignore[arg-type]
        request_api_version=api_version,  # type: ignore[arg-type]
        correlation_id=correlation_id,  # type: ignore[arg-type]
        client_id=client_id,
    )


# --------------------------------------------------------------------------- building payloads

_ZERO_TIMEDELTA = datetime.timedelta(0)

_ZEROS: dict[str, Any] = {
    "int8": 0,
    "int16": 0,
    "int32": 0,
    "int64": 0,
    "uint8": 0,
    "uint16": 0,
    "uint32": 0,
    "uint64": 0,
    "float64": 0.0,
    "string": "",
    "bytes": b"",
    "records": b"",
    "uuid": uuid.UUID(int=0),
    "bool": False,
    "error_code": ErrorCode.none,
    "timedelta_i32": i32Timedelta.parse(_ZERO_TIMEDELTA),
    "timedelta_i64": i64Timedelta.parse(_ZERO_TIMEDELTA),
}


def field_entity_type(entity_type: type[Any], name: str) -> type[Any]:
    """The nested entity class of field ``name`` (an entity or an array of entities)."""
    for item in fields(entity_type):
        if item.name == name:
            kind = classify_field(item)
            if not is_dataclass(kind.type_):
                raise TypeError(f"{entity_type.__name__}.{name} holds no entities")
            return kind.type_  # type: ignore[no-any-return]
    raise AttributeError(f"{entity_type.__name__} has no field {name!r}")


def field_names(entity_type: type[Any]) -> frozenset[str]:
    """Names of an entity's fields."""
    return frozenset(item.name for item in fields(entity_type))


def _zero(item: Field[Any]) -> Any:
    if item.default is not MISSING:
        return item.default
    if item.default_factory is not MISSING:
        return item.default_factory()
    kind = classify_field(item)
    if kind.is_array:
        return ()
    if is_optional(item):
        return None
    if isinstance(kind, EntityField):
        return build(kind.type_)
    kafka_type = item.metadata.get("kafka_type")
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(0, datetime.UTC)
    if kafka_type not in _ZEROS:
        raise TypeError(f"no zero value for field {item.name} of kafka type {kafka_type!r}")
    return _ZEROS[kafka_type]


def build(entity_type: type[E], **values: Any) -> E:
    """Instantiate a kio entity, filling every field not given with its default or a zero.

    Zeros are 0, empty strings, empty arrays, ``None`` for nullable fields and
    ``ErrorCode.none``; an int given for an ``error_code`` field is converted to ``ErrorCode``.
    """
    known = field_names(entity_type)
    unknown = set(values) - known
    if unknown:
        raise TypeError(f"{entity_type.__name__} has no fields {sorted(unknown)}")
    kwargs = {}
    for item in fields(entity_type):  # type: ignore[arg-type]
        if item.name in values:
            value = values[item.name]
            if item.metadata.get("kafka_type") == "error_code" and not isinstance(value, ErrorCode):
                value = ErrorCode(value)
            kwargs[item.name] = value
        else:
            kwargs[item.name] = _zero(item)
    return entity_type(**kwargs)


def build_request(api_key: int, api_version: int, **values: Any) -> RequestPayload:
    """A request payload of ``api_key`` in ``api_version`` (see :func:`build` for the fields not
    given); :class:`UnsupportedMessage` if kio has no schema for that version."""
    return build(request_schema(api_key, api_version), **values)


def build_response(api_key: int, api_version: int, **values: Any) -> ResponsePayload:
    """A response payload of ``api_key`` in ``api_version`` (see :func:`build` for the fields not
    given); :class:`UnsupportedMessage` if kio has no schema for that version."""
    return build(response_schema(api_key, api_version), **values)
