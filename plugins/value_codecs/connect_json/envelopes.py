"""Kafka Connect JSON envelopes (``JsonConverter`` with ``schemas.enable=true``): each value is
``{"schema": <Connect schema>, "payload": <value>}``. This module finds each value's schema
(its *shape*: the codec declares one schema per distinct Connect schema) and its payload.

**Schema ids.** A schema's id is 31 bits of the SHA-256 of its canonical text: the schema's
JSON with keys sorted, compact, non-ASCII unescaped (what ``orjson.dumps`` writes with
``OPT_SORT_KEYS``), so the same schema written with other spacing or key order has the same
id, in the pipeline, ISK and KSI alike.

**Reading fast.** A connector writes the same schema text into every value of a topic, schema
first: ``{"schema":K,"payload":V}``. Once ``K`` (those very bytes) has been parsed alone as a
complete JSON value, any value that starts with ``{"schema":`` and ``K`` followed by
``,"payload":`` has that schema (a JSON value ends where it ends: nothing after ``K`` can be
part of it), so finding a row's shape costs a byte comparison, and decoding it parses only
``V``. Any other row (other spacing or key order, a schema not met yet) is parsed whole.
"""

from __future__ import annotations

import decimal
import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

__all__ = [
    "NOT_AN_ENVELOPE",
    "Declared",
    "EnvelopeError",
    "Envelopes",
    "NotAnEnvelope",
    "ObservedEnvelopes",
    "row_bytes",
]

NOT_AN_ENVELOPE = "not a Kafka Connect JSON envelope (schemas.enable=true)"
_PREFIX = b'{"schema":'
_SEPARATOR = b',"payload":'
#: Distinct schema texts remembered for the fast path (past that, the memory starts over).
_REMEMBERED = 1024
#: Schema texts tried first for each row: the last ones that matched.
_RECENT = 4


class EnvelopeError(ValueError):
    """Why a value is not an envelope this codec reads (the row's cause)."""


class NotAnEnvelope(EnvelopeError):
    """A JSON value that is no envelope at all (not an object with exactly ``schema`` and
    ``payload``): what ``JsonConverter`` writes with ``schemas.enable=false``."""


@dataclass(frozen=True)
class Declared:
    """One distinct Connect schema: its id and canonical text."""

    schema_id: int
    text: str


@dataclass
class ObservedEnvelopes:
    """Per row of a batch, the index of its schema in ``schemas`` (``-1``: none, and why in
    ``errors``; a null row has neither), the schemas in order of first appearance, and the
    first row of each."""

    schema_of: np.ndarray
    errors: list[str | None]
    schemas: list[Declared] = field(default_factory=list)
    telling: list[int] = field(default_factory=list)
    #: Rows that are JSON but no envelope (:class:`NotAnEnvelope`), in order.
    plain: list[int] = field(default_factory=list)


def _article(name: str) -> str:
    return f"an {name}" if name[0] in "aeio" else f"a {name}"


_KINDS = {bool: "boolean", int: "number", float: "number", str: "string", list: "array"}


def _parse(text: bytes | memoryview, *, exact: bool = False) -> Any:
    """Parsed JSON: by orjson, else (integers beyond 64 bits, ``NaN``) the standard library;
    ``exact`` reads numbers with a fraction as :class:`decimal.Decimal` (always the standard
    library). Raises :class:`EnvelopeError` for text that is not JSON."""
    if not exact:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(str(text, "utf-8"), parse_float=decimal.Decimal if exact else None)
    except UnicodeDecodeError as error:
        raise EnvelopeError(
            f"corrupt payload: not UTF-8 ({error.reason} at byte {error.start})"
        ) from None
    except json.JSONDecodeError as error:
        raise EnvelopeError(f"corrupt payload: {error.msg} at char {error.pos}") from None
    except (ValueError, RecursionError) as error:
        raise EnvelopeError(f"corrupt payload: {error}") from None


def _envelope(parsed: Any) -> dict[str, Any]:
    """``parsed`` checked to be an envelope with a schema."""
    if type(parsed) is not dict:
        got = "null" if parsed is None else _KINDS.get(type(parsed), "value")
        raise NotAnEnvelope(f"{NOT_AN_ENVELOPE}: {_article(got)}, not an object")
    missing = [key for key in ("schema", "payload") if key not in parsed]
    if missing:
        raise NotAnEnvelope(
            f"{NOT_AN_ENVELOPE}: an object without {' and '.join(repr(m) for m in missing)}"
        )
    if len(parsed) != 2:
        others = sorted(key for key in parsed if key not in ("schema", "payload"))
        raise NotAnEnvelope(f"{NOT_AN_ENVELOPE}: an object with other keys too: {others[:5]}")
    schema = parsed["schema"]
    if schema is None:
        raise EnvelopeError(
            "a Kafka Connect JSON envelope without a schema (schema: null): its payload has "
            "no declared type"
        )
    if type(schema) is not dict:
        raise EnvelopeError(f"{NOT_AN_ENVELOPE}: its schema is not an object")
    return parsed


