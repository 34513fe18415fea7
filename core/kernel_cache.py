"""``cached_njit``: ``numba.njit`` with an on-disk cache that goes stale when any module the
compiled function can take code or constants from changes, not only its own file.

Why: numba's on-disk cache (``cache=True``) checks one stamp before reusing a compiled
function: a digest of the file that defines it (numba 0.68: the SHA-256 of its bytes; earlier
versions: its modification time and size). A kernel also compiles in the helpers it calls
(``inline="always"`` ones, and the others LLVM inlines) and freezes the module-level constants
it reads (opcodes, record batch offsets), all from other modules. After editing such a module
the kernel's cache still matches its own file, so numba keeps running the old code; a note
asking to touch the kernel's file by hand does not even help once the stamp is a content hash.

How: :func:`cached_njit` compiles with numba's own cache machinery, but the cache's locator
(where the cache files live, the stamp) is a subclass of numba's whose stamp is
:func:`source_digest`: the SHA-256 of the source of the defining module and of every module it
imports, transitively, within its own top-level package and ``bergstream`` (found by reading
the imports with ``ast``: module level, inside functions, relative ones). A name imported from
``bergstream.core.api`` counts as the module that name comes from (``api.pyi`` names it;
its own imports would tie every kernel to all of core). Changing any of those sources changes
the stamp, so numba recompiles on the next run and overwrites the stale entries. Over-counting
a dependency costs a recompilation, never a wrong result. ``tests/unit/test_kernel_cache.py``
checks the mechanism and that no module of the repository uses ``cache=True`` directly.

Where: ``$BERGSTREAM_CACHE/numba/<module>-<digest>`` (default ``~/.cache/bergstream``), the
module's import name and the first 16 hex digits of its :func:`source_digest`, unless
``NUMBA_CACHE_DIR`` is set (then numba's own rule). Keyed on names and digests rather than on
the source's folder (numba's ``__pycache__``), one compilation serves every checkout, virtual
environment and process of the same sources: a fresh clone (CI) or a new install reuses what an
earlier one compiled. Measured here on the value codec, ISK file and KSI unit tests (536 tests,
one process): 283 CPU-s with every kernel compiled, 145 CPU-s with the cache filled. Versions
of a module coexist (their digests differ), so switching between checkouts never recompiles
back and forth; a cache folder of an old version is dead weight until the cache is cleared.

Importing this module imports numba; core's public module exposes ``cached_njit`` lazily.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba
from numba.core import caching, config

from bergstream.core.home import bergstream_cache

__all__ = ["cached_njit", "dependencies", "shared_cache_dir", "source_digest"]

_API = "bergstream.core.api"


def cached_njit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit(cache=True, **options)``, its cache keyed on :func:`source_digest` of the
    function's file instead of that file alone (see the module docstring)."""
    if "cache" in options:
        raise TypeError("cached_njit always caches: do not pass cache=")

    def compile_cached(func: Callable[..., Any]) -> Any:
        dispatcher = numba.njit(**options)(func)
        # What Dispatcher.enable_caching() does, with the cache class keyed on dependencies.
        dispatcher._cache = _DependencyCache(func)
        return dispatcher

    return compile_cached


@functools.cache
def source_digest(path: str | Path) -> bytes:
    """SHA-256 over the sources of the module at ``path`` and of :func:`dependencies` (once per
    process and module: every kernel of a module shares it, and sources are read once)."""
    digest = hashlib.sha256()
    for file in (Path(path).resolve(), *dependencies(path)):
        digest.update(str(file.name).encode() + b"\0" + _read(file) + b"\0")
    return digest.digest()


def dependencies(path: str | Path) -> tuple[Path, ...]:
    """The source files the module at ``path`` imports, transitively, within its top-level
    package and ``bergstream`` (sorted; without ``path`` itself)."""
    start = Path(path).resolve()
    module = _module_of(start)
    roots = {"bergstream", module.split(".")[0]} if module else {"bergstream"}
    seen: dict[Path, None] = {}
    pending = [(start, module)]
    while pending:
        file, name = pending.pop()
        for imported in _imports(file, name):
            if imported.split(".")[0] not in roots:
                continue
            found = _file_of(imported)
            if found is not None and found != start and found not in seen:
                seen[found] = None
                pending.append((found, imported))
    return tuple(sorted(seen))


@functools.cache
def _read(file: Path) -> bytes:
    return file.read_bytes()


@functools.cache
def _module_of(file: Path) -> str | None:
    """The import name of a loaded module whose file is ``file``, if any."""
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        # Resolving every loaded module's path costs a tenth of a second: compare names first.
        if origin and Path(origin).name == file.name and Path(origin).resolve() == file:
            return name
    return None


