"""A Kerberos KDC for Kafka's SASL GSSAPI: MIT krb5's ``krb5kdc`` from Debian's ``krb5-kdc``,
realm ``BERGSTREAM.LOCAL``, on 127.0.0.1 only, run by the stack as an unprivileged foreground
process (no system service, no root, nothing under /etc).

``home/kdc`` holds the KDC's database, stash and ``kdc.conf`` (the database is created once and
kept across ``stack down``); ``home/security`` the client ``krb5.conf`` and the keytabs: the
brokers' ``kafka.keytab`` (``kafka/localhost`` and ``kafka/127.0.0.1``: Java's Kafka client
names the service after the reverse lookup of the broker's address, librdkafka, aiokafka and
``gssapi`` after the host as given) and one per user (``admin.keytab``, ``noaccess.keytab``).
Every principal has a random key; nothing is protected by a password.

A client needs only ``KRB5_CONFIG`` (the home's ``krb5.conf``) and a keytab: MIT's library gets
the initial ticket from the keytab by itself (``KRB5_CLIENT_KTNAME``, or the ``client_keytab``
credential store of ``gssapi.Credentials``), no ``kinit`` first; see :func:`client_environment`
and, for Java, :func:`jaas_config`.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .paths import StackError, StackPaths
from .ports import choose_ports, port_is_open
from .procs import binary_version, find_executable

__all__ = [
    "ADMIN_USER",
    "DEFAULT_TICKET_LIFETIME",
    "NOACCESS_USER",
    "REALM",
    "SERVICE_HOSTS",
    "SERVICE_NAME",
    "TICKET_LIFETIME_ENV",
    "USERS",
    "KdcTools",
    "KerberosFiles",
    "choose_kdc_ports",
    "client_environment",
    "find_kdc_tools",
    "jaas_config",
    "kdc_command",
    "kdc_version",
    "kerberos_files",
    "probe_kdc",
    "ticket_lifetime",
]

#: The stack's Kerberos realm.
REALM = "BERGSTREAM.LOCAL"
#: The Kafka brokers' service name (``sasl.kerberos.service.name``).
SERVICE_NAME = "kafka"
#: The host names of the brokers' service principals (``kafka/<host>@REALM``), all in
#: ``kafka.keytab``: Java's Kafka client reverse-resolves 127.0.0.1 (``localhost``), the MIT
#: library clients (librdkafka, aiokafka, ``gssapi``) use the address they were given.
SERVICE_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1")
#: The users (principals ``<user>@REALM``, keytab ``<user>.keytab``): as for the secured Kafka
#: (:mod:`.kafka_security`), ``admin`` may do anything, ``noaccess`` nothing.
ADMIN_USER = "admin"
NOACCESS_USER = "noaccess"
USERS: tuple[str, ...] = (ADMIN_USER, NOACCESS_USER)

#: Ticket lifetime in seconds, unless ``$BERGSTREAM_KDC_TICKET_LIFETIME`` says otherwise when
#: the KDC starts (short lifetimes test re-login); the KDC enforces it for every client.
DEFAULT_TICKET_LIFETIME = 3600
TICKET_LIFETIME_ENV = "BERGSTREAM_KDC_TICKET_LIFETIME"
_MIN_TICKET_LIFETIME = 10

# Every principal's own limit; the realm's (kdc.conf, rewritten at each start) is the one that
# applies, so the lifetime can change without touching the database.
_PRINCIPAL_MAX_LIFE = "1 day"
# AES with SHA-1 HMAC: what every client here (MIT 1.20, Java 17) supports by default.
_ENCTYPES = "aes256-cts-hmac-sha1-96:normal aes128-cts-hmac-sha1-96:normal"

# The KDC's programs are in /usr/sbin, not on every user's PATH; kinit is in /usr/bin.
_SBIN_DIRS: tuple[str, ...] = ("/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin")
# Where each program comes from on Debian/Ubuntu.
_PACKAGES = {
    "krb5kdc": "krb5-kdc",
    "kdb5_util": "krb5-kdc",
    "kadmin.local": "krb5-admin-server",
    "kinit": "krb5-user",
}
_COMMAND_TIMEOUT = 60.0
_KADMIN_ERROR = re.compile(r"[a-z_.]+: ")


@dataclass(frozen=True)
class KerberosFiles:
    """Where the Kerberos files of a stack home are (whether or not they exist yet): the
    client ``krb5.conf``, the brokers' keytab and the users' keytabs, all in ``home/security``,
    and the realm's principal names."""

    directory: Path
    realm: str = REALM
    service_name: str = SERVICE_NAME
    service_hosts: tuple[str, ...] = SERVICE_HOSTS

    @property
    def krb5_conf(self) -> Path:
        """The client ``krb5.conf`` (``KRB5_CONFIG``, Java's ``java.security.krb5.conf``)."""
        return self.directory / "krb5.conf"

    @property
    def broker_keytab(self) -> Path:
        """The keytab with every service principal of the brokers."""
        return self.directory / f"{self.service_name}.keytab"

    @property
    def service_principals(self) -> tuple[str, ...]:
        """``kafka/localhost@REALM`` and ``kafka/127.0.0.1@REALM``."""
        return tuple(self.service_principal(host) for host in self.service_hosts)

    def service_principal(self, host: str) -> str:
        """The brokers' service principal for clients that connect to ``host``."""
        return f"{self.service_name}/{host}@{self.realm}"

    def principal(self, user: str) -> str:
        """The principal of ``user`` (``admin`` or ``noaccess``): ``user@REALM``."""
        return f"{user}@{self.realm}"

    def user_keytab(self, user: str) -> Path:
        """The keytab of ``user`` (``admin`` or ``noaccess``)."""
        if user not in USERS:
            raise ValueError(f"no Kerberos user {user!r}: choose from {', '.join(USERS)}")
        return self.directory / f"{user}.keytab"

    def keytabs(self) -> dict[Path, tuple[str, ...]]:
        """Every keytab and the principals it holds."""
        out = {self.broker_keytab: self.service_principals}
        out.update({self.user_keytab(u): (self.principal(u),) for u in USERS})
        return out

    def exist(self) -> bool:
        """True if ``krb5.conf`` and every keytab exist (the KDC has been prepared)."""
        return self.krb5_conf.is_file() and all(path.is_file() for path in self.keytabs())


