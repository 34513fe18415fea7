"""PostgreSQL from the Debian package ``postgresql``, ready for logical decoding (Debezium).

The server's data directory is the component directory ``home/postgres`` itself (PostgreSQL
works in its data directory, and the stack recognises its servers by their working
directory). ``initdb`` runs on the first start; the superuser ``bergstream`` (password in
``stack.json``) owns the database ``bergstream``; every connection, TCP on 127.0.0.1 or the
Unix socket in the data directory, authenticates with SCRAM. The server runs with
``wal_level=logical`` and without fsync (a dev stack: its data survives a restart of the server,
not of the machine).

PostgreSQL refuses to run as root. Run by root, ``initdb`` and the server run as the system user
``postgres`` (which the Debian package creates) through ``setpriv``, owning the data directory,
with the one capability ``CAP_DAC_READ_SEARCH``: the stack's home may sit below directories only
root may enter (``/root``, pytest's temporary directories).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import socket
import struct
import subprocess
from pathlib import Path

from .paths import StackError, StackPaths
from .procs import binary_version, find_executable

__all__ = [
    "POSTGRES_DATABASE",
    "POSTGRES_USER",
    "find_postgres",
    "postgres_command",
    "postgres_url",
    "postgres_version",
    "probe_postgres",
    "run_as_prefix",
]

#: The superuser and the database of the stack's server.
POSTGRES_USER = "bergstream"
POSTGRES_DATABASE = "bergstream"

#: The system user that runs the server when the stack runs as root.
SYSTEM_USER = "postgres"

# Where Debian puts each major version's server binaries (not on PATH); newest first.
_DEBIAN_BINDIRS = "/usr/lib/postgresql/*/bin"
_INSTALL_POSTGRES = (
    "install PostgreSQL (Debian/Ubuntu: `apt-get install -y postgresql`; the package's service "
    "need not run, bergstream starts its own server)"
)
# Unix socket paths are limited to 107 bytes on Linux; a longer data directory gets TCP only.
_MAX_SOCKET_PATH = 100

_PG_HBA = """# Written by `bergstream stack up`: every connection authenticates with SCRAM.
# TYPE  DATABASE     USER  ADDRESS        METHOD
local   all          all                  scram-sha-256
local   replication  all                  scram-sha-256
host    all          all   127.0.0.1/32   scram-sha-256
host    replication  all   127.0.0.1/32   scram-sha-256
"""


def _version_key(bindir: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", bindir.parent.name)) or (0,)


def find_postgres() -> Path:
    """The directory holding ``postgres`` and ``initdb``: the one on ``$PATH``, else Debian's
    newest ``/usr/lib/postgresql/<major>/bin``. StackError saying how to install them."""
    on_path = find_executable("postgres")
    # Resolved: a symlink on PATH leads to the directory with the other programs.
    candidates = [Path(on_path).resolve().parent] if on_path else []
    candidates += sorted(Path("/").glob(_DEBIAN_BINDIRS.lstrip("/")), key=_version_key)[::-1]
    for bindir in candidates:
        if all(os.access(bindir / name, os.X_OK) for name in ("postgres", "initdb")):
            return bindir
    raise StackError(
        f"the stack's postgres needs the PostgreSQL server, but `postgres` and `initdb` were "
        f"not found on PATH or in {_DEBIAN_BINDIRS}: {_INSTALL_POSTGRES}"
    )


def postgres_version(bindir: Path) -> str:
    """The server version of ``bindir/postgres`` (e.g. ``15.18``), or ``unknown``."""
    return binary_version([str(bindir / "postgres"), "--version"], r"\(PostgreSQL\) (\S+)")


# --------------------------------------------------------------------------------------------
# Running as an unprivileged user


def run_as_prefix() -> list[str]:
    """The command prefix that runs PostgreSQL's programs as an allowed user: nothing for a
    normal user; for root, ``setpriv`` to the ``postgres`` system user. StackError if root has
    no such user or no ``setpriv``."""
    if os.geteuid() != 0:
        return []
    try:
        user = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise StackError(
            f"PostgreSQL refuses to run as root and there is no `{SYSTEM_USER}` user to run it "
            f"as: {_INSTALL_POSTGRES} (it creates the user), or run the stack as another user"
        ) from None
    setpriv = find_executable("setpriv", ("/usr/bin", "/bin"))
    if setpriv is None:
        raise StackError(
            "PostgreSQL refuses to run as root and `setpriv` (util-linux) was not found to run "
            "it as the postgres user: install util-linux, or run the stack as another user"
        )
    return [
        setpriv,
        f"--reuid={user.pw_uid}",
        f"--regid={user.pw_gid}",
        "--clear-groups",
        # Enter the directories above the data directory (the home may be under /root).
        "--inh-caps=+dac_read_search",
        "--ambient-caps=+dac_read_search",
        "--",
    ]


def _give_to_server_user(path: Path) -> None:
    """Make ``path`` the server user's (when the stack runs as root)."""
    if os.geteuid() == 0:
        user = pwd.getpwnam(SYSTEM_USER)
        os.chown(path, user.pw_uid, user.pw_gid)


