"""What counting requests and bytes costs the proxy's pass-through path, per frame.

Small frames are the worst case (the counters cost the same per frame whatever its size): a
client pipelines small pass-through requests (ListGroups, which no filter decodes) through an
in-process proxy to a minimal broker answering each with a small response, once with the real
Prometheus counters and once with counters whose ``inc`` does nothing, alternating --rounds
times; the best of each is compared.

    .venv/bin/python bench/proxy_metrics_overhead.py [--requests 50000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import time
from typing import Any

from bergstream.core.config import VirtualClusterConfig
from bergstream.core.proxy import stats
from bergstream.core.proxy.server import ProxyServer
from bergstream.core.stack.ports import free_port_block

LIST_GROUPS = 16
WINDOW = 200


class _Nothing:
    """A counter child whose ``inc`` does nothing."""

    def inc(self, amount: float = 1) -> None:
        """Do nothing."""


class _Uncounted(stats.ClusterStats):
    """Cluster stats whose counters do nothing (the baseline)."""

    def api(self, api_key: int) -> stats.ApiStats:
        """Counters that count nothing."""
        found = self.by_key.get(api_key)
        if found is None:
            found = stats.ApiStats.__new__(stats.ApiStats)
            found.requests = found.request_bytes = found.response_bytes = _Nothing()  # type: ignore[assignment]
            self.by_key[api_key] = found
        return found


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


async def _run(name: str, broker_port: int, requests: int) -> float:
    port = free_port_block(2)
    cluster = VirtualClusterConfig.model_validate(
        {
            "name": name,
            "target": {"bootstrap": f"127.0.0.1:{broker_port}"},
            "gateway": {"host": "127.0.0.1", "port": port, "broker_count": 1},
        }
    )
    proxy = ProxyServer(cluster)
    await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        frames = [_request(i) for i in range(WINDOW)]
        start = time.perf_counter()
        for _ in range(requests // WINDOW):
            writer.write(b"".join(frames))
            await reader.readexactly(16 * WINDOW)
        elapsed = time.perf_counter() - start
        writer.close()
        return requests / elapsed
    finally:
        await proxy.stop()


async def main_async(requests: int, rounds: int) -> dict[str, Any]:
    """Alternate counted and uncounted runs; return the best rate of each."""
    broker = await asyncio.start_server(_broker, "127.0.0.1", 0)
    broker_port = broker.sockets[0].getsockname()[1]
    stats._clusters["uncounted"] = _Uncounted("uncounted")
    best = {"counted": 0.0, "uncounted": 0.0}
    for round_ in range(rounds):
        for mode in ("uncounted", "counted"):
            rate = await _run(mode, broker_port, requests)
            best[mode] = max(best[mode], rate)
            print(f"round {round_}: {mode:9s} {rate:10.0f} requests/s", flush=True)
    broker.close()
    per_request_us = (1 / best["counted"] - 1 / best["uncounted"]) * 1e6
    return {
        "requests_per_run": requests,
        "counted_rps": round(best["counted"]),
        "uncounted_rps": round(best["uncounted"]),
        "ratio": round(best["counted"] / best["uncounted"], 3),
        "cost_per_request_us": round(per_request_us, 2),
    }


def main() -> None:
    """Run the benchmark and print the figures (JSON on the last line)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    summary = asyncio.run(main_async(args.requests, args.rounds))
    print(
        f"counted {summary['counted_rps']} requests/s, uncounted {summary['uncounted_rps']} "
        f"requests/s, ratio {summary['ratio']:.3f}, "
        f"{summary['cost_per_request_us']} us per request and response"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