def kerberos_files(home: Path) -> KerberosFiles:
    """The Kerberos files of the stack in ``home`` (paths only: the ``kdc`` component writes
    them when it starts)."""
    return KerberosFiles(Path(home) / "security")


def client_environment(files: KerberosFiles, user: str = ADMIN_USER) -> dict[str, str]:
    """Environment variables with which an MIT-library client (aiokafka and ``gssapi``,
    librdkafka, ``kinit``) authenticates as ``user`` without a prior ``kinit``: the stack's
    ``krb5.conf``, the user's keytab as the default client keytab and a per-process memory
    credential cache (the initial ticket is fetched from the keytab on first use)."""
    return {
        "KRB5_CONFIG": str(files.krb5_conf),
        "KRB5_CLIENT_KTNAME": str(files.user_keytab(user)),
        "KRB5CCNAME": f"MEMORY:bergstream-{user}",
    }


def jaas_config(keytab: Path, principal: str, *, initiator: bool = True) -> str:
    """A ``sasl.jaas.config`` value for Java (Krb5LoginModule logging in from ``keytab`` as
    ``principal``); ``initiator=False`` for a broker's acceptor-only login."""
    options = [
        "useKeyTab=true",
        "storeKey=true",
        "doNotPrompt=true",
        "useTicketCache=false",
        f'keyTab="{keytab}"',
        f'principal="{principal}"',
    ]
    if not initiator:
        options.append("isInitiator=false")
    return "com.sun.security.auth.module.Krb5LoginModule required " + " ".join(options) + ";"


# --------------------------------------------------------------------------------------------
# Programs


@dataclass(frozen=True)
class KdcTools:
    """MIT krb5's programs the stack's KDC needs."""

    krb5kdc: str
    kdb5_util: str
    kadmin_local: str
    kinit: str


def _find(name: str) -> str:
    found = find_executable(name, _SBIN_DIRS)
    if found is None:
        package = _PACKAGES[name]
        raise StackError(
            f"the stack's kdc needs MIT Kerberos' `{name}`, not found on PATH or in "
            f"{', '.join(_SBIN_DIRS)}: run scripts/setup, or `apt-get install -y "
            f"krb5-kdc krb5-admin-server krb5-user` (`{name}` is in {package}; the packages' "
            f"services need not run, bergstream starts its own KDC)"
        )
    return found


def find_kdc_tools() -> KdcTools:
    """``krb5kdc``, ``kdb5_util``, ``kadmin.local`` and ``kinit``; raises StackError naming
    the missing one and how to install it."""
    return KdcTools(
        krb5kdc=_find("krb5kdc"),
        kdb5_util=_find("kdb5_util"),
        kadmin_local=_find("kadmin.local"),
        kinit=_find("kinit"),
    )


def kdc_version(tools: KdcTools) -> str:
    """MIT krb5's version (e.g. ``1.20.1``; ``krb5kdc`` has no version option, the client
    programs of the same release tell it), or ``unknown``."""
    klist = str(Path(tools.kinit).with_name("klist"))
    return binary_version([klist, "-V"], r"version (\S+)")


