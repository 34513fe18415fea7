"""Which row of a state table holds each key: the index both writers of row-level deletes use.

A state table (:mod:`bergstream.core.current_state`) is a set of Parquet data files plus Iceberg
*position deletes*: files of ``(file_path, pos)`` pairs naming rows that no longer count. To
replace or delete a key's row, a writer must know where that row is: :class:`StateIndex` holds,
for every live row, its identity, its data file, its position in that file and its Kafka
partition. The pipeline keeps one per state table while it runs, to write the deletes of each
micro-batch; ISK builds one per state table snapshot, to write the deletes that hide rows the
records not yet in the lake replace.

Position deletes, not equality deletes: every engine bergstream is tested with reads them
(PyIceberg 0.12 does not read equality deletes), and a reader applies them without a join.
Lookups are Arrow hash probes (``is_in`` / ``index_in``) over the live identities: a batch of
keys against a million live rows takes tens of milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "POSITION_DELETE_SCHEMA",
    "DeletedPositions",
    "FileRowsCache",
    "StateFileRows",
    "StateIndex",
    "StateSnapshot",
    "deleted_positions",
    "log_rows_between",
    "merge_deleted",
    "position_deletes_table",
    "read_state_snapshot",
]

#: Iceberg's reserved field ids of a position delete file's columns.
_FILE_PATH_ID = 2147483546
_POS_ID = 2147483545

#: The Arrow schema of a position delete file (field ids as Parquet metadata).
POSITION_DELETE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.large_string(), False, {b"PARQUET:field_id": str(_FILE_PATH_ID)}),
        pa.field("pos", pa.int64(), False, {b"PARQUET:field_id": str(_POS_ID)}),
    ]
)

#: Deleted positions per data file path.
DeletedPositions = Mapping[str, np.ndarray]


def position_deletes_table(deleted: DeletedPositions) -> pa.Table:
    """A position delete file's rows for ``deleted``, sorted by path then position as the
    Iceberg spec asks (each file's positions deduplicated)."""
    paths = sorted(p for p in deleted if len(deleted[p]))
    positions = [np.unique(np.asarray(deleted[p], dtype=np.int64)) for p in paths]
    counts = np.array([len(p) for p in positions], dtype=np.int64)
    codes = np.repeat(np.arange(len(paths), dtype=np.int32), counts)
    dictionary = pa.array(paths, pa.large_string())
    file_path = pa.DictionaryArray.from_arrays(pa.array(codes), dictionary).cast(pa.large_string())
    pos = np.concatenate(positions) if positions else np.empty(0, dtype=np.int64)
    return pa.Table.from_arrays(
        [file_path, pa.array(pos, pa.int64())], schema=POSITION_DELETE_SCHEMA
    )


@dataclass(frozen=True)
class StateFileRows:
    """Every row of one state data file, in file order: identity and Kafka partition."""

    path: str
    identities: pa.Array  # large_binary
    partitions: np.ndarray  # int32

    @property
    def rows(self) -> int:
        """How many rows the file has."""
        return len(self.identities)


@dataclass
class StateIndex:
    """The live rows of a state table: identity, file, position and partition of each.

    Built from the table's data files and the positions its delete files delete
    (:meth:`build`); :meth:`replaced` tells where the rows of given keys are, and
    :meth:`with_changes` gives the index after a commit."""

    #: Data file paths; ``files[i]`` is the file of rows with ``file_index == i``.
    files: list[str] = field(default_factory=list)
    #: Rows in each file (live or not), by file index.
    file_rows: list[int] = field(default_factory=list)
    ids: pa.Array = field(default_factory=lambda: pa.array([], pa.large_binary()))
    file_index: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    positions: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    partitions: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    #: Positions deleted by the table's delete files, per data file path.
    deleted: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def build(cls, files: Iterable[StateFileRows], deleted: DeletedPositions) -> StateIndex:
        """The index of data files ``files`` (each with every row) minus ``deleted``."""
        index = cls()
        id_chunks: list[pa.Array] = []
        file_chunks, position_chunks, partition_chunks = [], [], []
        for number, rows in enumerate(files):
            index.files.append(rows.path)
            index.file_rows.append(rows.rows)
            live = np.ones(rows.rows, dtype=bool)
            gone = deleted.get(rows.path)
            if gone is not None and len(gone):
                live[np.asarray(gone, dtype=np.int64)[np.asarray(gone) < rows.rows]] = False
                index.deleted[rows.path] = np.unique(np.asarray(gone, dtype=np.int64))
            where = np.flatnonzero(live)
            id_chunks.append(rows.identities.take(pa.array(where, pa.int64())))
            file_chunks.append(np.full(len(where), number, dtype=np.int32))
            position_chunks.append(where.astype(np.int64))
            partition_chunks.append(np.asarray(rows.partitions, dtype=np.int32)[where])
        if id_chunks:
            index.ids = pa.concat_arrays([pc.cast(c, pa.large_binary()) for c in id_chunks])
            index.file_index = np.concatenate(file_chunks)
            index.positions = np.concatenate(position_chunks)
            index.partitions = np.concatenate(partition_chunks)
        return index

    @property
    def live_rows(self) -> int:
        """How many rows are live."""
        return len(self.ids)

    def probe(self, distinct: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """The live rows whose identity is among ``distinct`` (identities without repeats, such
        as the keys a batch of changes touches), and for each, the index of its identity in
        ``distinct``. The live rows are probed against a hash of ``distinct`` (far fewer than
        the live rows), so no hash of every live row is built per call."""
        if not len(distinct) or not self.live_rows:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        at = pc.index_in(self.ids, value_set=pc.cast(distinct, pa.large_binary()))
        hit = np.asarray(at.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        return np.flatnonzero(hit), at.filter(pa.array(hit)).to_numpy().astype(np.int64)

    def by_file(self, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Positions per data file of the live rows ``rows`` (indexes into the live rows; all
        of them for None): what a delete file must name to remove them."""
        if rows is None:
            rows = np.arange(self.live_rows)
        out: dict[str, np.ndarray] = {}
        if not len(rows):
            return out
        files = self.file_index[rows]
        positions = self.positions[rows]
        for number in np.unique(files):
            out[self.files[int(number)]] = np.sort(positions[files == number])
        return out

    def all_deleted(self, more: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """The table's own deleted positions, with ``more`` (per path) added."""
        out = {path: positions for path, positions in self.deleted.items()}
        for path, positions in (more or {}).items():
            if path in out:
                out[path] = np.union1d(out[path], positions)
            else:
                out[path] = np.unique(np.asarray(positions, dtype=np.int64))
        return out

    def with_changes(
        self, removed: Mapping[str, np.ndarray], added: StateFileRows | None
    ) -> StateIndex:
        """The index after a commit that deleted the positions ``removed`` (per data file path)
        and added the data file ``added``."""
        keep = np.ones(self.live_rows, dtype=bool)
        numbers = {path: number for number, path in enumerate(self.files)}
        deleted = dict(self.deleted)
        for path, positions in removed.items():
            number = numbers.get(path)
            if number is None:
                continue
            hit = (self.file_index == number) & np.isin(self.positions, positions)
            keep &= ~hit
            deleted[path] = np.union1d(deleted.get(path, np.empty(0, np.int64)), positions)
        where = np.flatnonzero(keep)
        out = StateIndex(
            files=list(self.files),
            file_rows=list(self.file_rows),
            ids=self.ids.take(pa.array(where, pa.int64())),
            file_index=self.file_index[where],
            positions=self.positions[where],
            partitions=self.partitions[where],
            deleted=deleted,
        )
        if added is not None and added.rows:
            number = len(out.files)
            out.files.append(added.path)
            out.file_rows.append(added.rows)
            out.ids = pa.concat_arrays([out.ids, pc.cast(added.identities, pa.large_binary())])
            out.file_index = np.concatenate(
                [out.file_index, np.full(added.rows, number, dtype=np.int32)]
            )
            out.positions = np.concatenate([out.positions, np.arange(added.rows, dtype=np.int64)])
            out.partitions = np.concatenate(
                [out.partitions, np.asarray(added.partitions, dtype=np.int32)]
            )
        return out


#: Reads one data file's rows for the index: (path) -> its rows.
ReadFileRows = Callable[[str], StateFileRows]


def merge_deleted(parts: Sequence[DeletedPositions]) -> dict[str, np.ndarray]:
    """Several delete files' positions, per data file path, joined."""
    out: dict[str, list[np.ndarray]] = {}
    for part in parts:
        for path, positions in part.items():
            out.setdefault(path, []).append(np.asarray(positions, dtype=np.int64))
    return {path: np.unique(np.concatenate(chunks)) for path, chunks in out.items()}


def deleted_positions(table: pa.Table) -> dict[str, np.ndarray]:
    """The positions a position delete file's rows (``file_path``, ``pos``) delete, per path."""
    if not table.num_rows:
        return {}
    paths = table.column("file_path").combine_chunks().dictionary_encode()
    positions = table.column("pos").combine_chunks().to_numpy(zero_copy_only=False)
    codes = paths.indices.to_numpy(zero_copy_only=False)
    out: dict[str, np.ndarray] = {}
    for code, path in enumerate(paths.dictionary.to_pylist()):
        out[str(path)] = np.unique(positions[codes == code])
    return out


class FileRowsCache:
    """The rows each state data file holds (identity and partition), kept by path: data files
    never change, so a file is read once however many snapshots list it. Bounded by rows."""

    def __init__(self, max_rows: int = 5_000_000) -> None:
        self.max_rows = max_rows
        self._files: dict[str, StateFileRows] = {}
        self._rows = 0

    def get(self, path: str, read: ReadFileRows) -> StateFileRows:
        """The rows of ``path``, read with ``read`` unless kept."""
        found = self._files.pop(path, None)
        if found is None:
            found = read(path)
            self._rows += found.rows
        self._files[path] = found  # newest last
        while self._rows > self.max_rows and len(self._files) > 1:
            oldest = next(iter(self._files))
            self._rows -= self._files.pop(oldest).rows
        return found


@dataclass(frozen=True)
class StateSnapshot:
    """A state table's snapshot as writers of deletes need it: its live data and delete files
    (PyIceberg ``DataFile``\\ s) and the index of its live rows."""

    snapshot_id: int | None
    data_files: list[Any]
    delete_files: list[Any]
    index: StateIndex


def read_state_snapshot(
    table: Any,
    identity_of: Callable[[pa.Table], pa.Array],
    identity_columns: Sequence[str],
    cache: FileRowsCache | None = None,
    snapshot_id: int | None = None,
) -> StateSnapshot:
    """The data and delete files of a state table's snapshot (PyIceberg ``Table``; the current
    one unless ``snapshot_id``) and the index of its live rows. Each data file's identity
    columns are read (``identity_columns``, turned into identities by ``identity_of``) once per
    ``cache``; its position delete files every time (they are small, and maintenance removes
    them)."""
    import pyarrow.parquet as pq
    from pyiceberg.manifest import DataFileContent

    snapshot = table.snapshot_by_id(snapshot_id) if snapshot_id else table.current_snapshot()
    if snapshot is None:
        return StateSnapshot(None, [], [], StateIndex())
    io = table.io
    columns = sorted({*identity_columns, "kafka_partition"})

    def read(path: str) -> StateFileRows:
        with io.new_input(path).open() as stream:
            names = pq.read_schema(stream).names
        with io.new_input(path).open() as stream:
            rows = pq.read_table(stream, columns=[c for c in columns if c in names])
        for name in columns:
            if name not in rows.column_names:
                rows = rows.append_column(name, pa.nulls(rows.num_rows))
        partitions = rows.column("kafka_partition").to_numpy(zero_copy_only=False)
        return StateFileRows(path, identity_of(rows), np.asarray(partitions, dtype=np.int32))

    cache = cache or FileRowsCache()
    data_files: list[Any] = []
    delete_files: dict[str, Any] = {}
    for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files():
        data_files.append(task.file)
        for delete in task.delete_files:
            if delete.content != DataFileContent.POSITION_DELETES:
                raise ValueError(
                    f"state table {'.'.join(table.name())} has an equality delete file "
                    f"({delete.file_path}); bergstream writes and reads position deletes only: "
                    "rewrite the table's deletes (`bergstream pipeline maintain`)"
                )
            delete_files.setdefault(delete.file_path, delete)
    parts = []
    for path in sorted(delete_files):
        with io.new_input(path).open() as stream:
            parts.append(deleted_positions(pq.read_table(stream, columns=["file_path", "pos"])))
    data_files.sort(key=lambda f: f.file_path)
    rows = [cache.get(file.file_path, read) for file in data_files]
    index = StateIndex.build(rows, merge_deleted(parts))
    return StateSnapshot(
        snapshot.snapshot_id, data_files, [delete_files[p] for p in sorted(delete_files)], index
    )


def log_rows_between(log: Any, start: Mapping[int, int], end: Mapping[int, int]) -> pa.Table:
    """The rows of a log table (PyIceberg ``Table``, its current snapshot) with offsets in
    ``[start[p], end[p])`` for each partition ``p`` of ``end`` (from offset 0 where ``start``
    has no ``p``), read with the table's partition values and offset bounds pruning its files;
    in the table's current schema."""
    from functools import reduce

    from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan, Or

    from bergstream.core.typed.row_contract import arrow_type

    parts = [
        And(
            EqualTo("kafka_partition", partition),
            And(
                GreaterThanOrEqual("kafka_offset", start.get(partition, 0)),
                LessThan("kafka_offset", stop),
            ),
        )
        for partition, stop in sorted(end.items())
        if stop > start.get(partition, 0)
    ]
    if not parts:
        return arrow_type(log.schema()).empty_table()
    return log.scan(row_filter=reduce(Or, parts)).to_arrow()