def _canonical(schema: Any) -> str:
    """The canonical text of a parsed schema (see the module docstring)."""
    try:
        return orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode("utf-8")
    except TypeError:  # integers beyond 64 bits
        return json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def schema_id(text: str) -> int:
    """The id of a canonical schema text: 31 bits of its SHA-256, never 0."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF or 1


def row_bytes(values: pa.Array) -> Iterator[bytes | None]:
    """Each row of a binary array as bytes (None for a null row)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not pa.types.is_large_binary(values.type):
        values = values.cast(pa.large_binary())
    count = len(values)
    if not count:
        return
    _, offsets_buffer, data_buffer = values.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64)[
        values.offset : values.offset + count + 1
    ].tolist()
    data = memoryview(data_buffer).cast("B") if data_buffer is not None else memoryview(b"")
    valid = (
        np.logical_not(np.asarray(values.is_null(), dtype=bool)).tolist()
        if values.null_count
        else None
    )
    for row in range(count):
        if valid is not None and not valid[row]:
            yield None
        else:
            yield data[offsets[row] : offsets[row + 1]].tobytes()


class Envelopes:
    """Finds the schemas and payloads of envelopes, remembering the schema texts met (see the
    module docstring). Thread-safe; pickles without its memory."""

    def __init__(self) -> None:
        self._forget()

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[bytes, Declared] = {}  # schema text as written -> its schema
        self._texts: dict[int, list[bytes]] = {}  # schema id -> its texts as written
        self._by_canonical: dict[str, Declared] = {}
        self._recent: list[bytes] = []

    def __getstate__(self) -> dict[str, Any]:
        return {}  # the memory is rebuilt where the codec is unpickled

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._forget()

    # -- schemas

    def _declared(self, schema: Any) -> Declared:
        text = _canonical(schema)
        found = self._by_canonical.get(text)
        if found is None:
            found = Declared(schema_id(text), text)
            with self._lock:
                if len(self._by_canonical) >= _REMEMBERED:
                    self._by_canonical.clear()
                self._by_canonical[text] = found
        return found

    def _remember(self, written: bytes, declared: Declared) -> None:
        with self._lock:
            if len(self._known) >= _REMEMBERED:
                self._known.clear()
                self._texts.clear()
            self._known[written] = declared
            self._texts.setdefault(declared.schema_id, []).append(written)

    def _written(self, row: bytes) -> bytes | None:
        """The schema text of ``row`` as written, when the row has the fast form and that text
        is a complete JSON object (parsed once, then remembered); None otherwise."""
        if not row.startswith(_PREFIX):
            return None
        for written in self._recent:
            if row.startswith(written, 10) and row.startswith(_SEPARATOR, 10 + len(written)):
                return written
        end = row.find(_SEPARATOR, 10)
        if end < 0:
            return None
        written = row[10:end]
        if written not in self._known:
            try:
                schema = _parse(written)
            except EnvelopeError:
                return None  # the separator is inside the schema: read the row whole
            if type(schema) is not dict:
                return None
            self._remember(written, self._declared(schema))
        recent = self._recent
        self._recent = [written, *(r for r in recent if r is not written)][:_RECENT]
        return written

    def schema_of(self, row: bytes) -> Declared:
        """The schema of one envelope; raises :class:`EnvelopeError` for a value that is not
        an envelope with a schema."""
        written = self._written(row)
        if written is not None:
            found = self._known.get(written)
            if found is not None:
                return found
        return self._declared(_envelope(_parse(row))["schema"])

    def observe(self, values: pa.Array, limit: int | None) -> ObservedEnvelopes:
        """The schemas of a batch of values (``large_binary``, nulls allowed); rows of schemas
        beyond the first ``limit`` (None: no bound) get an error."""
        rows = list(row_bytes(values))
        found = ObservedEnvelopes(np.full(len(rows), -1, np.int64), [None] * len(rows))
        index: dict[int, int] = {}
        for row, text in enumerate(rows):
            if text is None:
                continue
            try:
                declared = self.schema_of(text)
            except NotAnEnvelope as error:
                found.errors[row] = str(error)
                found.plain.append(row)
                continue
            except EnvelopeError as error:
                found.errors[row] = str(error)
                continue
            position = index.get(declared.schema_id)
            if position is None:
                if limit is not None and len(found.schemas) >= limit:
                    found.errors[row] = (
                        f"more than {limit} distinct Connect schemas in one batch: this one is "
                        "kept as bytes"
                    )
                    continue
                position = index[declared.schema_id] = len(found.schemas)
                found.schemas.append(declared)
                found.telling.append(row)
            found.schema_of[row] = position
        return found

    # -- payloads

    def payload_of(self, row: bytes, expected: int, *, exact: bool = False) -> Any:
        """The parsed payload of one envelope whose schema has id ``expected`` (``exact``:
        numbers with a fraction as :class:`decimal.Decimal`); raises :class:`EnvelopeError`
        for a value that is not such an envelope."""
        if row.startswith(_PREFIX) and row.endswith(b"}"):
            for written in self._texts.get(expected, ()):
                start = 10 + len(written)
                if row.startswith(written, 10) and row.startswith(_SEPARATOR, start):
                    try:
                        return _parse(memoryview(row)[start + len(_SEPARATOR) : -1], exact=exact)
                    except EnvelopeError:
                        break  # read the row whole, for the exact cause
        envelope = _envelope(_parse(row, exact=exact))
        if not exact:
            found = self._declared(envelope["schema"]).schema_id
        else:  # floats read as decimals: canonical only from the schema parsed plainly
            found = self.schema_of(row).schema_id
        if found != expected:
            raise EnvelopeError(f"the envelope's schema has id {found}, not {expected}")
        return envelope["payload"]
