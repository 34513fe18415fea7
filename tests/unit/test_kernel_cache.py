"""``cached_njit``: a compiled function's on-disk cache goes stale when a module it imports
changes (numba alone keys it on the defining file), and no module of the repository caches
compiled code any other way."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bergstream.core.kernel_cache import dependencies, source_digest

ROOT = Path(__file__).resolve().parents[2]

_HELPER = """
from bergstream.core.api import cached_njit

FACTOR = {factor}


@cached_njit(inline="always")
def scale(value):
    return value * FACTOR
"""

_KERNEL = """
import numba

from bergstream.core.api import cached_njit
from {package}.helper import scale


@cached_njit()
def kernel(value):
    return scale(value) + 1


@numba.njit(cache=True)
def plain(value):
    return scale(value) + 1
"""

_RUN = "from {package}.kernel import kernel, plain; print(kernel(10), plain(10))"


def _package(tmp_path: Path, factor: int) -> str:
    package = tmp_path / "kc_demo"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text(_HELPER.format(factor=factor))
    (package / "kernel.py").write_text(_KERNEL.format(package="kc_demo"))
    return "kc_demo"


def _run(tmp_path: Path, package: str, cache: Path | None = None) -> list[int]:
    return [int(word) for word in _execute(tmp_path, package, cache).stdout.split()]


def _execute(
    where: Path, package: str, cache: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    cache = cache or where / "cache"
    environment = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    return subprocess.run(
        [sys.executable, "-c", _RUN.format(package=package)],
        cwd=where,
        capture_output=True,
        text=True,
        check=True,
        env={**environment, "BERGSTREAM_CACHE": str(cache), **env},
    )


def test_a_changed_dependency_recompiles_what_numba_alone_would_not(tmp_path: Path) -> None:
    package = _package(tmp_path, factor=2)
    assert _run(tmp_path, package) == [21, 21]
    assert list((tmp_path / "cache" / "numba").glob("kc_demo.kernel-*/kernel.kernel-*.nbi"))
    _package(tmp_path, factor=3)  # only the helper changes
    kernel, plain = _run(tmp_path, package)
    assert kernel == 31  # recompiled: the stamp covers helper.py
    assert plain == 21  # numba's own cache (the reason for cached_njit) returns the old code


def test_another_checkout_of_the_same_sources_reuses_the_compiled_kernel(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    package = _package(first, factor=2)
    shared = tmp_path / "cache"
    assert _run(first, package, shared) == [21, 21]
    shutil.copytree(first / package, second / package, ignore=shutil.ignore_patterns("__py*"))
    again = _execute(second, package, shared, NUMBA_DEBUG_CACHE="1")
    assert again.stdout.split()[-2:] == ["21", "21"]
    # numba's debug lines: the kernel loaded from the shared folder; nothing saved again there
    lines = again.stdout.splitlines()
    assert any("data loaded from" in line and str(shared) in line for line in lines), lines
    assert not any("data saved to" in line and str(shared) in line for line in lines), lines


def test_the_digest_follows_imports_and_the_public_api(tmp_path: Path) -> None:
    package = _package(tmp_path, factor=2)
    sys.path.insert(0, str(tmp_path))
    try:
        __import__(f"{package}.kernel")
        kernel = tmp_path / package / "kernel.py"
        found = {path.name for path in dependencies(kernel)}
        # helper.py, and the module cached_njit comes from (not all of core.api's imports)
        assert {"helper.py", "kernel_cache.py"} <= found
        assert "api.py" not in found and "config.py" not in found
        before = source_digest(kernel)
        assert source_digest(kernel) == before
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name.startswith(package)]:
            del sys.modules[name]


def test_the_kernels_depend_on_what_they_inline() -> None:
    import bergstream.plugins.isk_gateway.files.batch_kernels as isk
    import bergstream.plugins.value_codecs.avro.decode_kernel as avro

    found = {path.relative_to(ROOT).as_posix() for path in dependencies(avro.__file__)}
    assert {
        "plugins/value_codecs/shared/kernel_read.py",
        "plugins/value_codecs/shared/arena_kernel.py",
        "plugins/value_codecs/shared/arena_layout.py",
        "plugins/value_codecs/shared/decimal128.py",
        "plugins/value_codecs/avro/ops.py",
        "core/varints.py",
        "core/byte_copy.py",
    } <= found
    isk_found = {path.relative_to(ROOT).as_posix() for path in dependencies(isk.__file__)}
    assert {"core/varints.py", "core/kafka_wire/record_batch.py"} <= isk_found


def test_no_module_caches_compiled_code_by_the_file_alone() -> None:
    """Every on-disk cached numba function goes through cached_njit."""
    offenders = []
    for folder in ("core", "plugins", "pipeline", "devstack", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                called = getattr(node, "func", None)
                name = getattr(called, "attr", None) or getattr(called, "id", None)
                if (
                    isinstance(node, ast.Call)
                    and name in ("jit", "njit")
                    and any(
                        keyword.arg == "cache"
                        and not (
                            isinstance(keyword.value, ast.Constant) and not keyword.value.value
                        )
                        for keyword in node.keywords
                    )
                ):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == [], "use cached_njit: " + ", ".join(offenders)
