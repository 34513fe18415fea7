"""The SASL logins of a ``sasl_ssl`` stack beyond SCRAM: what its brokers accept and what its
users log in with, from the ``oidc`` (Keycloak) and ``kdc`` (MIT Kerberos) components.

``stack up --sasl-mechanism oauthbearer`` makes the brokers validate OAUTHBEARER tokens against
Keycloak's signing keys (issuer and audience checked, the principal's name from the token's
client-id claim), and the users ``admin`` and ``noaccess`` Keycloak clients with secrets;
``--sasl-mechanism gssapi`` makes the brokers log in as ``kafka/localhost`` from the KDC's
keytab, and the users Kerberos principals with keytabs. The principals are named as under SCRAM
(``User:admin`` is a super user, ``User:noaccess`` has no ACL), so every ACL test holds for
every mechanism.
"""

from __future__ import annotations

from pathlib import Path

from . import kdc_server, oidc_provider
from .kafka_security import (
    USERS,
    KerberosService,
    Logins,
    OAuthValidation,
    load_security_files,
    scram_login,
)
from .paths import StackError
from .state_file import State
from .units import kafka_mechanisms, kafka_shape

__all__ = ["broker_logins", "client_logins"]

#: The host name every client's service ticket names (see kdc_server's krb5.conf).
BROKER_HOST = "localhost"


def broker_logins(
    home: Path, state: State
) -> tuple[OAuthValidation | None, KerberosService | None]:
    """What the brokers of ``state`` accept besides SCRAM and PLAIN: OAUTHBEARER tokens of the
    stack's OIDC provider, Kerberos tickets of its KDC (None for a mechanism not asked for)."""
    if kafka_shape(state)[1] != "sasl_ssl":
        return None, None
    mechanisms = kafka_mechanisms(state)
    oauth = None
    if "oauthbearer" in mechanisms:
        issuer = _issuer(state)
        _, jwks_url = oidc_provider.oidc_endpoints(issuer)
        # Keycloak's tokens name the client in ``sub`` (a mapper of the stack's realm).
        oauth = OAuthValidation(jwks_url, issuer, oidc_provider.AUDIENCE, "sub")
    kerberos = None
    if "gssapi" in mechanisms:
        files = kdc_server.kerberos_files(home)
        kerberos = KerberosService(
            principal=files.service_principal(BROKER_HOST),
            keytab=files.broker_keytab,
            krb5_conf=files.krb5_conf,
        )
    return oauth, kerberos


def _issuer(state: State) -> str:
    entry = state.components.get("oidc", {})
    port = entry.get("ports", {}).get("http")
    if port is None:
        raise StackError(
            "Kafka logs in with OAUTHBEARER but the stack has no oidc component: run "
            "`bergstream stack up --security sasl_ssl --sasl-mechanism oauthbearer`"
        )
    return oidc_provider.issuer_url(int(port))


def client_logins(home: Path, state: State) -> Logins:
    """Every mechanism's login of the users ``admin`` and ``noaccess``, the stack's default
    mechanism first (KafkaClientSettings keys)."""
    logins: dict[str, dict[str, dict[str, str]]] = {}
    for mechanism in kafka_mechanisms(state):
        if mechanism == "oauthbearer":
            token_endpoint, _ = oidc_provider.oidc_endpoints(_issuer(state))
            secrets = oidc_provider.load_oidc_clients(home)
            logins[mechanism] = {
                user: {
                    "sasl.mechanism": "OAUTHBEARER",
                    "sasl.oauthbearer.method": "oidc",
                    "sasl.oauthbearer.client.id": user,
                    "sasl.oauthbearer.client.secret": secrets[user],
                    "sasl.oauthbearer.token.endpoint.url": token_endpoint,
                }
                for user in USERS
            }
        elif mechanism == "gssapi":
            files = kdc_server.kerberos_files(home)
            logins[mechanism] = {
                user: {
                    "sasl.mechanism": "GSSAPI",
                    "sasl.kerberos.service.name": files.service_name,
                    "sasl.kerberos.principal": files.principal(user),
                    "sasl.kerberos.keytab": str(files.user_keytab(user)),
                }
                for user in USERS
            }
        else:
            passwords = load_security_files(home)
            logins[mechanism] = {user: scram_login(passwords, user) for user in USERS}
    return logins
