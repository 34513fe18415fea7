"""The stack's Kerberos KDC (``kdc``: MIT ``krb5kdc``) alone in a temporary home: the files it
writes, initial tickets from the users' keytabs (``kinit`` and ``gssapi`` without ``kinit``), a
GSSAPI context from a user to the brokers' service principals accepted with ``kafka.keytab``,
principals the KDC does not know refused, and nothing left running after ``stack down``.

The tests run in file order and share one KDC (module fixture); the last one stops it.
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bergstream.devstack.stack import StackEnv, stack_down, stack_status, stack_up
from bergstream.devstack.stack.kdc_server import (
    ADMIN_USER,
    NOACCESS_USER,
    REALM,
    SERVICE_HOSTS,
    TICKET_LIFETIME_ENV,
    KerberosFiles,
    client_environment,
    kerberos_files,
)
from bergstream.devstack.stack.ports import port_is_open
from bergstream.devstack.stack.procs import find_strays, pid_alive

gssapi = pytest.importorskip("gssapi")

pytestmark = pytest.mark.slow

#: A short ticket lifetime (seconds), to see that the KDC applies the configured one.
LIFETIME = 120


@dataclass
class Kdc:
    home: Path
    env: StackEnv
    files: KerberosFiles
    port: int
    up_seconds: float


@pytest.fixture(scope="module")
def kdc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kdc]:
    home = tmp_path_factory.mktemp("kdc") / "home"
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(TICKET_LIFETIME_ENV, str(LIFETIME))
            t0 = time.monotonic()
            env = stack_up(home, {"kdc"})
            up_seconds = time.monotonic() - t0
        print(f"\nstack up kdc: {up_seconds:.3f} s")
        port = stack_status(home)["kdc"]["ports"]["kdc"]
        yield Kdc(home, env, kerberos_files(home), port, up_seconds)
    finally:
        stack_down(home)


@pytest.fixture
def krb5_env(kdc: Kdc, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's MIT library uses the stack's krb5.conf, no cache or keytab of the caller."""
    monkeypatch.setenv("KRB5_CONFIG", str(kdc.files.krb5_conf))
    monkeypatch.delenv("KRB5CCNAME", raising=False)
    monkeypatch.delenv("KRB5_CLIENT_KTNAME", raising=False)


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=30, check=False
    )


def _initiator(files: KerberosFiles, user: str, ccache: str) -> gssapi.Credentials:
    """``user``'s initiator credentials straight from its keytab (no kinit)."""
    return gssapi.Credentials(
        usage="initiate",
        name=gssapi.Name(files.principal(user), gssapi.NameType.kerberos_principal),
        store={"client_keytab": str(files.user_keytab(user)), "ccache": ccache},
    )


def _round_trip(files: KerberosFiles, creds: gssapi.Credentials, host: str) -> tuple[str, str]:
    """A context from ``creds`` to ``kafka@host`` accepted with the brokers' keytab (mutual
    authentication completed); the (initiator, target) the acceptor saw."""
    service = gssapi.Name(f"kafka@{host}", gssapi.NameType.hostbased_service)
    client = gssapi.SecurityContext(name=service, creds=creds, usage="initiate")
    token = client.step()
    acceptor_creds = gssapi.Credentials(usage="accept", store={"keytab": str(files.broker_keytab)})
    server = gssapi.SecurityContext(creds=acceptor_creds, usage="accept")
    reply = server.step(token)
    assert server.complete
    if reply:
        client.step(reply)
    assert client.complete
    return str(server.initiator_name), str(server.target_name)