def _run(cmd: list[str], what: str, cwd: Path, stdin: str | None = None) -> None:
    try:
        out = subprocess.run(
            cmd, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=300, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"{what} timed out after 300 s") from exc
    if out.returncode != 0 or "ERROR:" in out.stdout + out.stderr:
        raise StackError(
            f"{what} failed (exit {out.returncode}):\n{(out.stdout + out.stderr).strip()}"
        )


# --------------------------------------------------------------------------------------------
# Data directory and start


def _initialised(data: Path) -> bool:
    return (data / "PG_VERSION").is_file()


def _server_options(data: Path, port: int) -> list[str]:
    socket_dir = str(data) if len(str(data)) + 20 <= _MAX_SOCKET_PATH else ""
    settings = {
        "listen_addresses": "127.0.0.1",
        "port": str(port),
        "unix_socket_directories": socket_dir,
        "cluster_name": "bergstream-stack",
        # Logical decoding (Debezium's pgoutput) and room for several connectors' slots.
        "wal_level": "logical",
        "max_replication_slots": "20",
        "max_wal_senders": "20",
        # A slot left behind holds at most this much WAL.
        "max_slot_wal_keep_size": "1GB",
        # A dev stack: no fsync (survives a crash of the server, not of the machine).
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "logging_collector": "off",
    }
    options: list[str] = []
    for key, value in settings.items():
        options += ["-c", f"{key}={value}"]
    return options


def postgres_command(paths: StackPaths, bindir: Path, port: int, password: str) -> list[str]:
    """Prepare the data directory ``home/postgres`` (``initdb`` and the database on first use;
    the superuser's password set to ``password`` whenever it is not the one last set, whose
    digest the data directory keeps) and return the server's command line on
    127.0.0.1:``port``."""
    data = paths.component_dir("postgres")
    data.mkdir(parents=True, exist_ok=True)
    prefix = run_as_prefix()
    _give_to_server_user(data)
    data.chmod(0o700)
    fresh = not _initialised(data)
    if fresh:
        _run(
            [
                *prefix,
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                POSTGRES_USER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
                "--no-instructions",
            ],
            f"initdb of {data}",
            data,
        )
    hba = data / "pg_hba.conf"
    hba.write_text(_PG_HBA, encoding="utf-8")
    _give_to_server_user(hba)
    marker = data / "bergstream-password"
    if fresh or not _password_matches(marker, password):
        single = [*prefix, str(bindir / "postgres"), "--single", "-D", str(data)]
        sql = f"ALTER ROLE {POSTGRES_USER} WITH LOGIN SUPERUSER PASSWORD '{password}';\n"
        if fresh:
            sql += f"CREATE DATABASE {POSTGRES_DATABASE};\n"
        _run([*single, "postgres"], f"setting up the superuser in {data}", data, stdin=sql)
        _write_password_marker(marker, password)
    return [*prefix, str(bindir / "postgres"), "-D", str(data), *_server_options(data, port)]


def _password_digest(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def _password_matches(marker: Path, password: str) -> bool:
    try:
        return marker.read_text().strip() == _password_digest(password)
    except OSError:
        return False


def _write_password_marker(marker: Path, password: str) -> None:
    marker.write_text(_password_digest(password) + "\n")
    marker.chmod(0o600)


def postgres_url(port: int, password: str | None = None) -> str:
    """The libpq URL of the stack's database on ``port`` (with ``password`` if given)."""
    auth = f"{POSTGRES_USER}:{password}" if password else POSTGRES_USER
    return f"postgresql://{auth}@127.0.0.1:{port}/{POSTGRES_DATABASE}"


def probe_postgres(port: int, timeout: float = 1.0) -> bool:
    """True once the server on 127.0.0.1:``port`` takes connections: it answers a startup
    message by asking for authentication (while it starts up it answers with an error)."""
    params = f"user\0{POSTGRES_USER}\0database\0{POSTGRES_DATABASE}\0\0".encode()
    body = struct.pack(">i", 3 << 16) + params  # protocol 3.0
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack(">i", len(body) + 4) + body)
            header = _read_exact(sock, 5)
            # Read the whole request before hanging up: the server logs nothing then.
            _read_exact(sock, struct.unpack(">i", header[1:])[0] - 4)
            return header[:1] == b"R"
    except (OSError, struct.error):
        return False


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed")
        buf += chunk
    return bytes(buf)
