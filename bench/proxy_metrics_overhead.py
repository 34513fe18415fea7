"""What counting requests and bytes costs the proxy's pass-through path, per frame.

Small frames are the worst case (counting costs the same per frame whatever its size), so:

1. a client pipelines small pass-through requests (ListGroups, which no filter decodes) through
   an in-process proxy to a minimal broker answering each with a small response: the time per
   request and response of the whole loop (client, proxy and broker on one core), an upper
   bound of what the proxy spends per frame pair;
2. the exact counting the proxy does per request and response (a dict lookup and integer
   additions on :class:`~bergstream.core.proxy.stats.ApiStats`), timed alone, and for
   comparison the same with a ``Counter.inc`` per count, as a direct instrumentation would do;
3. the counting's share of the per-request time.

    .venv/bin/python bench/proxy_metrics_overhead.py [--requests 50000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import time
import timeit
from typing import Any

from bergstream.core.api import ApiKey
from bergstream.core.config import VirtualClusterConfig
from bergstream.core.proxy.server import ProxyServer
from bergstream.core.proxy.stats import cluster_stats
from bergstream.devstack.stack.ports import free_port_block

# A plain int, as the proxy reads the key off the wire (an IntEnum key makes each lookup slower).
LIST_GROUPS = int(ApiKey.LIST_GROUPS)
WINDOW = 200


async def _broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer every request frame with a 16-byte response carrying its correlation id."""
    try:
        while True:
            (length,) = struct.unpack(">i", await reader.readexactly(4))
            message = await reader.readexactly(length)
            (correlation_id,) = struct.unpack_from(">i", message, 4)
            # ListGroups v4 response: header v1 (tagged fields), throttle, error, groups, tags
            writer.write(struct.pack(">iib", 12, correlation_id, 0) + bytes(7))
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def _request(correlation_id: int) -> bytes:
    # ListGroups v4: header v2 (client id "bench", no tags), states_filter empty, no tags
    body = struct.pack(">hhih", LIST_GROUPS, 4, correlation_id, 5) + b"bench" + b"\x00\x01\x00"
    return struct.pack(">i", len(body)) + body


async def _round_trips(broker_port: int, requests: int) -> float:
    """Requests per second through a pass-through proxy."""
    port = free_port_block(2)
    cluster = VirtualClusterConfig.model_validate(
        {
            "name": "bench",
            "target": {"bootstrap": f"127.0.0.1:{broker_port}"},
            "gateway": {"host": "127.0.0.1", "port": port, "broker_count": 1},
        }
    )
    proxy = ProxyServer(cluster)
    await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        frames = b"".join(_request(i) for i in range(WINDOW))
        start = time.perf_counter()
        for _ in range(requests // WINDOW):
            writer.write(frames)
            await reader.readexactly(16 * WINDOW)
        elapsed = time.perf_counter() - start
        writer.close()
        return requests / elapsed
    finally:
        await proxy.stop()


def _counting_ns() -> tuple[float, float]:
    """Nanoseconds per request and response of the proxy's counting, and of direct
    ``Counter.inc`` calls doing the same."""
    stats = cluster_stats("bench-micro")
    by_key = stats.by_key
    stats.api(LIST_GROUPS)
    counters = by_key[LIST_GROUPS]._counters

    def counted() -> None:  # what ProxyConnection does per request and per response
        api = by_key.get(LIST_GROUPS) or stats.api(LIST_GROUPS)
        api.requests += 1
        api.request_bytes += 20
        api = by_key.get(LIST_GROUPS) or stats.api(LIST_GROUPS)
        api.response_bytes += 16

    def direct() -> None:
        counters[0].inc()
        counters[1].inc(20)
        counters[2].inc(16)

    def empty() -> None:
        pass

    number = 500_000
    base = min(timeit.repeat(empty, number=number, repeat=5))
    return tuple(  # type: ignore[return-value]
        (min(timeit.repeat(f, number=number, repeat=5)) - base) / number * 1e9
        for f in (counted, direct)
    )


async def main_async(requests: int, rounds: int) -> dict[str, Any]:
    """Measure the loop, then the counting; return the figures."""
    broker = await asyncio.start_server(_broker, "127.0.0.1", 0)
    broker_port = broker.sockets[0].getsockname()[1]
    best = 0.0
    for round_ in range(rounds):
        rate = await _round_trips(broker_port, requests)
        best = max(best, rate)
        print(f"round {round_}: {rate:10.0f} requests/s through the proxy", flush=True)
    broker.close()
    counted_ns, direct_ns = _counting_ns()
    per_request_ns = 1e9 / best
    return {
        "requests_per_run": requests,
        "requests_per_s": round(best),
        "ns_per_request_and_response": round(per_request_ns),
        "counting_ns": round(counted_ns),
        "direct_counter_inc_ns": round(direct_ns),
        "counting_share": round(counted_ns / per_request_ns, 4),
    }


def main() -> None:
    """Run the benchmark and print the figures (JSON on the last line)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    summary = asyncio.run(main_async(args.requests, args.rounds))
    print(
        f"{summary['requests_per_s']} requests/s: {summary['ns_per_request_and_response']} ns "
        f"per request and response (client, proxy and broker); counting costs "
        f"{summary['counting_ns']} ns of it ({summary['counting_share']:.2%}); direct "
        f"Counter.inc calls would cost {summary['direct_counter_inc_ns']} ns"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
