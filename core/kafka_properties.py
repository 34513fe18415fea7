"""Kafka client properties files as people have them: Java's ``client.properties`` (the syntax of
``java.util.Properties``) and librdkafka's (``key=value`` lines, a subset of it), read into plain
``key -> value`` pairs; and the JAAS line of Java's ``sasl.jaas.config`` read into its login
module and options.

Nothing here decides what a key means to bergstream (:mod:`bergstream.core.kafka_client` does);
this module only reads the two formats exactly as the clients that own them do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "KERBEROS_LOGIN_MODULE",
    "OAUTH_LOGIN_MODULE",
    "PASSWORD_LOGIN_MODULES",
    "REFUSED_KEYS",
    "ClientFileError",
    "JaasConfig",
    "JaasSyntaxError",
    "PropertiesSyntaxError",
    "jaas_credentials",
    "parse_jaas_config",
    "parse_properties",
]

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """``(first line number, logical line)``: natural lines joined where one ends in an odd
    number of backslashes (the next one's leading whitespace dropped), comments and blank lines
    skipped."""
    out: list[tuple[int, str]] = []
    natural = text.splitlines()
    index = 0
    while index < len(natural):
        number = index + 1
        line = natural[index].lstrip(" \t\f")
        index += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line) and index < len(natural):
            line = line[:-1] + natural[index].lstrip(" \t\f")
            index += 1
        if _continues(line):
            line = line[:-1]
        out.append((number, line))
    return out


def _continues(line: str) -> bool:
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _unescape(text: str) -> str:
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char != "\\" or index + 1 == len(text):
            out.append(char)
            index += 1
            continue
        nxt = text[index + 1]
        if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[index + 2 : index + 6]):
            out.append(chr(int(text[index + 2 : index + 6], 16)))
            index += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        index += 2
    return "".join(out)


def parse_properties(text: str) -> dict[str, tuple[int, str]]:
    """Every ``key -> (line, value)`` of a properties file, as ``java.util.Properties.load``
    reads it: ``key=value``, ``key: value`` or ``key value``, ``#`` and ``!`` comments, lines
    continued by a trailing backslash, ``\\t``, ``\\n``, ``\\uXXXX`` and ``\\x`` escapes; a key
    given twice keeps its last value; trailing blanks of a value dropped; a bare word with no
    value is :class:`PropertiesSyntaxError`. A librdkafka file (``key=value``) reads the same."""
    found: dict[str, tuple[int, str]] = {}
    for number, line in _logical_lines(text):
        key_end = len(line)
        index = 0
        while index < len(line):
            char = line[index]
            if char == "\\":
                index += 2
                continue
            if char in "=: \t\f":
                key_end = index
                break
            index += 1
        key = _unescape(line[:key_end])
        rest = line[key_end:].lstrip(" \t\f")
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(" \t\f")
        elif not rest and "." not in key:
            # Java would read a key with an empty value; no client key is a bare word.
            raise PropertiesSyntaxError(number)
        # Trailing blanks (Java keeps them) are a copy-and-paste accident in every client key.
        found[key] = (number, _unescape(rest).rstrip(" \t\f"))
    return found


class PropertiesSyntaxError(ValueError):
    """A line of a properties file that is no ``key=value`` (the line is not quoted: it may
    hold a password)."""

    def __init__(self, line: int) -> None:
        super().__init__(f"line {line}: expected key=value")
        self.line = line


class JaasSyntaxError(ValueError):
    """A ``sasl.jaas.config`` value that is not ``LoginModule flag key=value ... ;``."""


@dataclass(frozen=True)
class JaasConfig:
    """One JAAS login module entry: its class, control flag and options."""

    login_module: str
    flag: str
    options: dict[str, str]

    @property
    def module_name(self) -> str:
        """The class's simple name (``PlainLoginModule``)."""
        return self.login_module.rsplit(".", 1)[-1]


_TOKEN = re.compile(
    r'\s*(?:(?P<quoted>"(?:[^"\\]|\\.)*")|(?P<word>[^\s=;"]+)|(?P<sign>=)|(?P<end>;))'
)


def parse_jaas_config(value: str) -> JaasConfig:
    """The login module, flag and options of a ``sasl.jaas.config`` value, e.g.
    ``org.apache.kafka.common.security.plain.PlainLoginModule required username="u"
    password="p";`` (values quoted with backslash escapes, or bare words)."""
    tokens: list[tuple[str, str]] = []
    position = 0
    text = value.strip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise JaasSyntaxError(
                f"sasl.jaas.config: unexpected text at character {position + 1}; expected "
                'LoginModule required key="value" ... ;'
            )
        kind = match.lastgroup or ""
        raw = match.group(kind)
        if kind == "quoted":
            raw = re.sub(r"\\(.)", r"\1", raw[1:-1])
        tokens.append((kind, raw))
        position = match.end()
        while position < len(text) and text[position].isspace():
            position += 1
    if len(tokens) < 3 or tokens[0][0] != "word" or tokens[1][0] != "word":
        raise JaasSyntaxError(
            "sasl.jaas.config: expected a login module class and its flag (required, "
            'requisite, sufficient or optional) before its options: LoginModule required key="v";'
        )
    if tokens[-1][0] != "end":
        raise JaasSyntaxError("sasl.jaas.config: the entry must end with ';'")
    flag = tokens[1][1]
    if flag not in ("required", "requisite", "sufficient", "optional"):
        raise JaasSyntaxError(
            f"sasl.jaas.config: control flag {flag!r} is none of required, requisite, "
            "sufficient, optional"
        )
    options: dict[str, str] = {}
    rest = tokens[2:-1]
    if len(rest) % 3:
        raise JaasSyntaxError("sasl.jaas.config: options must be key=value pairs")
    for index in range(0, len(rest), 3):
        (key_kind, key), (sign_kind, _), (value_kind, option) = rest[index : index + 3]
        if key_kind != "word" or sign_kind != "sign" or value_kind not in ("word", "quoted"):
            raise JaasSyntaxError(
                f'sasl.jaas.config: option {index // 3 + 1} is not key=value or key="value"'
            )
        options[key] = option
    return JaasConfig(tokens[0][1], flag, options)


class ClientFileError(ValueError):
    """A key of a client properties file bergstream cannot use; the message says why and what to
    do instead, without the key's value."""


#: Keys bergstream sets itself on every client it makes, and why a file may not set them.
REFUSED_KEYS: dict[str, str] = {
    "key.serializer": "bergstream writes records' bytes itself",
    "value.serializer": "bergstream writes records' bytes itself",
    "key.deserializer": "bergstream reads records' bytes itself",
    "value.deserializer": "bergstream reads records' bytes itself",
    "group.id": "bergstream reads by offsets and keeps no consumer group",
    "group.instance.id": "bergstream reads by offsets and keeps no consumer group",
    "enable.auto.commit": "bergstream reads by offsets and commits none",
    "auto.offset.reset": "bergstream chooses where each read starts",
    "isolation.level": "bergstream reads committed records only, always",
    "enable.partition.eof": "bergstream decides where a read ends",
    "transactional.id": "bergstream does not write transactions",
    "interceptor.classes": "Java interceptors do not run in bergstream's Python clients",
    "partitioner.class": "bergstream does not choose partitions",
}

#: Login modules of ``sasl.jaas.config`` whose user and password bergstream takes.
PASSWORD_LOGIN_MODULES = ("PlainLoginModule", "ScramLoginModule")
#: Java's OAUTHBEARER login module and its options bergstream translates.
OAUTH_LOGIN_MODULE = "OAuthBearerLoginModule"
#: Java's Kerberos login module (``com.sun.security.auth.module``; IBM's has the same name).
KERBEROS_LOGIN_MODULE = "Krb5LoginModule"


def _jaas_password(jaas: JaasConfig, where: str) -> dict[str, str]:
    missing = [key for key in ("username", "password") if key not in jaas.options]
    if missing:
        raise ClientFileError(
            f"{where}: sasl.jaas.config has no {' and no '.join(missing)} option: give "
            'username="..." password="..."'
        )
    return {"sasl.username": jaas.options["username"], "sasl.password": jaas.options["password"]}


def _jaas_oauth(jaas: JaasConfig, where: str) -> dict[str, str]:
    options = jaas.options
    if any(key.startswith("unsecuredLogin") for key in options):
        raise ClientFileError(
            f"{where}: sasl.jaas.config makes up unsecured tokens (unsecuredLogin* options, "
            "Kafka's test mode), which bergstream does not: give clientId and clientSecret "
            "and sasl.oauthbearer.token.endpoint.url"
        )
    out = {"sasl.oauthbearer.method": "oidc"}
    for option, key in (
        ("clientId", "sasl.oauthbearer.client.id"),
        ("clientSecret", "sasl.oauthbearer.client.secret"),
        ("scope", "sasl.oauthbearer.scope"),
    ):
        if option in options:
            out[key] = options[option]
    extensions = [f"{k[4:]}={v}" for k, v in options.items() if k.startswith("ext_")]
    if extensions:
        out["sasl.oauthbearer.extensions"] = ",".join(extensions)
    return out


def _jaas_kerberos(jaas: JaasConfig, where: str) -> dict[str, str]:
    options = jaas.options
    out: dict[str, str] = {}
    if "principal" in options:
        out["sasl.kerberos.principal"] = options["principal"]
    if options.get("useKeyTab", "false").lower() == "true":
        if "keyTab" not in options:
            raise ClientFileError(
                f'{where}: sasl.jaas.config has useKeyTab=true but no keyTab="..." option'
            )
        out["sasl.kerberos.keytab"] = options["keyTab"]
    return out


def jaas_credentials(value: str, where: str) -> dict[str, str]:
    """The settings a ``sasl.jaas.config`` holds, by librdkafka's key names: ``sasl.username``
    and ``sasl.password`` (PLAIN, SCRAM); the OAuth client (``clientId``, ``clientSecret``,
    ``scope``, ``ext_*``) of OAUTHBEARER's OIDC login; the principal and keytab of Kerberos'."""
    try:
        jaas = parse_jaas_config(value)
    except JaasSyntaxError as error:
        raise ClientFileError(f"{where}: {error}") from None
    if jaas.module_name in PASSWORD_LOGIN_MODULES:
        return _jaas_password(jaas, where)
    if jaas.module_name == OAUTH_LOGIN_MODULE:
        return _jaas_oauth(jaas, where)
    if jaas.module_name == KERBEROS_LOGIN_MODULE:
        return _jaas_kerberos(jaas, where)
    raise ClientFileError(
        f"{where}: sasl.jaas.config uses {jaas.module_name}, a login module bergstream does not "
        "know (it speaks PlainLoginModule, ScramLoginModule, OAuthBearerLoginModule and "
        "Krb5LoginModule)"
    )