@functools.cache
def _file_of(module: str) -> Path | None:
    """The source file of ``module`` (None: not found, or not a Python source file), found
    without importing anything: a loaded module's file, else a file in its package's folder."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        origin = getattr(loaded, "__file__", None)
        return Path(origin).resolve() if origin and origin.endswith(".py") else None
    parent, _, last = module.rpartition(".")
    if not parent:
        return None
    loaded_parent = sys.modules.get(parent)
    if loaded_parent is not None:
        folders = [Path(folder) for folder in getattr(loaded_parent, "__path__", ())]
    else:
        parent_file = _file_of(parent)
        folders = [parent_file.parent] if parent_file and parent_file.name == "__init__.py" else []
    for folder in folders:
        for candidate in (folder / f"{last}.py", folder / last / "__init__.py"):
            if candidate.is_file():
                return candidate.resolve()
    return None


@functools.cache
def _api_origins() -> dict[str, str]:
    """Each name ``bergstream.core.api`` exports, with the module it comes from: the imports of
    ``core/api.pyi``, relative to ``bergstream.core``, from which the module loads each name."""
    api = _file_of(_API)
    if api is None:
        return {}
    stub = api.with_suffix(".pyi")
    if not stub.is_file():
        return {}
    core = _API.rpartition(".")[0]
    origins: dict[str, str] = {}
    for node in ast.walk(ast.parse(_read(stub))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            base = f"{core}.{node.module}" if node.module else core
            for alias in node.names:
                origins.setdefault(alias.asname or alias.name, _submodule(base, alias.name))
    return origins


def _submodule(package: str, name: str) -> str:
    """``package.name`` when that is a module, else ``package``."""
    candidate = f"{package}.{name}"
    return candidate if _file_of(candidate) is not None else package


def _imports(file: Path, module: str | None) -> list[str]:
    """The modules ``file`` (module ``module``) imports."""
    is_package = file.name == "__init__.py"
    found: list[str] = []
    for node in ast.walk(ast.parse(_read(file))):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, is_package)
            if base is None:
                continue
            for alias in node.names:
                if base == _API:
                    found.append(_api_origins().get(alias.name, _API))
                else:
                    found.append(_submodule(base, alias.name))
    return found


def _absolute(node: ast.ImportFrom, module: str | None, is_package: bool) -> str | None:
    """The absolute module a ``from ... import`` reads from (None: relative, module unknown)."""
    if not node.level:
        return node.module or ""
    if module is None:
        return None
    anchor = module.split(".") if is_package else module.split(".")[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join([*anchor, node.module] if node.module else anchor)


def _stamped(locator: type) -> type:
    """A subclass of numba's cache locator ``locator`` whose stamp is :func:`source_digest`."""

    def get_source_stamp(self: Any) -> Any:
        own = locator.get_source_stamp(self)
        py_file = getattr(self, "_py_file", None)
        return (own, source_digest(py_file)) if py_file else own

    return type(f"Dependency{locator.__name__}", (locator,), {"get_source_stamp": get_source_stamp})


def shared_cache_dir() -> Path:
    """``$BERGSTREAM_CACHE/numba``: where compiled kernels are kept."""
    return bergstream_cache() / "numba"


class _SharedCacheLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):  # type: ignore[misc]
    """Cache files of a function in ``shared_cache_dir()/<module>-<digest>`` (module docstring);
    none when ``NUMBA_CACHE_DIR`` is set or the folder cannot be written."""

    def __init__(self, py_func: Callable[..., Any], py_file: str) -> None:
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        digest = source_digest(py_file).hex()[:16]
        self._cache_path = str(shared_cache_dir() / f"{py_func.__module__}-{digest}")

    def get_cache_path(self) -> str:
        return self._cache_path

    @classmethod
    def from_function(cls, py_func: Callable[..., Any], py_file: str) -> Any:
        if config.CACHE_DIR or not getattr(py_func, "__module__", None):
            return None
        return super().from_function(py_func, py_file)


class _DependencyCacheImpl(caching.CompileResultCacheImpl):  # type: ignore[misc]
    _locator_classes = [
        _stamped(cls)
        for cls in (_SharedCacheLocator, *caching.CompileResultCacheImpl._locator_classes)
    ]


class _DependencyCache(caching.FunctionCache):  # type: ignore[misc]
    """numba's function cache, its stamp covering the function's dependencies."""

    _impl_class = _DependencyCacheImpl
