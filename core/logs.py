"""Structured logs: every record says which component and which client it concerns.

``bergstream`` configures the root logger once (:func:`configure_logging`), as text for people or
as JSON lines for log pipelines. Each record carries:

- ``component``: ``proxy``, ``ksi``, ``isk``, ``pipeline``, ``cache``, ``index``, ``metrics``,
  ``runner``, ``stack``, ``cli`` ... taken from an explicit ``extra={"component": ...}`` or else
  derived from the logger's name (:func:`component_of`);
- ``client``: the peer (``host:port``, or a client id where known), ``-`` when none;
- ``virtual_cluster`` for proxy and filter lines.

Code logs as usual; a component that knows its client passes it through ``extra`` or a
:class:`logging.LoggerAdapter` (:class:`~bergstream.core.proxy.log.ProxyLogAdapter`,
:func:`component_log`).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import Any, Final, Literal, TextIO

LogFormat = Literal["text", "json"]
LOG_FORMATS: Final = ("text", "json")

#: Core's logger name prefixes and the component they belong to; plugins add theirs
#: (``register_log_components``, :func:`add_components`). The longest matching prefix wins.
COMPONENTS: dict[str, str] = {
    "bergstream.proxy": "proxy",
    "bergstream.core.proxy": "proxy",
    "bergstream.metrics": "metrics",
    "bergstream.core.metrics_http": "metrics",
    "bergstream.runner": "runner",
    "bergstream.core.runner": "runner",
    "bergstream.cli": "cli",
    "bergstream.core.cli": "cli",
    "aiohttp": "http",
    "aiokafka": "kafka-client",
    "pyiceberg": "iceberg",
}


def add_components(components: dict[str, str]) -> None:
    """Add logger prefixes and their components (what plugins register)."""
    COMPONENTS.update(components)


#: Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(
    vars(logging.LogRecord("n", logging.INFO, "p", 1, "m", None, None)).keys()
) | {"message", "asctime", "component", "client", "virtual_cluster"}


def component_of(logger_name: str) -> str:
    """The component a logger belongs to: the longest prefix in :data:`COMPONENTS`, else the
    logger's second name part (``bergstream.foo.bar`` is ``foo``) or its whole name."""
    best = ""
    for prefix in COMPONENTS:
        if (logger_name == prefix or logger_name.startswith(prefix + ".")) and len(prefix) > len(
            best
        ):
            best = prefix
    if best:
        return COMPONENTS[best]
    parts = logger_name.split(".")
    if parts[0] == "bergstream" and len(parts) > 1:
        return parts[-1] if parts[1] in ("core", "plugins") else parts[1]
    return logger_name or "root"


class ContextFilter(logging.Filter):
    """Gives every record ``component``, ``client`` and ``virtual_cluster`` attributes."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Fill in the missing context attributes; never drops a record."""
        if not getattr(record, "component", None):
            record.component = component_of(record.name)
        if not getattr(record, "client", None):
            record.client = "-"
        if not hasattr(record, "virtual_cluster"):
            record.virtual_cluster = None
        return True


class TextFormatter(logging.Formatter):
    """``TIME LEVEL component [client] message``; proxy and filter messages already start with
    ``[virtual_cluster client]`` (:class:`~bergstream.core.proxy.log.ProxyLogAdapter`), other
    records get ``[client]`` when they name one."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(component)s %(context)s%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """Render one record as a line of text."""
        client = getattr(record, "client", "-")
        named = client not in (None, "", "-") and not getattr(record, "virtual_cluster", None)
        record.context = f"[{client}] " if named else ""
        return super().format(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC, ISO 8601), ``level``, ``component``, ``client``,
    ``virtual_cluster`` (when set), ``logger``, ``message``, every other ``extra`` field, and
    ``exception`` with the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        """Render one record as a JSON line."""
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "component": getattr(record, "component", None) or component_of(record.name),
            "client": getattr(record, "client", None) or "-",
        }
        cluster = getattr(record, "virtual_cluster", None)
        if cluster:
            out["virtual_cluster"] = cluster
        out["logger"] = record.name
        out["message"] = record.getMessage()
        for key, value in vars(record).items():
            if key not in _STANDARD and key != "context" and key not in out:
                out[key] = value if isinstance(value, str | int | float | bool) else repr(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record is emitted (so a replaced stderr, as
    in click's test runner, never leaves the handler writing to a closed stream)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        """The current ``sys.stderr``."""
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        """Ignored: the stream is always the current ``sys.stderr``."""


def make_handler(fmt: LogFormat, stream: TextIO | None = None) -> logging.Handler:
    """A handler writing to ``stream`` (the current stderr by default) with the context filter
    and ``fmt``'s formatter."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"unknown log format {fmt!r}: use one of {', '.join(LOG_FORMATS)}")
    handler: logging.Handler = StderrHandler() if stream is None else logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.set_name("bergstream")
    return handler


#: Libraries whose debug lines are for their own developers: kept at INFO and above even under
#: ``-v``. numba logs each compiled kernel's bytecode, IR and SSA passes at DEBUG (megabytes per
#: kernel; a cold compilation of ISK's decoders took 29 s instead of 20 s with them on).
QUIET_LIBRARIES: Final = ("numba",)

#: Kafka clients whose debug lines trace the wire: every request and response, in full (a
#: metadata response names every partition of every topic). Shown by ``-vv`` only: ``-v`` keeps
#: them at INFO and above. An ISK gateway serving 40 loads and scans of a hotset table (on the
#: test stack's Kafka, which holds many topics) wrote 398 KB of them and used 15% more CPU
#: (5.32 s instead of 4.61 s) than without them, when its other lines came to 407 bytes.
CLIENT_TRACE_LIBRARIES: Final = ("aiokafka",)


def configure_logging(
    level: int,
    fmt: LogFormat = "text",
    stream: TextIO | None = None,
    *,
    trace_clients: bool = False,
) -> None:
    """Send every log record to stderr (or ``stream``) in ``fmt``, at ``level`` and above
    (the :data:`QUIET_LIBRARIES` at INFO and above, and the :data:`CLIENT_TRACE_LIBRARIES`
    too unless ``trace_clients``).

    Replaces the handler a previous call installed, so ``bergstream run`` can switch to the
    format its config file asks for after the command line set up text logging.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler.get_name() == "bergstream":
            root.removeHandler(handler)
            handler.close()
    root.addHandler(make_handler(fmt, stream))
    root.setLevel(level)
    for library in QUIET_LIBRARIES:
        logging.getLogger(library).setLevel(max(level, logging.INFO))
    for library in CLIENT_TRACE_LIBRARIES:
        logging.getLogger(library).setLevel(level if trace_clients else max(level, logging.INFO))


class ComponentAdapter(logging.LoggerAdapter[Any]):
    """Wraps a logger or adapter and tags its records with ``component`` (keeping the client
    and virtual cluster an inner :class:`~bergstream.core.proxy.log.ProxyLogAdapter` adds)."""

    def __init__(self, inner: logging.Logger | logging.LoggerAdapter[Any], component: str) -> None:
        super().__init__(inner, {"component": component})

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        """Add ``component`` to the record's extra fields."""
        kwargs["extra"] = {**kwargs.get("extra", {}), **(self.extra or {})}
        return msg, kwargs


def component_log(
    inner: logging.Logger | logging.LoggerAdapter[Any], component: str
) -> logging.LoggerAdapter[Any]:
    """``inner`` with its records tagged as ``component`` (e.g. a filter's ``context.log``)."""
    return ComponentAdapter(inner, component)
