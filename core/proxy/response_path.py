"""Broker to client: cutting the broker's bytes into response frames and delivering each.

A response no filter wants is cut through: its 8-byte prefix is rewritten back to the client's
correlation id and its body forwarded chunk by chunk, as views of the received bytes, without
ever being assembled. Only frames some filter asked for are buffered whole and decoded with kio;
while one is with the filters, the client responses behind it are set aside whole and handled in
order afterwards. The response to an out-of-band request (see :mod:`.out_of_band`) resolves its
sender's future instead.
"""

from __future__ import annotations

from bergstream.core.proxy import codec
from bergstream.core.proxy.chain import CloseRequested
from bergstream.core.proxy.connection_state import Pending
from bergstream.core.proxy.flow_control import BACKLOG_LIMIT, FlowControl
from bergstream.core.proxy.frames import (
    RESPONSE_PEEK_SIZE,
    Buffer,
    ChunkedBuffer,
    FrameError,
    check_length,
    drop_prefix,
    response_prefix,
    write_pieces,
)
from bergstream.core.proxy.out_of_band import RequestDropped
from bergstream.core.proxy.response_order import ResponseOrder
from bergstream.core.proxy.versions import api_name

#: Responses come from the trusted broker: only a negative length is refused.
MAX_RESPONSE_BYTES = 2**31 - 1


