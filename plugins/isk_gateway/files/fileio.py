"""In-memory PyIceberg files: an ``OutputFile`` that Avro writers fill, and an ``InputFile`` and
``FileIO`` over bytes fetched by key (so a table's files can be read without S3 or HTTP)."""

from __future__ import annotations

import io
from collections.abc import Callable

from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile, OutputStream
from pyiceberg.typedef import EMPTY_DICT, Properties

__all__ = ["BytesInputFile", "KeyFileIO", "MemoryOutputFile"]


class _KeptBytesIO(io.BytesIO):
    """A BytesIO whose ``close`` keeps the content (Avro writers close their stream)."""

    def close(self) -> None:
        """Keep the buffer readable: the writer closes it, the owner reads it afterwards."""

    def __enter__(self) -> _KeptBytesIO:
        return self


class BytesInputFile(InputFile):
    """An ``InputFile`` over bytes already in memory."""

    def __init__(self, location: str, data: bytes) -> None:
        super().__init__(location)
        self._data = data

    def __len__(self) -> int:
        return len(self._data)

    def exists(self) -> bool:
        return True

    def open(self, seekable: bool = True) -> InputStream:
        return io.BytesIO(self._data)


class MemoryOutputFile(OutputFile):
    """An ``OutputFile`` writing to memory; :meth:`getvalue` returns what was written."""

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self._stream: _KeptBytesIO | None = None

    def getvalue(self) -> bytes:
        if self._stream is None:
            return b""
        return self._stream.getvalue()

    def __len__(self) -> int:
        return len(self.getvalue())

    def exists(self) -> bool:
        return self._stream is not None

    def to_input_file(self) -> InputFile:
        return BytesInputFile(self.location, self.getvalue())

    def create(self, overwrite: bool = False) -> OutputStream:
        if self._stream is not None and not overwrite:
            raise FileExistsError(self.location)
        self._stream = _KeptBytesIO()
        return self._stream


class KeyFileIO(FileIO):
    """A read-only ``FileIO`` mapping ``s3://<bucket>/<key>`` locations to ``read(key)``."""

    def __init__(
        self, bucket: str, read: Callable[[str], bytes], properties: Properties = EMPTY_DICT
    ) -> None:
        super().__init__(properties)
        self._bucket = bucket
        self._read = read

    def _key(self, location: str) -> str:
        for scheme in ("s3://", "s3a://"):
            prefix = f"{scheme}{self._bucket}/"
            if location.startswith(prefix):
                return location[len(prefix) :]
        raise FileNotFoundError(location)

    def new_input(self, location: str) -> InputFile:
        return BytesInputFile(location, self._read(self._key(location)))

    def new_output(self, location: str) -> OutputFile:
        raise PermissionError(f"{location}: this FileIO is read-only")

    def delete(self, location: str | InputFile | OutputFile) -> None:
        raise PermissionError(f"{location}: this FileIO is read-only")
