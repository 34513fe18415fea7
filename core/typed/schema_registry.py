"""A client of the Confluent Schema Registry REST API, shared by the pipeline, ISK and KSI.

Only the read side bergstream needs: a schema by its id (``GET /schemas/ids/{id}``) and every
version of a subject (``GET /subjects/{subject}/versions/...``). It speaks the plain Confluent
API, so any compatible registry works: Confluent, Karapace, Redpanda, Apicurio (its
``/apis/ccompat/v7``). Standard library only (``urllib.request`` and ``ssl``).

Errors tell a caller what to do: :class:`RegistryUnavailable` (refused, timed out, HTTP 5xx or
429) is worth retrying later; :class:`SchemaNotFound` (HTTP 404 with a registry error code) is a
definite answer; any other :class:`SchemaRegistryError` (credentials refused, a URL that is not a
registry, a certificate that does not verify) needs the settings fixed.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from bergstream.core.models import StrictModel

__all__ = [
    "RegisteredSchema",
    "RegistryUnavailable",
    "SchemaNotFound",
    "SchemaReference",
    "SchemaRegistryClient",
    "SchemaRegistryError",
    "SchemaRegistrySettings",
]

#: Confluent error codes of a 404 answer.
SUBJECT_NOT_FOUND = 40401
VERSION_NOT_FOUND = 40402
SCHEMA_NOT_FOUND = 40403

_ACCEPT = (
    "application/vnd.schemaregistry.v1+json, application/vnd.schemaregistry+json; q=0.9, "
    "application/json; q=0.5"
)
# Answers worth retrying: the registry is there but cannot answer now.
_RETRIABLE_STATUS = frozenset({408, 429})


@dataclass(frozen=True)
class SchemaReference:
    """A schema another schema imports: its ``name`` in the importing schema (an Avro full
    name, a JSON Schema URL, a .proto file name), found under ``subject`` at ``version``."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class RegisteredSchema:
    """One schema as the registry holds it."""

    schema_id: int
    #: ``AVRO`` (the registry leaves ``schemaType`` out for Avro), ``JSON`` or ``PROTOBUF``
    schema_type: str
    #: the schema text exactly as the registry returns it
    schema: str
    references: tuple[SchemaReference, ...] = ()
    #: set when read from a subject (:meth:`SchemaRegistryClient.subject_schemas`)
    subject: str | None = None
    version: int | None = None


class SchemaRegistryError(RuntimeError):
    """The registry could not give an answer: the base of the errors below. Raised as such for
    problems only a change of settings fixes (credentials, URL, certificate)."""


class RegistryUnavailable(SchemaRegistryError):
    """The registry did not answer now (refused, timed out, HTTP 5xx or 429): retry later."""


class SchemaNotFound(SchemaRegistryError):
    """The registry answered that the schema id, subject or version does not exist."""


class SchemaRegistrySettings(StrictModel):
    """Where the Schema Registry is and how to reach it (``codecs.schema_registry``)."""

    url: str = Field(
        description="base URL of the Confluent-compatible API, e.g. http://127.0.0.1:8081 or "
        "Apicurio's http://HOST:PORT/apis/ccompat/v7"
    )
    username: str | None = Field(None, description="basic-auth user; set with password")
    password: str | None = Field(None, repr=False, description="basic-auth password")
    ca_file: Path | None = Field(
        None, description="CA bundle (PEM) that verifies an https registry; system CAs if unset"
    )
    timeout_seconds: float = Field(
        10.0, gt=0, description="time allowed to connect and for each read of an answer"
    )
    subject_refresh_seconds: float = Field(
        30.0, ge=0, description="how long the versions of a subject are cached; 0 asks every time"
    )

    @field_validator("username", "password", "ca_file", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        # A ${VAR:-} whose variable is unset: one file serves registries with and without
        # credentials or a private CA.
        return None if value == "" else value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urllib.parse.urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"'{value}' is not an http(s) URL: write e.g. http://127.0.0.1:8081 (for "
                "Apicurio, http://HOST:PORT/apis/ccompat/v7)"
            )
        if parts.username is not None or parts.password is not None:
            raise ValueError(
                "the URL holds credentials: move them to username and password (the URL is "
                "shown in error messages and logs)"
            )
        if parts.query or parts.fragment:
            raise ValueError(f"'{value}' has a query or fragment: give the API's base URL only")
        return value.rstrip("/")

    @field_validator("ca_file")
    @classmethod
    def _ca_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"CA bundle '{value}' does not exist or is not a file")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SchemaRegistrySettings:
        if (self.username is None) != (self.password is None):
            raise ValueError("set both username and password for basic auth, or neither")
        if self.ca_file is not None and not self.url.startswith("https:"):
            raise ValueError(
                f"ca_file is set but the url {self.url} is not https: use an https URL or "
                "remove ca_file"
            )
        return self