def ticket_lifetime(environ: Mapping[str, str] | None = None) -> int:
    """The ticket lifetime (seconds) for a KDC starting now: ``$BERGSTREAM_KDC_TICKET_LIFETIME``
    or :data:`DEFAULT_TICKET_LIFETIME`. StackError if the variable is not a number of seconds
    of at least 10."""
    raw = (os.environ if environ is None else environ).get(TICKET_LIFETIME_ENV, "").strip()
    if not raw:
        return DEFAULT_TICKET_LIFETIME
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < _MIN_TICKET_LIFETIME:
        raise StackError(
            f"{TICKET_LIFETIME_ENV}={raw!r} is not a ticket lifetime: give whole seconds, at "
            f"least {_MIN_TICKET_LIFETIME} (or unset it for {DEFAULT_TICKET_LIFETIME})"
        )
    return value


# --------------------------------------------------------------------------------------------
# Ports


def _udp_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def choose_kdc_ports(previous: dict[str, int] | None, exclude: set[int]) -> dict[str, int]:
    """The KDC's port (``kdc``): free on 127.0.0.1 for TCP and UDP (it answers both; the
    stack's clients use TCP), the previous one where still free, none of ``exclude``."""
    taken = set(exclude)
    for _ in range(20):
        ports = choose_ports(("kdc",), previous, taken)
        if _udp_free(ports["kdc"]):
            return ports
        taken.add(ports["kdc"])
        previous = None
    raise StackError("no port free for both TCP and UDP on 127.0.0.1 for the stack's kdc")


# --------------------------------------------------------------------------------------------
# Configuration, database, principals, keytabs


def _kdc_conf(kdc_dir: Path, port: int, lifetime: int) -> str:
    return f"""# Written by `bergstream stack up` at each start of the kdc component.
[kdcdefaults]
    kdc_listen = 127.0.0.1:{port}
    kdc_tcp_listen = 127.0.0.1:{port}

[realms]
    {REALM} = {{
        database_name = {kdc_dir / "principal"}
        key_stash_file = {kdc_dir / "stash"}
        max_life = {lifetime}s
        max_renewable_life = 0
        supported_enctypes = {_ENCTYPES}
    }}

[plugins]
    # SPAKE would need its groups configured; the stack's clients use keytabs.
    kdcpreauth = {{
        disable = spake
    }}

[logging]
    kdc = STDERR
    default = STDERR
"""


def _krb5_conf(port: int, lifetime: int) -> str:
    return f"""# Written by `bergstream stack up` (the kdc component): KRB5_CONFIG for the stack's
# Kerberos clients (Java: -Djava.security.krb5.conf). The KDC listens on 127.0.0.1 only.
[libdefaults]
    default_realm = {REALM}
    dns_lookup_kdc = false
    dns_lookup_realm = false
    # Host names canonicalized as Java's Kafka client does (a reverse lookup): every client
    # connecting to 127.0.0.1 then asks for the service principal kafka/localhost, the one the
    # brokers log in as (measured: without these, MIT clients ask for kafka/127.0.0.1).
    rdns = true
    dns_canonicalize_hostname = true
    # TCP for every request (the KDC answers UDP too).
    udp_preference_limit = 1
    ticket_lifetime = {lifetime}s
    forwardable = true

[realms]
    {REALM} = {{
        kdc = 127.0.0.1:{port}
    }}

[domain_realm]
    localhost = {REALM}
    127.0.0.1 = {REALM}
"""


def _tool_env(kdc_dir: Path, files: KerberosFiles) -> dict[str, str]:
    env = dict(os.environ)
    env["KRB5_KDC_PROFILE"] = str(kdc_dir / "kdc.conf")
    env["KRB5_CONFIG"] = str(files.krb5_conf)
    # No default client keytab or cache of the caller's leaks in.
    env.pop("KRB5_CLIENT_KTNAME", None)
    env.pop("KRB5CCNAME", None)
    return env


def _run(cmd: list[str], env: dict[str, str], cwd: Path, what: str) -> str:
    try:
        out = subprocess.run(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"{what} timed out after {_COMMAND_TIMEOUT:.0f} s") from exc
    except OSError as exc:
        raise StackError(f"{what}: cannot run {cmd[0]}: {exc}") from exc
    if out.returncode != 0:
        raise StackError(
            f"{what} failed (exit {out.returncode}):\n{(out.stdout + out.stderr).strip()}"
        )
    return out.stdout + out.stderr


