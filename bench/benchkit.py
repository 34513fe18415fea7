"""What the benchmarks share: topics and load made with Kafka's own tools from the stack's jars.

Benchmarks run as scripts (`python bench/NAME.py`), so this module is imported from bench/.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bergstream.devstack.stack import kafka_tool_command


def create_topic(kafka: str, topic: str, partitions: int) -> None:
    """Create ``topic`` directly on Kafka with ``partitions`` partitions."""
    subprocess.run(
        kafka_tool_command(
            "topics",
            "--bootstrap-server",
            kafka,
            "--create",
            "--topic",
            topic,
            "--partitions",
            str(partitions),
            "--replication-factor",
            "1",
        ),
        check=True,
        capture_output=True,
        timeout=60,
    )


def perf_produce(bootstrap: str, topic: str, records: int, size: int, *props: str) -> float:
    """Produce ``records`` values of ``size`` bytes with Kafka's ProducerPerformance (acks=1,
    batched; ``props`` adds producer properties) and return its MB/s."""
    out = subprocess.run(
        kafka_tool_command(
            "producer-perf-test",
            "--topic",
            topic,
            "--num-records",
            str(records),
            "--record-size",
            str(size),
            "--throughput",
            "-1",
            "--producer-props",
            f"bootstrap.servers={bootstrap}",
            "acks=1",
            "linger.ms=20",
            "batch.size=524288",
            *props,
        ),
        check=True,
        capture_output=True,
        text=True,
        timeout=1800,
    ).stdout
    final = [line for line in out.splitlines() if "records sent" in line][-1]
    found = re.search(r"\(([\d.]+) MB/sec\)", final)
    if found is None:
        raise RuntimeError(f"producer-perf-test printed no MB/sec:\n{out}")
    return float(found.group(1))


def stop_process(process: subprocess.Popen[Any] | None) -> None:
    """End a server the bench started (``bergstream run``): SIGTERM, then SIGKILL after 30 s."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def remove_workdir(workdir: Path, keep: bool) -> None:
    """Delete the bench's work directory, or say where it is kept (``--keep``)."""
    if keep:
        print(f"kept {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def timed(function: Callable[[], object]) -> tuple[float, float]:
    """Call ``function`` once; return its (wall, CPU) seconds, CPU counting every thread of
    this process."""
    wall, cpu = time.perf_counter(), time.process_time()
    function()
    return time.perf_counter() - wall, time.process_time() - cpu


def synthesis_vs_write_table(
    records: bytes, partition: int, repeat: int = 3, compression: str = "snappy"
) -> dict[str, float]:
    """ISK's synthesis of a hotset data file as the gateway does it (Kafka record batches ->
    Arrow -> Parquet: ``records_to_table`` then ``parquet_layout``) of one partition's
    ``records`` against a plain ``pq.write_table`` of the same rows (already decoded), same
    compression, each the median of ``repeat`` runs.

    MB count the record batch bytes given to synthesis; ``*_cpu_mb_s`` divide by the process's
    CPU seconds instead of wall seconds, so they are per core and less sensitive to other load.
    """
    import pyarrow.parquet as pq

    from bergstream.plugins.isk_gateway.files.hotset_layout import parquet_layout
    from bergstream.plugins.isk_gateway.files.synthesis import records_to_table

    table = records_to_table(records, partition)
    megabytes = len(records) / 1e6

    def synthesis() -> None:
        parquet_layout(records_to_table(records, partition), compression)

    def write_table() -> None:
        pq.write_table(table, io.BytesIO(), compression=compression)

    runs = {name: [timed(f) for _ in range(repeat)] for name, f in (
        ("synthesis", synthesis), ("write_table", write_table)
    )}  # fmt: skip
    wall = {name: statistics.median(w for w, _ in times) for name, times in runs.items()}
    cpu = {name: statistics.median(c for _, c in times) for name, times in runs.items()}
    return {
        "rows": table.num_rows,
        "input_mb": round(megabytes, 1),
        "synthesis_s": round(wall["synthesis"], 3),
        "synthesis_mb_s": round(megabytes / wall["synthesis"], 1),
        "synthesis_cpu_mb_s": round(megabytes / max(cpu["synthesis"], 1e-9), 1),
        "write_table_s": round(wall["write_table"], 3),
        "write_table_mb_s": round(megabytes / wall["write_table"], 1),
        "write_table_cpu_mb_s": round(megabytes / max(cpu["write_table"], 1e-9), 1),
        "synthesis_vs_write_table": round(wall["write_table"] / wall["synthesis"], 3),
    }


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used so far."""
    used = process_faults_and_times(pid)
    return used["proc_user_seconds"] + used["proc_system_seconds"]


def process_faults_and_times(pid: int) -> dict[str, float]:
    """Process ``pid``'s minor page faults and user and system CPU seconds so far (every
    thread), as ``proc_minor_faults``, ``proc_user_seconds``, ``proc_system_seconds``: a fresh
    buffer's first write costs a page fault per page, system time a bench should see."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {
        "proc_minor_faults": float(fields[7]),
        "proc_user_seconds": int(fields[11]) / ticks,
        "proc_system_seconds": int(fields[12]) / ticks,
    }


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return "unknown"