class SchemaRegistryClient:
    """Reads schemas from a Schema Registry, with caches: a schema by id forever (ids are
    immutable), the versions of a subject for ``subject_refresh_seconds``.

    Thread-safe: concurrent callers asking for the same id or subject wait for one request.
    Picklable (the pipeline ships it to Spark's workers): a copy starts with empty caches.
    """

    def __init__(
        self, settings: SchemaRegistrySettings, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._base = settings.url.rstrip("/")
        self._ssl = (
            ssl.create_default_context(cafile=str(settings.ca_file))
            if settings.ca_file is not None
            else None
        )
        self._headers = {"Accept": _ACCEPT, "User-Agent": "bergstream"}
        if settings.username is not None and settings.password is not None:
            token = f"{settings.username}:{settings.password}".encode()
            self._headers["Authorization"] = "Basic " + base64.b64encode(token).decode("ascii")
        self._lock = threading.Lock()
        self._key_locks: dict[tuple[str, object], threading.Lock] = {}
        self._by_id: dict[int, RegisteredSchema] = {}
        # id -> when the registry said it does not exist (asked again after the refresh time)
        self._missing: dict[int, float] = {}
        # subject -> (when fetched, its versions ascending)
        self._subjects: dict[str, tuple[float, tuple[RegisteredSchema, ...]]] = {}

    @property
    def settings(self) -> SchemaRegistrySettings:
        """The settings this client was made with."""
        return self._settings

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self._settings}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["settings"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"SchemaRegistryClient({self._base!r})"

    # ----------------------------------------------------------------------------- lookups

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        """The schema registered under ``schema_id`` (``subject`` and ``version`` unset).

        Raises :class:`SchemaNotFound` if the registry has no such id (remembered for
        ``subject_refresh_seconds``), :class:`RegistryUnavailable` if it does not answer now.
        """
        found = self._by_id.get(schema_id)
        if found is not None:
            return found
        if schema_id < 0:  # a framing's id is an int32; the registry assigns ids >= 0
            raise SchemaNotFound(f"schema id {schema_id} is not in the registry at {self._base}")
        with self._key_lock("id", schema_id):
            found = self._by_id.get(schema_id)
            if found is not None:
                return found
            missed = self._missing.get(schema_id)
            if missed is not None and self._clock() - missed < self._refresh:
                raise SchemaNotFound(
                    f"schema id {schema_id} is not in the registry at {self._base}"
                )
            try:
                body = self._get(f"/schemas/ids/{schema_id}", {SCHEMA_NOT_FOUND})
            except SchemaNotFound:
                self._missing[schema_id] = self._clock()
                raise
            schema = _parse_schema(body, schema_id, self._base + f"/schemas/ids/{schema_id}")
            self._missing.pop(schema_id, None)
            self._by_id[schema_id] = schema
            return schema

    def subject_schemas(self, subject: str) -> list[RegisteredSchema]:
        """Every version of ``subject``, in ascending version order, with ``subject``,
        ``version`` and ``schema_id`` set; ``[]`` if the registry has no such subject.

        Cached for ``subject_refresh_seconds``; a refresh fetches only versions it has not
        seen, unless versions were deleted (then all are read again).
        """
        cached = self._subjects.get(subject)
        if cached is not None and self._clock() - cached[0] < self._refresh:
            return list(cached[1])
        with self._key_lock("subject", subject):
            cached = self._subjects.get(subject)
            now = self._clock()
            if cached is not None and now - cached[0] < self._refresh:
                return list(cached[1])
            versions = self._fetch_subject(subject, cached[1] if cached is not None else ())
            self._subjects[subject] = (now, versions)
            return list(versions)

    def forget_subject(self, subject: str) -> None:
        """Drop the cached versions of ``subject``, so the next :meth:`subject_schemas` asks the
        registry: for a caller that met a schema id its layout does not know (a version
        registered since the cache was filled)."""
        with self._key_lock("subject", subject):
            self._subjects.pop(subject, None)

    async def aschema_by_id(self, schema_id: int) -> RegisteredSchema:
        """:meth:`schema_by_id` for async code: a cached schema at once, else in a thread."""
        found = self._by_id.get(schema_id)
        if found is not None:
            return found
        return await asyncio.to_thread(self.schema_by_id, schema_id)

    async def asubject_schemas(self, subject: str) -> list[RegisteredSchema]:
        """:meth:`subject_schemas` for async code: fresh cached versions at once, else in a
        thread."""
        cached = self._subjects.get(subject)
        if cached is not None and self._clock() - cached[0] < self._refresh:
            return list(cached[1])
        return await asyncio.to_thread(self.subject_schemas, subject)

    # ---------------------------------------------------------------------------- internals

    @property
    def _refresh(self) -> float:
        return self._settings.subject_refresh_seconds

    def _key_lock(self, kind: str, key: object) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault((kind, key), threading.Lock())

    def _fetch_subject(
        self, subject: str, known: tuple[RegisteredSchema, ...]
    ) -> tuple[RegisteredSchema, ...]:
        quoted = urllib.parse.quote(subject, safe="")
        path = f"/subjects/{quoted}/versions"
        try:
            listed = self._get(path, {SUBJECT_NOT_FOUND})
        except SchemaNotFound:
            return ()
        if not isinstance(listed, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in listed
        ):
            raise SchemaRegistryError(
                f"Schema Registry at {self._base}: GET {path} answered {_short(listed)}, not a "
                "list of version numbers: is the url the registry's API base?"
            )
        wanted = sorted(set(listed))
        previous = {s.version: s for s in known}
        # Versions are immutable while they exist; a deleted one means the subject may have
        # been rebuilt, so everything is read again.
        reuse = previous if set(previous) <= set(wanted) else {}
        out: list[RegisteredSchema] = []
        for version in wanted:
            if version in reuse:
                out.append(reuse[version])
                continue
            version_path = f"{path}/{version}"
            try:
                body = self._get(version_path, {SUBJECT_NOT_FOUND, VERSION_NOT_FOUND})
            except SchemaNotFound:
                continue  # deleted between the listing and now
            schema = _parse_version(body, subject, version, self._base + version_path)
            out.append(schema)
            self._by_id.setdefault(schema.schema_id, replace(schema, subject=None, version=None))
        return tuple(out)

    def _get(self, path: str, not_found_codes: set[int]) -> Any:
        """GET ``path`` below the base URL and parse its JSON answer, mapping failures to the
        errors of this module; a 404 carrying one of ``not_found_codes`` is SchemaNotFound."""
        url = self._base + path
        request = urllib.request.Request(url, headers=self._headers, method="GET")
        timeout = self._settings.timeout_seconds
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self._ssl) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as error:
            raise self._http_error(url, error, not_found_codes) from None
        except urllib.error.URLError as error:
            raise self._connect_error(url, error.reason) from None
        except (OSError, http.client.HTTPException) as error:  # while reading the answer
            raise self._connect_error(url, error) from None
        try:
            return json.loads(raw)
        except ValueError:
            raise SchemaRegistryError(
                f"Schema Registry at {self._base}: GET {url} answered {_short(raw)}, not JSON: "
                "is the url the registry's API base?"
            ) from None

    def _http_error(
        self, url: str, error: urllib.error.HTTPError, not_found_codes: set[int]
    ) -> SchemaRegistryError:
        try:
            raw = error.read()
        except (OSError, http.client.HTTPException):
            raw = b""
        finally:
            error.close()
        code, message = _error_body(raw)
        said = f"HTTP {error.code}" + (
            f" (error {code}: {message})" if code else f": {_short(raw)}"
        )
        status = error.code
        if status >= 500 or status in _RETRIABLE_STATUS:
            return RegistryUnavailable(
                f"Schema Registry at {self._base} is unavailable: GET {url} answered {said}; "
                "retrying later"
            )
        if status == 404 and code in not_found_codes:
            return SchemaNotFound(f"Schema Registry at {self._base}: GET {url} answered {said}")
        if status == 404:
            return SchemaRegistryError(
                f"Schema Registry at {self._base}: GET {url} answered {said}, without a registry "
                "error code: the url is not the base of a Confluent-compatible API (for "
                "Apicurio, end it with /apis/ccompat/v7)"
            )
        if status in (401, 403):
            return SchemaRegistryError(
                f"Schema Registry at {self._base} refused the request: GET {url} answered "
                f"{said}: check codecs.schema_registry.username and password"
            )
        return SchemaRegistryError(f"Schema Registry at {self._base}: GET {url} answered {said}")

    def _connect_error(self, url: str, reason: object) -> SchemaRegistryError:
        if isinstance(reason, ssl.SSLCertVerificationError):
            return SchemaRegistryError(
                f"Schema Registry at {self._base}: the TLS certificate does not verify "
                f"({reason.verify_message or reason}): set codecs.schema_registry.ca_file to "
                "the CA bundle that signed it"
            )
        if isinstance(reason, ssl.SSLError):
            return SchemaRegistryError(
                f"Schema Registry at {self._base}: TLS failed ({reason}): check the url's scheme "
                "and port"
            )
        if isinstance(reason, TimeoutError):
            return RegistryUnavailable(
                f"Schema Registry at {self._base} is unavailable: GET {url} timed out after "
                f"{self._settings.timeout_seconds:g} s: check it is running and reachable, or "
                "raise codecs.schema_registry.timeout_seconds"
            )
        if isinstance(reason, ConnectionRefusedError):
            what = "connection refused"
        elif isinstance(reason, socket.gaierror):
            what = f"cannot resolve the host name ({reason.strerror})"
        else:
            what = str(reason) or type(reason).__name__
        return RegistryUnavailable(
            f"Schema Registry at {self._base} is unavailable: GET {url}: {what}: check it is "
            "running and reachable from here"
        )


