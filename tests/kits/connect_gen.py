"""Kafka Connect JSON envelopes written as ``JsonConverter`` (``schemas.enable=true``) writes
them, for the ``connect-json`` codec's tests: Connect schemas as JSON (keys in the order the
converter puts them: ``type``, then ``items``/``keys``/``values``/``fields``, ``optional``,
``name``, ``version``, ``parameters``, ``default``, and ``field`` for a struct's field) and
values converted from their logical form (a :class:`decimal.Decimal`, a date, ...) to what the
converter writes (base64 of the unscaled value, days since the epoch, ...), compact."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import uuid
from typing import Any

DECIMAL = "org.apache.kafka.connect.data.Decimal"
DATE = "org.apache.kafka.connect.data.Date"
TIME = "org.apache.kafka.connect.data.Time"
TIMESTAMP = "org.apache.kafka.connect.data.Timestamp"
DBZ_DATE = "io.debezium.time.Date"
DBZ_TIME = "io.debezium.time.Time"
DBZ_MICRO_TIME = "io.debezium.time.MicroTime"
DBZ_NANO_TIME = "io.debezium.time.NanoTime"
DBZ_TIMESTAMP = "io.debezium.time.Timestamp"
DBZ_MICRO_TIMESTAMP = "io.debezium.time.MicroTimestamp"
DBZ_NANO_TIMESTAMP = "io.debezium.time.NanoTimestamp"
DBZ_ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
DBZ_JSON = "io.debezium.data.Json"
DBZ_UUID = "io.debezium.data.Uuid"
DBZ_VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
EPOCH_DATE = dt.date(1970, 1, 1)


def schema(
    type_: str,
    *,
    optional: bool = False,
    name: str | None = None,
    parameters: dict[str, str] | None = None,
    default: Any = None,
    **children: Any,
) -> dict[str, Any]:
    """A Connect schema as JsonConverter writes it (``children``: ``items``, ``keys`` and
    ``values``, or ``fields``)."""
    out: dict[str, Any] = {"type": type_, **children, "optional": optional}
    if name is not None:
        out["name"] = name
    if parameters is not None:
        out["parameters"] = parameters
    if default is not None:
        out["default"] = default
    return out


def field(name: str, of: dict[str, Any]) -> dict[str, Any]:
    """A struct's field: its schema with its name."""
    return {**of, "field": name}


def struct(*fields: dict[str, Any], optional: bool = False, name: str | None = None) -> dict:
    """A struct schema of ``fields`` (each from :func:`field`)."""
    return schema("struct", fields=list(fields), optional=optional, name=name)


def decimal_schema(scale: int, precision: int | None = None, *, optional: bool = True) -> dict:
    """A Connect Decimal (Debezium adds the precision parameter)."""
    parameters = {"scale": str(scale)}
    if precision is not None:
        parameters["connect.decimal.precision"] = str(precision)
    return schema("bytes", optional=optional, name=DECIMAL, parameters=parameters)


def variable_decimal_schema(*, optional: bool = True) -> dict:
    """Debezium's VariableScaleDecimal: a struct of scale and unscaled value."""
    return schema(
        "struct",
        fields=[field("scale", schema("int32")), field("value", schema("bytes"))],
        optional=optional,
        name=DBZ_VARIABLE_SCALE_DECIMAL,
    )


def unscaled_bytes(unscaled: int) -> bytes:
    """Java's ``BigInteger.toByteArray``: the shortest big-endian two's complement."""
    return unscaled.to_bytes(max(1, (unscaled.bit_length() + 8) // 8), "big", signed=True)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def to_json(of: dict[str, Any], value: Any) -> Any:
    """``value`` (its logical form) as JsonConverter writes it for schema ``of``."""
    if value is None:
        return None
    name, type_ = of.get("name"), of["type"]
    if name == DECIMAL:
        scale = int(of["parameters"]["scale"])
        unscaled = int(decimal.Decimal(value).scaleb(scale, decimal.Context(prec=100)))
        return b64(unscaled_bytes(unscaled))
    if name in (DATE, DBZ_DATE):
        return (value - EPOCH_DATE).days
    if name in (TIME, DBZ_TIME):  # microseconds since midnight, whole milliseconds
        return value // 1000
    if name == DBZ_MICRO_TIME:
        return value
    if name == DBZ_NANO_TIME:
        return value * 1000
    if name == TIMESTAMP:
        return (value - EPOCH) // dt.timedelta(milliseconds=1)
    if name in (DBZ_TIMESTAMP, DBZ_MICRO_TIMESTAMP, DBZ_NANO_TIMESTAMP):
        micros = (value.replace(tzinfo=dt.UTC) - EPOCH) // dt.timedelta(microseconds=1)
        return {DBZ_TIMESTAMP: micros // 1000, DBZ_MICRO_TIMESTAMP: micros}.get(name, micros * 1000)
    if name == DBZ_ZONED_TIMESTAMP:
        return value.isoformat().replace("+00:00", "Z")
    if name == DBZ_UUID:
        return str(value)
    if name == DBZ_VARIABLE_SCALE_DECIMAL:
        sign, digits, exponent = decimal.Decimal(value).as_tuple()
        unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        return {"scale": -int(exponent), "value": b64(unscaled_bytes(unscaled))}
    if type_ == "bytes":
        return b64(value)
    if type_ == "array":
        return [to_json(of["items"], item) for item in value]
    if type_ == "map":
        keys, values = of["keys"], of["values"]
        if keys["type"] == "string":
            return {to_json(keys, k): to_json(values, v) for k, v in value}
        return [[to_json(keys, k), to_json(values, v)] for k, v in value]
    if type_ == "struct":
        return {f["field"]: to_json(f, value.get(f["field"])) for f in of["fields"]}
    return value


def envelope(of: dict[str, Any] | None, value: Any) -> bytes:
    """The bytes JsonConverter writes for ``value`` (logical form) of schema ``of``."""
    payload = None if of is None else to_json(of, value)
    body = {"schema": of, "payload": payload}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def uuid_of(number: int) -> uuid.UUID:
    return uuid.UUID(int=number)
