"""Responses reach the client in request order, whatever mix of broker answers, short-circuits
and error responses produced them.

Each request that expects a response gets a :class:`~.connection_state.Slot` at the end of
``_slots``; a slot is filled when its response is ready, and the finished slots at the head are
written. A response cut through (see :mod:`.response_path`) is only ever the head's.
"""

from __future__ import annotations

import contextlib
import logging

from kio.static.protocol import ResponsePayload

from bergstream.core.proxy import codec
from bergstream.core.proxy.chain import CloseRequested
from bergstream.core.proxy.connection_state import ConnectionState, Slot
from bergstream.core.proxy.frames import Buffer, write_pieces


class ResponseOrder(ConnectionState):
    """Filling the client's response slots and writing the finished ones in order."""

    def _end_stream(self, out: list[Buffer] | None) -> None:
        """The cut-through response at the head is complete: release the slots behind it."""
        self._slots.popleft()
        if self._slots and self._slots[0].done:
            self._flush_slots(out)

    def _flush_slots(self, out: list[Buffer] | None = None) -> None:
        """Write every finished response at the head of the queue."""
        pieces = [] if out is None else out
        slots = self._slots
        while slots and slots[0].done:
            pieces.extend(slots.popleft().pieces)
        if out is None and pieces and self._client is not None:
            write_pieces(self._client, pieces)

    def _fill_slot(self, slot: Slot, response: ResponsePayload | None) -> None:
        """Put a filtered (or filter-made) response in its slot; None removes the slot."""
        if response is None:
            with contextlib.suppress(ValueError):
                self._slots.remove(slot)
        else:
            try:
                frame = codec.encode_response(slot.correlation_id, response)
            except codec.CodecError as error:
                raise CloseRequested(
                    f"a filter's response cannot be encoded: {error}", logging.ERROR
                ) from None
            self.stats.response(slot.api_key, len(frame))
            slot.pieces = [frame]
            slot.done = True
        self._flush_slots()
