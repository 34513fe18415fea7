"""Helpers of the pipeline's typed-table tests: the ``codecs:`` typing of a topic, schemas
registered in the stack's registry, records produced with confluent-kafka's ``AvroSerializer``
(plus the odd ones of :mod:`tests.kits.avro_wire`), the rows core's decoder makes of them, and a
registry that can be switched off and on (a TCP forwarder)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from bergstream.core.api import ROW_ARROW_SCHEMA, ROW_SCHEMA, TypedRows, build_layout
from bergstream.core.lake import ResolvedLake, load_catalog
from bergstream.core.typed.row_contract import record_to_row
from bergstream.pipeline.typed import TopicTyping, topic_typing
from tests.kits.avro_registry import typed_context
from tests.kits.avro_wire import value_bytes
from tests.kits.lake import Produced, consume_all

#: Kafka timestamp of the first produced record.
FIRST_MS = 1_714_564_800_000


def typing_for(
    home: Path, registry_url: str, match: str, *, key: bool = False, refresh: float = 0.0
) -> TopicTyping:
    """The typing of topic ``match`` (a name) by a ``codecs:`` rule decoding values (and keys)
    by their registered schema's type."""
    codecs = {
        "schema_registry": {
            "url": registry_url,
            "subject_refresh_seconds": refresh,
            "timeout_seconds": 2.0,
        },
        "topics": [{"match": match, "value": "registry", "key": "registry" if key else "raw"}],
    }
    typing = topic_typing(typed_context(home, codecs), match)
    assert typing is not None
    return typing


def register(registry_url: str, subject: str, schema: dict[str, Any] | str) -> int:
    """Register an Avro schema under ``subject``; its id."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient({"url": registry_url})
    return int(client.register_schema(subject, Schema(json.dumps(schema), "AVRO")))


def avro_serializer(
    registry_url: str, topic: str, schema: dict[str, Any]
) -> Callable[[Any], bytes]:
    """confluent-kafka's ``AvroSerializer`` of ``schema`` for ``topic``'s values."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serializer = AvroSerializer(SchemaRegistryClient({"url": registry_url}), json.dumps(schema))
    context = SerializationContext(topic, MessageField.VALUE)

    def serialize(value: Any) -> bytes:
        data = serializer(value, context)
        assert data is not None
        return bytes(data)

    return serialize


def mixed_records(
    indexes: range, schema_id: int, version: int, serialize: Callable[[Any], bytes], parts: int
) -> list[Produced]:
    """Records ``indexes`` of :func:`tests.kits.avro_wire.value_bytes`: AvroSerializer's values,
    and every 16th record one of each odd kind (non-canonical, tombstone, empty, unframed,
    unknown schema id, trailing bytes, truncated)."""
    return [
        Produced(i % parts, f"k{i}".encode(), value_bytes(i, schema_id, version, serialize), (),
                 FIRST_MS + i)
        for i in indexes
    ]  # fmt: skip


def truth_table(bootstrap: str, topic: str, partitions: int) -> pa.Table:
    """Every record of ``topic`` as row-contract rows (by partition, offset)."""
    rows = [record_to_row(r.partition, r.record, r.timestamp_type) for r in
            consume_all(bootstrap, topic, partitions)]  # fmt: skip
    return pa.Table.from_pylist(rows, schema=ROW_ARROW_SCHEMA)


def decoder_of(typing: TopicTyping) -> TypedRows:
    """Core's decoder with the layout a new table gets from the subjects' versions now."""
    layout = build_layout(ROW_SCHEMA, ROW_SCHEMA.highest_field_id, typing.codecs, typing.registry)
    return TypedRows(layout, typing.codecs, typing.registry)


def coldset(lake: ResolvedLake, topic: str) -> Any:
    """The topic's table, loaded with PyIceberg."""
    return load_catalog(lake).load_table(lake.table_identifier(topic))


def sorted_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Rows as dicts, by partition then offset."""
    rows = table.to_pylist()
    return sorted(rows, key=lambda r: (r["kafka_partition"], r["kafka_offset"]))


class Forwarder:
    """A TCP forwarder on ``127.0.0.1:port`` to ``target``, started and stopped at will: a
    registry that goes away and comes back."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.port = port
        self.target = target
        self._server: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Listen and forward every connection."""
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(16)
        self._server = server
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop listening (connections in flight end by themselves)."""
        if self._server is not None:
            # close() alone leaves a thread blocked in accept() listening (Linux): one more
            # connection would get through; shutdown() wakes it up with an error.
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None
            if self._thread is not None:
                self._thread.join(timeout=5)

    def _accept(self) -> None:
        server = self._server
        assert server is not None
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