def _error_body(raw: bytes) -> tuple[int | None, str]:
    """The Confluent ``{"error_code": N, "message": "..."}`` of an error answer, if any."""
    try:
        body = json.loads(raw)
    except ValueError:
        return None, ""
    if isinstance(body, dict) and isinstance(body.get("error_code"), int):
        return body["error_code"], str(body.get("message", ""))
    return None, ""


def _short(value: object, limit: int = 120) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else repr(value)
    text = " ".join(text.split())
    return repr(text[:limit] + ("..." if len(text) > limit else "")) if text else "nothing"


def _parse_references(body: dict[str, Any], where: str) -> tuple[SchemaReference, ...]:
    refs = body.get("references") or []
    try:
        return tuple(
            SchemaReference(
                name=str(r["name"]), subject=str(r["subject"]), version=int(r["version"])
            )
            for r in refs
        )
    except (KeyError, TypeError, ValueError):
        raise SchemaRegistryError(
            f"{where} answered references {_short(refs)}: each needs name, subject and version"
        ) from None


def _parse_schema(body: Any, schema_id: int, where: str) -> RegisteredSchema:
    if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
        raise SchemaRegistryError(f"{where} answered {_short(body)}, with no schema text")
    return RegisteredSchema(
        schema_id=schema_id,
        schema_type=str(body.get("schemaType") or "AVRO").upper(),
        schema=body["schema"],
        references=_parse_references(body, where),
    )


def _parse_version(body: Any, subject: str, version: int, where: str) -> RegisteredSchema:
    if not isinstance(body, dict) or not isinstance(body.get("id"), int):
        raise SchemaRegistryError(f"{where} answered {_short(body)}, with no schema id")
    schema = _parse_schema(body, body["id"], where)
    return replace(schema, subject=subject, version=version)