def test_environment_and_files(kdc: Kdc) -> None:
    assert kdc.up_seconds < 10
    env = kdc.env.as_dict()
    security = kdc.home / "security"
    assert env["BERGSTREAM_KRB5_CONFIG"] == str(security / "krb5.conf")
    assert env["BERGSTREAM_KERBEROS_REALM"] == "BERGSTREAM.LOCAL"
    assert env["BERGSTREAM_KERBEROS_KEYTAB"] == str(security / "admin.keytab")
    assert env["BERGSTREAM_KERBEROS_PRINCIPAL"] == "admin@BERGSTREAM.LOCAL"
    assert env["BERGSTREAM_KERBEROS_NOACCESS_KEYTAB"] == str(security / "noaccess.keytab")
    assert env["BERGSTREAM_KERBEROS_NOACCESS_PRINCIPAL"] == "noaccess@BERGSTREAM.LOCAL"
    assert "BERGSTREAM_KAFKA_BOOTSTRAP" not in env
    status = stack_status(kdc.home)["kdc"]
    assert status["running"] and status["address"] == f"127.0.0.1:{kdc.port}"
    assert status["version"] not in (None, "unknown")

    conf = kdc.files.krb5_conf.read_text()
    assert f"kdc = 127.0.0.1:{kdc.port}" in conf and "udp_preference_limit = 1" in conf
    kdc_conf = (kdc.home / "kdc" / "kdc.conf").read_text()
    assert f"kdc_tcp_listen = 127.0.0.1:{kdc.port}" in kdc_conf
    secrets = [*kdc.files.keytabs(), kdc.home / "kdc" / "stash", kdc.home / "kdc" / "principal"]
    for path in secrets:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    listed = _run(["klist", "-k", str(kdc.files.broker_keytab)], {}).stdout
    for host in SERVICE_HOSTS:
        assert f"kafka/{host}@{REALM}" in listed
    assert set(kdc.files.service_principals) == {
        "kafka/localhost@BERGSTREAM.LOCAL",
        "kafka/127.0.0.1@BERGSTREAM.LOCAL",
    }


@pytest.mark.parametrize("user", [ADMIN_USER, NOACCESS_USER])
def test_kinit_with_keytab(kdc: Kdc, tmp_path: Path, user: str) -> None:
    env = {"KRB5_CONFIG": str(kdc.files.krb5_conf), "KRB5CCNAME": f"FILE:{tmp_path / 'cc'}"}
    principal = kdc.files.principal(user)
    out = _run(["kinit", "-k", "-t", str(kdc.files.user_keytab(user)), principal], env)
    assert out.returncode == 0, out.stderr
    listed = _run(["klist"], env).stdout
    assert f"Default principal: {principal}" in listed
    assert f"krbtgt/{REALM}@{REALM}" in listed


@pytest.mark.parametrize("host", SERVICE_HOSTS)
def test_gssapi_round_trip(kdc: Kdc, krb5_env: None, host: str) -> None:
    creds = _initiator(kdc.files, ADMIN_USER, f"MEMORY:round-trip-{host}")
    initiator, target = _round_trip(kdc.files, creds, host)
    assert initiator == f"admin@{REALM}"
    # krb5.conf canonicalizes host names as Java's Kafka client does (a reverse lookup): a
    # client connecting to 127.0.0.1 asks for kafka/localhost, the brokers' principal.
    assert target == f"kafka/localhost@{REALM}"
    assert 0 < creds.lifetime <= LIFETIME  # the configured ticket lifetime


def test_default_credentials_from_client_keytab(
    kdc: Kdc, krb5_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What aiokafka does: default initiator credentials, the keytab named by the environment."""
    for name, value in client_environment(kdc.files, NOACCESS_USER).items():
        monkeypatch.setenv(name, value)
    creds = gssapi.Credentials(usage="initiate")
    assert str(creds.name) == f"noaccess@{REALM}"
    assert _round_trip(kdc.files, creds, "127.0.0.1")[0] == f"noaccess@{REALM}"


def test_unknown_principals_refused(kdc: Kdc, krb5_env: None) -> None:
    ghost = gssapi.Name(f"ghost@{REALM}", gssapi.NameType.kerberos_principal)
    with pytest.raises(gssapi.exceptions.GSSError, match="not found in Kerberos database"):
        gssapi.raw.acquire_cred_with_password(ghost, b"any password", usage="initiate")
    creds = _initiator(kdc.files, ADMIN_USER, "MEMORY:unknown-service")
    service = gssapi.Name("kafka@elsewhere.example", gssapi.NameType.hostbased_service)
    client = gssapi.SecurityContext(name=service, creds=creds, usage="initiate")
    with pytest.raises(gssapi.exceptions.GSSError, match="not found in Kerberos database"):
        client.step()


def test_stack_down_leaves_nothing(kdc: Kdc) -> None:
    pid = stack_status(kdc.home)["kdc"]["pid"]
    assert pid_alive(pid)
    assert stack_down(kdc.home) == ["kdc"]
    assert not pid_alive(pid)
    assert find_strays(kdc.home / "kdc", ("krb5kdc",)) == []
    assert not port_is_open(kdc.port)
    assert stack_status(kdc.home)["kdc"]["running"] is False