class ResponsePath(ResponseOrder, FlowControl):
    """The broker's responses: cut through, delivered raw, or run down the filter chain."""

    def upstream_data(self, data: bytes) -> None:
        """Bytes from the broker: continue a cut-through frame, then parse the rest."""
        if self._closing:
            return
        left = self._stream_left
        if left:
            client = self._client
            assert client is not None
            size = len(data)
            if size <= left:
                client.write(data)
                self._stream_left = left - size
                if size == left:
                    self._end_stream(None)
                return
            view = memoryview(data)
            client.write(view[:left])
            data = view[left:]  # type: ignore[assignment]
            self._stream_left = 0
            self._end_stream(None)
        self._resp_q.append(data)
        self._pump_responses()

    def _pump_responses(self) -> None:
        """Deliver the complete (or cut-through) response frames queued from the broker.

        While a response is being filtered, later client responses are set aside whole
        (``_deferred``) and handled in order afterwards, but out-of-band responses are always
        handled at once: a filter awaiting one in ``on_response`` must not wait for itself.
        """
        queue = self._resp_q
        out: list[Buffer] = []
        slots = self._slots
        counters = self.stats.by_key
        try:
            while self._deferred and not self._resp_busy and not self._closing:
                pending, views = self._deferred.popleft()
                self._deferred_bytes -= sum(len(view) for view in views)
                self._deliver_buffered(pending, views, out)
            while not self._closing and not self._stream_left:
                size = len(queue)
                if size < 8:
                    if size >= 4:
                        check_length(queue.peek_int32(), MAX_RESPONSE_BYTES, RESPONSE_PEEK_SIZE)
                    break
                length = queue.peek_int32()
                check_length(length, MAX_RESPONSE_BYTES, RESPONSE_PEEK_SIZE)
                upstream_id = queue.peek_int32(4)
                pending = self._inflight.get(upstream_id)
                if pending is None:
                    raise FrameError(f"response with unknown correlation id {upstream_id}")
                slot = pending.slot
                if (
                    slot is not None
                    and not pending.filters
                    and not self._resp_busy
                    and slots
                    and slots[0] is slot
                ):
                    # Cut through: forward the body as it arrives.
                    del self._inflight[upstream_id]
                    api_key = pending.api_key
                    api = counters.get(api_key) or self.stats.api(api_key)
                    api.response_bytes += length + 4
                    queue.skip(8)
                    body = length - 4
                    views = queue.take_views(body)
                    out.append(response_prefix(length, slot.correlation_id))
                    out.extend(views)
                    body -= sum(len(view) for view in views)
                    if body:
                        self._stream_left = body
                        break
                    self._end_stream(out)
                    continue
                if size < 4 + length:
                    break
                del self._inflight[upstream_id]
                queue.skip(4)
                if pending.future is not None:
                    message = queue.take(length)
                    if not pending.future.done():  # else the caller gave up (timeout)
                        self._spawn(self._filter_response(pending, message))
                elif self._resp_busy:
                    self._deferred.append((pending, queue.take_views(length)))
                    self._deferred_bytes += length
                else:
                    self._deliver_buffered(pending, queue.take_views(length), out)
        except FrameError as error:
            self.close(f"bad response from the broker: {error}")
            return
        if out and self._client is not None:
            write_pieces(self._client, out)
        # What is left in the queue is at most one incomplete frame, which must be read whole:
        # only complete frames set aside behind a busy filter count as backlog.
        if self._deferred_bytes > BACKLOG_LIMIT:
            self._pause_upstream("backlog")
        else:
            self._resume_upstream("backlog")

    def _deliver_buffered(
        self, pending: Pending, views: list[memoryview], out: list[Buffer]
    ) -> None:
        """Deliver a whole client response: raw if no filter needs it, else via a task.

        The response stays a list of views of the received chunks: a frame that needs no
        decoding (e.g. a Fetch v16+ response without node endpoints) is never joined.
        """
        slot = pending.slot
        assert slot is not None
        length = sum(len(view) for view in views)
        if not pending.filters or self._chain.raw_allowed(
            pending.filters,
            pending.api_key,
            pending.api_version,
            views[0] if len(views) == 1 else ChunkedBuffer(views),
        ):
            slot.pieces = [response_prefix(length, slot.correlation_id), *drop_prefix(views, 4)]
            slot.done = True
            self.stats.response(pending.api_key, length + 4)
            self._flush_slots(out)
            return
        message = views[0] if len(views) == 1 else b"".join(views)
        self._resp_busy = True
        self._spawn(self._process_response(pending, message))

    async def _process_response(self, pending: Pending, message: Buffer) -> None:
        """Filter one client response, then go on with the responses queued behind it."""
        try:
            await self._filter_response(pending, message)
        finally:
            self._resp_busy = False
        if not self._closing:
            self._pump_responses()

    async def _filter_response(self, pending: Pending, message: Buffer) -> None:
        """Decode a response, run its filters, deliver it to the client slot or the caller."""
        future = pending.future
        try:
            await self._decode_and_filter(pending, message)
        except BaseException as error:
            if future is not None and not future.done():  # the caller must not wait in vain
                reason = error.reason if isinstance(error, CloseRequested) else repr(error)
                future.set_exception(ConnectionError(reason))
            raise

    async def _decode_and_filter(self, pending: Pending, message: Buffer) -> None:
        """Decode a response and run it down its filters (undecodable ones pass as bytes)."""
        what = f"{api_name(pending.api_key)} v{pending.api_version} response"
        future, slot = pending.future, pending.slot
        try:
            _, response = codec.decode_response(pending.api_key, pending.api_version, message)
        except codec.UnsupportedMessage as error:
            self.log.debug("passing a %s through undecoded: %s", what, error)
            if future is not None:
                if not future.done():
                    future.set_exception(codec.UnsupportedMessage(str(error)))
            elif slot is not None:
                slot.pieces = [response_prefix(len(message), slot.correlation_id), message[4:]]
                slot.done = True
                self.stats.response(pending.api_key, len(message) + 4)
                self._flush_slots()
            return
        except codec.MalformedMessage as error:
            raise CloseRequested(f"undecodable {what} from the broker: {error}") from None
        assert pending.header is not None
        result = await self._chain.run_response(pending.filters, pending.header, response)
        if future is not None:
            if not future.done():
                if result is None:
                    future.set_exception(RequestDropped(f"a filter dropped the {what}"))
                else:
                    future.set_result(result)
        elif slot is not None:
            self._fill_slot(slot, result)
