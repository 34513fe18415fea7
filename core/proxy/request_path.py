"""Client to broker: cutting the client's bytes into request frames and sending each upstream.

Hot path: a request whose API key no filter wants is forwarded as bytes, only its 8-byte header
prefix rewritten (the proxy numbers upstream correlation ids itself, so out-of-band requests never
collide with the client's). A request some filter wants is decoded with kio and run up the
filter chain by a task; the requests behind it wait in the queue until it is done, so the broker
gets them in the client's order.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from kio.schema.request_header.v2 import RequestHeader as RequestHeaderV2
from kio.static.protocol import RequestHeader, RequestPayload

from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy import codec
from bergstream.core.proxy.chain import CloseRequested, Outcome
from bergstream.core.proxy.connection_state import Pending, Slot
from bergstream.core.proxy.flow_control import BACKLOG_LIMIT, FlowControl
from bergstream.core.proxy.frames import (
    REQUEST_PEEK_SIZE,
    Buffer,
    FrameError,
    peek_request,
    peek_request_header,
    produce_acks,
    request_prefix,
    take_frame,
    write_pieces,
)
from bergstream.core.proxy.log import ProxyLogAdapter
from bergstream.core.proxy.response_order import ResponseOrder
from bergstream.core.proxy.sasl_relay import SaslRelay

# Read once: on Python 3.11 each ``ApiKey.PRODUCE`` costs an enum lookup (~65 ns), and the
# pass-through path compares every request's key with it.
_PRODUCE = ApiKey.PRODUCE
_SASL_HANDSHAKE = ApiKey.SASL_HANDSHAKE


def encode_request(header: RequestHeader, request: RequestPayload) -> bytes:
    """A filtered request as a frame; a request that cannot be encoded closes the connection."""
    try:
        return codec.encode_request(header, request)
    except codec.CodecError as error:
        raise CloseRequested(
            f"cannot encode the filtered request: {error}", logging.ERROR
        ) from None


class RequestPath(SaslRelay, ResponseOrder, FlowControl):
    """The client's requests: framing, raw forwarding and the filter chain upwards."""

    def data_received(self, data: bytes) -> None:
        """Bytes from the client."""
        if self._closing:
            return
        self._req_q.append(data)
        if self._req_busy or self._upstream is None:
            if len(self._req_q) > BACKLOG_LIMIT:
                self.pause_client("backlog")
            return
        self._pump_requests()

    def _pump_requests(self) -> None:
        """Forward every complete request frame; hand the first one a filter wants to a task."""
        queue = self._req_q
        out: list[Buffer] = []
        counters = self.stats.by_key
        try:
            while not self._req_busy and not self._closing:
                message = take_frame(queue, self._max_frame, REQUEST_PEEK_SIZE)
                if message is None:
                    break
                api_key, api_version, correlation_id = peek_request(message)
                if self.client_id is None:
                    self._learn_client_id(message)
                if (api_key == _SASL_HANDSHAKE or not self._sasl_idle.is_set()) and (
                    not self._sasl_request(api_key, api_version)
                ):
                    return
                api = counters.get(api_key) or self.stats.api(api_key)
                api.requests += 1
                api.request_bytes += len(message) + 4
                if api_key in self._chain.request_keys:
                    self._req_busy = True
                    self._spawn(self._process_request(message))
                    break
                self._forward_raw(message, api_key, api_version, correlation_id, out)
        except FrameError as error:
            self.close(f"malformed request frame: {error}")
            return
        if out and self._upstream is not None:
            write_pieces(self._upstream, out)
        # Not busy: the queue holds at most one incomplete frame, which must be read whole.
        if not self._req_busy or len(queue) <= BACKLOG_LIMIT:
            self.resume_client("backlog")

    def _learn_client_id(self, message: Buffer) -> None:
        """Tag this connection's log lines with the client.id of its first request."""
        try:
            self.client_id = peek_request_header(message).client_id or ""
        except FrameError:
            self.client_id = ""  # the frame's own handling reports what is wrong with it
        if self.client_id:
            self.log = ProxyLogAdapter(self.cluster.name, self.client_address, self.client_id)
            self._chain.log = self.log
            self.log.debug("client.id is %r", self.client_id)

    def _header_for_filters(
        self, message: Buffer, api_key: int, api_version: int
    ) -> RequestHeader | None:
        """The request header response filters get; None when the response will be opaque."""
        try:
            return codec.decode_request_header(message)[0]
        except codec.UnsupportedMessage:
            if api_key != ApiKey.API_VERSIONS:
                return None
            # A newer ApiVersions than kio knows: the broker answers in v0, which we can cap.
            peek = peek_request_header(message)
            return RequestHeaderV2(
                request_api_key=api_key,  # type: ignore[arg-type]
                request_api_version=api_version,  # type: ignore[arg-type]
                correlation_id=peek.correlation_id,  # type: ignore[arg-type]
                client_id=peek.client_id,
            )
        except codec.MalformedMessage as error:
            raise FrameError(str(error)) from None

    def _forward_raw(
        self,
        message: Buffer,
        api_key: int,
        api_version: int,
        correlation_id: int,
        out: list[Buffer],
    ) -> None:
        """Send a request upstream as bytes, under a new correlation id."""
        upstream_id = self._new_correlation_id()
        if api_key != _PRODUCE or produce_acks(message, api_version) != 0:
            slot = Slot(correlation_id, api_key)
            self._slots.append(slot)
            filters = self._chain.response_filters(api_key, api_version)
            header = None
            if filters:
                header = self._header_for_filters(message, api_key, api_version)
                if header is None:
                    filters = ()
            self._inflight[upstream_id] = Pending(slot, api_key, api_version, header, filters)
        out.append(request_prefix(len(message), api_key, api_version, upstream_id))
        out.append(message[REQUEST_PEEK_SIZE:])

    async def _process_request(self, message: Buffer) -> None:
        """Decode a request some filter wants, run the chain, act on the outcome."""
        try:
            try:
                header, request = codec.decode_request(message)
            except codec.UnsupportedMessage as error:
                self.log.debug("passing a request through undecoded: %s", error)
                out: list[Buffer] = []
                self._forward_raw(message, *peek_request(message), out)
                if self._upstream is not None:
                    write_pieces(self._upstream, out)
                return
            except codec.MalformedMessage as error:
                raise CloseRequested(f"malformed request a filter asked for: {error}") from None
            outcome = await self._chain.run_request(0, header, request)
            await self._complete_client_request(header, outcome)
        except FrameError as error:
            raise CloseRequested(f"malformed request frame: {error}") from None
        finally:
            self._req_busy = False
        if not self._closing:
            self._pump_requests()

    async def _complete_client_request(self, header: RequestHeader, outcome: Outcome) -> None:
        """Act on the chain's outcome: forward the request, drop it, or answer it here."""
        api_key = header.request_api_key
        expects_response = api_key != ApiKey.PRODUCE or outcome.request.acks != 0
        if outcome.kind == "forward":
            upstream_id = self._new_correlation_id()
            sent = replace(header, correlation_id=upstream_id)
            frame = encode_request(sent, outcome.request)
            if expects_response:
                slot = Slot(header.correlation_id, api_key)
                self._slots.append(slot)
                filters = self._chain.response_filters(api_key, header.request_api_version)
                self._inflight[upstream_id] = Pending(
                    slot, api_key, header.request_api_version, header, filters
                )
            if self._upstream is not None:
                self._upstream.write(frame)
            return
        if outcome.kind == "drop" or not expects_response:
            return
        slot = Slot(header.correlation_id, api_key)
        self._slots.append(slot)
        filters = tuple(
            i
            for i in self._chain.response_filters(api_key, header.request_api_version)
            if i < outcome.index
        )
        response = await self._chain.run_response(filters, header, outcome.response)
        self._fill_slot(slot, response)