def _kadmin(tools: KdcTools, env: dict[str, str], cwd: Path, query: str) -> str:
    # kadmin.local exits 0 when most queries fail: its errors are recognised in the output
    # (``kadmin.local: ...``, ``add_principal: ... while ...``; its log lines start with a date).
    output = _run(
        [tools.kadmin_local, "-r", REALM, "-q", query], env, cwd, f"kadmin.local -q {query!r}"
    )
    if any(_KADMIN_ERROR.match(line) for line in output.splitlines()):
        raise StackError(f"kadmin.local -q {query!r} failed:\n{output.strip()}")
    return output


def _write(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.chmod(mode)
    tmp.replace(path)


def _prepare_database(tools: KdcTools, kdc_dir: Path, files: KerberosFiles) -> None:
    """The database (once), every principal (those missing added) and every keytab (those
    missing exported)."""
    env = _tool_env(kdc_dir, files)
    if not (kdc_dir / "principal").is_file() or not (kdc_dir / "stash").is_file():
        for stale in [kdc_dir / "stash", *kdc_dir.glob("principal*"), *files.keytabs()]:
            stale.unlink(missing_ok=True)  # keys of an earlier database
        # The master password is only ever read from the stash file.
        password = secrets.token_urlsafe(24)
        _run(
            [tools.kdb5_util, "create", "-s", "-r", REALM, "-P", password],
            env,
            kdc_dir,
            f"creating the KDC database in {kdc_dir} (kdb5_util create)",
        )
        _kadmin(tools, env, kdc_dir, f'modprinc -maxlife "{_PRINCIPAL_MAX_LIFE}" krbtgt/{REALM}')
    listed = _kadmin(tools, env, kdc_dir, "listprincs")
    existing = {line.strip() for line in listed.splitlines()}
    for keytab, principals in files.keytabs().items():
        for principal in principals:
            if principal not in existing:
                _kadmin(
                    tools,
                    env,
                    kdc_dir,
                    f'addprinc -randkey -maxlife "{_PRINCIPAL_MAX_LIFE}" {principal}',
                )
        if keytab.is_file():
            continue
        # -norandkey: export the keys as they are (keytabs exported earlier stay valid).
        tmp = keytab.with_name(keytab.name + ".tmp")
        tmp.unlink(missing_ok=True)
        _kadmin(tools, env, kdc_dir, f'ktadd -norandkey -k "{tmp}" {" ".join(principals)}')
        tmp.chmod(0o600)
        tmp.replace(keytab)
    for secret in [kdc_dir / "stash", *kdc_dir.glob("principal*")]:
        secret.chmod(0o600)


def kdc_command(
    paths: StackPaths, tools: KdcTools, port: int, *, lifetime: int = DEFAULT_TICKET_LIFETIME
) -> tuple[list[str], dict[str, str]]:
    """Prepare the KDC of the stack in ``paths.home`` on 127.0.0.1:``port`` with tickets of
    ``lifetime`` seconds: write ``home/kdc/kdc.conf`` and ``home/security/krb5.conf``, create the
    database on first use, add the missing principals and export the missing keytabs. Returns
    ``krb5kdc``'s foreground command line and its environment."""
    kdc_dir = paths.component_dir("kdc")
    kdc_dir.mkdir(parents=True, exist_ok=True)
    kdc_dir.chmod(0o700)
    files = kerberos_files(paths.home)
    files.directory.mkdir(parents=True, exist_ok=True)
    files.directory.chmod(0o700)
    _write(kdc_dir / "kdc.conf", _kdc_conf(kdc_dir, port, lifetime), 0o644)
    _write(files.krb5_conf, _krb5_conf(port, lifetime), 0o644)
    _prepare_database(tools, kdc_dir, files)
    return [tools.krb5kdc, "-n", "-r", REALM], _tool_env(kdc_dir, files)


def probe_kdc(home: Path, port: int, timeout: float = 5.0) -> bool:
    """True once the KDC on 127.0.0.1:``port`` issues tickets: ``kinit`` gets ``admin``'s
    initial ticket (an AS exchange over TCP) from ``admin.keytab`` into a memory cache that
    dies with it."""
    if not port_is_open(port, timeout=0.5):
        return False
    kinit = find_executable("kinit", _SBIN_DIRS)
    if kinit is None:
        return False
    files = kerberos_files(home)
    env = dict(os.environ)
    env.update(client_environment(files, ADMIN_USER))
    env["KRB5CCNAME"] = "MEMORY:bergstream-kdc-probe"
    cmd = [kinit, "-k", "-t", str(files.user_keytab(ADMIN_USER)), files.principal(ADMIN_USER)]
    try:
        out = subprocess.run(
            cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0