def machine_facts() -> dict[str, Any]:
    """What makes the same code faster or slower on another machine, for a bench to print
    beside its figures: CPU model and the vector extensions the kernels and Arrow use, cores,
    load, memory, transparent huge pages, what writing fresh memory costs against memory
    written before, the allocator Arrow uses, numba's cache (first use compiles, later ones
    load), the versions of Python, pyarrow and numba."""
    import platform

    import pyarrow as pa

    cpuinfo = _read("/proc/cpuinfo")
    model = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
         if line.startswith("model name")),
        platform.processor() or "unknown",
    )  # fmt: skip
    flags_line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    flags = set(flags_line.split(":", 1)[1].split()) if flags_line else set()
    wanted = ("sse4_2", "avx", "avx2", "bmi2", "fma", "avx512f", "avx512bw", "avx512vl")
    mhz = [
        float(line.split(":", 1)[1]) for line in cpuinfo.splitlines() if line.startswith("cpu MHz")
    ]
    meminfo = {
        line.split(":")[0]: line.split(":")[1].strip()
        for line in _read("/proc/meminfo").splitlines()
        if ":" in line
    }
    numba_dir = Path(
        os.environ.get("NUMBA_CACHE_DIR")
        or Path(os.environ.get("BERGSTREAM_CACHE", Path.home() / ".cache" / "bergstream")) / "numba"
    )
    numba_files = list(numba_dir.rglob("*.nbc")) if numba_dir.is_dir() else []
    try:
        import numba

        numba_version = numba.__version__
    except ImportError:
        numba_version = "absent"
    return {
        "sha256_64mb_s": _single_core_probe(),
        "cpu_steal_percent_1s": _steal_percent(),
        "cpu_model": model,
        "cpu_flags": sorted(f for f in wanted if f in flags),
        "cpu_mhz_now": round(statistics.mean(mhz)) if mhz else None,
        "cores": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "memory_total": meminfo.get("MemTotal", "unknown"),
        "memory_available": meminfo.get("MemAvailable", "unknown"),
        "transparent_hugepages": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
        **_memory_touch_probe(),
        "arrow_memory_pool": pa.default_memory_pool().backend_name,
        "arrow_simd_level": pa.runtime_info().simd_level,
        "arrow_detected_simd": pa.runtime_info().detected_simd_level,
        "numba": numba_version,
        "numba_cached_kernels": len(numba_files),
        "python": platform.python_version(),
        "pyarrow": pa.__version__,
        "kernel": platform.release(),
    }


def _memory_touch_probe(size: int = 512 << 20) -> dict[str, float]:
    """Seconds per GiB to write ``size`` bytes of memory this process never touched
    (``fresh_memory_write_s_per_gib``: page faults, the kernel clearing pages, and on a VM
    whose host reclaims freed guest memory a host fault too), and to write the same memory
    again (``touched_memory_write_s_per_gib``). Measured here: 2.5 s against 0.10 s on a
    Firecracker VM with free page reporting; a machine without it clears fresh pages at
    several GiB/s."""
    import mmap

    import numpy as np

    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        pages = np.frombuffer(region, dtype=np.uint8)
        times = []
        for value in (1, 2):
            started = time.perf_counter()
            pages[:] = value
            times.append((time.perf_counter() - started) * (1 << 30) / size)
        del pages
    finally:
        region.close()
    return {
        "fresh_memory_write_s_per_gib": round(times[0], 3),
        "touched_memory_write_s_per_gib": round(times[1], 3),
    }


def _single_core_probe() -> float:
    """Seconds one core takes to hash 64 MB (SHA-256, best of three): the same figure on two
    machines says their cores are alike, whatever the model names say."""
    import hashlib

    data = bytes(64 * 2**20)
    times = []
    for _ in range(3):
        began = time.perf_counter()
        hashlib.sha256(data).digest()
        times.append(time.perf_counter() - began)
    return round(min(times), 4)


def _steal_percent(seconds: float = 1.0) -> float:
    """The share of CPU time the hypervisor gave to others over ``seconds`` (``steal`` in
    /proc/stat): a shared machine's noise, visible."""

    def sample() -> tuple[int, int]:
        fields = [int(v) for v in _read("/proc/stat").splitlines()[0].split()[1:]]
        return sum(fields), fields[7] if len(fields) > 7 else 0

    total_before, steal_before = sample()
    time.sleep(seconds)
    total_after, steal_after = sample()
    return round(100 * (steal_after - steal_before) / max(total_after - total_before, 1), 1)
