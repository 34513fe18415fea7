"""Backpressure between a connection's two sockets: a full client transport pauses reading from
the broker and vice versa; a side with too many unhandled bytes stops being read.

Each side is paused for named reasons (``connecting``, ``backlog``, ``client-full``,
``upstream-full``) and read again only once every reason is resumed.
"""

from __future__ import annotations

from bergstream.core.proxy.connection_state import ConnectionState

#: Transport write-buffer limits: above HIGH the other side stops being read.
WRITE_HIGH = 4 * 1024 * 1024
WRITE_LOW = 1024 * 1024
#: Unprocessed bytes queued from one side before that side stops being read.
BACKLOG_LIMIT = 4 * 1024 * 1024


class FlowControl(ConnectionState):
    """Pausing and resuming the reading of each side of a connection."""

    def pause_client(self, reason: str) -> None:
        """Stop reading from the client until every pause reason is resumed."""
        if not self._client_pauses and self._client is not None:
            self._client.pause_reading()
        self._client_pauses.add(reason)

    def resume_client(self, reason: str) -> None:
        """Drop one pause reason; read from the client again when none is left."""
        if reason in self._client_pauses:
            self._client_pauses.discard(reason)
            if not self._client_pauses and self._client is not None and not self._closing:
                self._client.resume_reading()

    def _pause_upstream(self, reason: str) -> None:
        """Stop reading from the broker until every pause reason is resumed."""
        if not self._upstream_pauses and self._upstream is not None:
            self._upstream.pause_reading()
        self._upstream_pauses.add(reason)

    def _resume_upstream(self, reason: str) -> None:
        """Drop one pause reason; read from the broker again when none is left."""
        if reason in self._upstream_pauses:
            self._upstream_pauses.discard(reason)
            if not self._upstream_pauses and self._upstream is not None and not self._closing:
                self._upstream.resume_reading()

    def pause_writing(self) -> None:
        """The client's transport buffer is full: stop reading from the broker."""
        self._pause_upstream("client-full")

    def resume_writing(self) -> None:
        """The client's transport buffer drained."""
        self._resume_upstream("client-full")
