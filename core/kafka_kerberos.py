"""SASL GSSAPI (Kerberos) for bergstream's own Kafka connections, through the ``gssapi`` package.

A connection with a keytab acquires its initiator credentials from it directly
(``gss_acquire_cred_from`` with a ``client_keytab`` and a process-private ``MEMORY:`` ticket
cache, so no ``kinit`` is needed and the user's own ticket cache is left alone; MIT Kerberos
fetches a new ticket-granting ticket from the keytab when the old one nears its end); without a
keytab the default ticket cache (``kinit``) is used. The broker's service principal is
``<sasl.kerberos.service.name>/<host>`` for the host connected to, canonicalized as the
``krb5.conf`` in ``$KRB5_CONFIG`` (or ``/etc/krb5.conf``) says.

:class:`GssapiExchange` runs RFC 4752's exchange: context tokens until the context is
established, then the broker's wrapped offer of security layers answered with "no security
layer" (Kafka runs TLS beneath instead). aiokafka's GSSAPI client takes default credentials
only: :func:`prepare_process_credentials` points this process's ``KRB5_CLIENT_KTNAME`` and
``KRB5CCNAME`` at the settings' keytab for it.

The ``gssapi`` package (PyPI) builds against MIT Kerberos's headers (Debian: ``libkrb5-dev``);
without it, GSSAPI settings fail with a message saying so.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bergstream.core.kafka_client import KafkaClientSettings

__all__ = ["GssapiExchange", "KerberosError", "gssapi_module", "prepare_process_credentials"]

# RFC 4752 section 3.3: bit 1 of the security layer byte is "no security layer".
_NO_SECURITY_LAYER = 0x01
_process_lock = threading.Lock()
_process_keytab: list[str] = []  # the keytab this process's default credentials come from


class KerberosError(RuntimeError):
    """Kerberos cannot log in as the settings say; the message names the principal, the keytab
    or the service and what Kerberos answered."""


def gssapi_module() -> ModuleType:
    """The ``gssapi`` package, or a :class:`KerberosError` saying how to install it."""
    try:
        import gssapi
    except ImportError:
        raise KerberosError(
            "sasl.mechanism GSSAPI needs the Python package gssapi: pip install gssapi (it "
            "builds against MIT Kerberos: apt-get install libkrb5-dev first)"
        ) from None
    return gssapi


@functools.cache
def _keytab_credentials(principal: str, keytab: str) -> Any:
    gssapi = gssapi_module()
    digest = hashlib.sha256(f"{principal}\0{keytab}".encode()).hexdigest()[:16]
    try:
        return gssapi.Credentials(
            name=gssapi.Name(principal, gssapi.NameType.kerberos_principal),
            usage="initiate",
            store={"client_keytab": keytab, "ccache": f"MEMORY:bergstream-{digest}"},
        )
    except gssapi.exceptions.GSSError as error:
        raise KerberosError(
            f"cannot use the keytab {keytab} for {principal}: {_words(error)} (check "
            "sasl.kerberos.principal and sasl.kerberos.keytab)"
        ) from None


def _words(error: Exception) -> str:
    text = " ".join(str(error).split())
    return text.removeprefix("Major (").strip() if text else type(error).__name__


class GssapiExchange:
    """One GSSAPI login with ``settings`` to the broker at ``host`` (RFC 4752, no security
    layer). :meth:`first` is the first token; :meth:`answer` takes each broker token and gives
    the next one to send, or None when the exchange is done."""

    def __init__(self, settings: KafkaClientSettings, host: str) -> None:
        gssapi = gssapi_module()
        self._gssapi = gssapi
        self.service = f"{settings.kerberos_service_name}@{host}"
        keytab = settings.sasl_kerberos_keytab
        principal = settings.sasl_kerberos_principal
        credentials = (
            _keytab_credentials(principal, str(keytab))
            if keytab is not None and principal is not None
            else None
        )
        self.principal = principal
        try:
            target = gssapi.Name(self.service, gssapi.NameType.hostbased_service)
            self._context = gssapi.SecurityContext(
                name=target, creds=credentials, usage="initiate", mech=gssapi.MechType.kerberos
            )
        except gssapi.exceptions.GSSError as error:
            raise self._failure(error) from None
        self._done = False

    def _failure(self, error: Exception) -> KerberosError:
        who = self.principal or "the ticket cache's principal"
        return KerberosError(
            f"Kerberos login of {who} to the service {self.service} failed: {_words(error)} "
            "(check sasl.kerberos.service.name, the broker's host name in krb5.conf's realm, "
            "and that the KDC knows the principal)"
        )

    def first(self) -> bytes:
        """The first context token (asks the KDC for a service ticket)."""
        try:
            return self._context.step() or b""
        except self._gssapi.exceptions.GSSError as error:
            raise self._failure(error) from None

    def answer(self, token: bytes) -> bytes | None:
        """The reply to the broker's ``token``: the next context token, the wrapped choice of no
        security layer once the context is established, or None when nothing is left to send."""
        if self._done:
            return None
        try:
            if not self._context.complete:
                reply = self._context.step(token)
                return reply or b""
            offer = self._context.unwrap(token).message
        except self._gssapi.exceptions.GSSError as error:
            raise self._failure(error) from None
        if len(offer) != 4 or not offer[0] & _NO_SECURITY_LAYER:
            raise KerberosError(
                f"the broker at {self.service} offers no 'no security layer' option "
                f"({offer[:1].hex()}): Kafka always does; is this a Kafka broker?"
            )
        self._done = True
        # No security layer, no maximum message size, no authorization id (the principal's own).
        choice = bytes([_NO_SECURITY_LAYER, 0, 0, 0])
        return self._context.wrap(choice, False).message


def prepare_process_credentials(settings: KafkaClientSettings) -> None:
    """Point this process's default Kerberos credentials at the settings' keytab (for aiokafka,
    whose GSSAPI client takes default credentials only): ``KRB5_CLIENT_KTNAME`` and a private
    ``MEMORY:`` ``KRB5CCNAME``. Without a keytab nothing changes (the ticket cache is used). A
    process already pointed at another keytab is a :class:`KerberosError`: one process of
    aiokafka clients logs in as one principal."""
    gssapi = gssapi_module()
    keytab = settings.sasl_kerberos_keytab
    if keytab is None:
        return
    with _process_lock:
        if _process_keytab and _process_keytab[0] != str(keytab):
            raise KerberosError(
                f"this process's Kafka clients already log in with the keytab "
                f"{_process_keytab[0]}; aiokafka takes one Kerberos identity per process, not "
                f"also {keytab}"
            )
        if not _process_keytab:
            os.environ["KRB5_CLIENT_KTNAME"] = str(keytab)
            os.environ["KRB5CCNAME"] = f"MEMORY:bergstream-{os.getpid()}"
            _process_keytab.append(str(keytab))
    # Acquire once for the named principal, so the default cache holds its ticket.
    principal = settings.sasl_kerberos_principal
    if principal is not None:
        try:
            credentials = gssapi.Credentials(
                name=gssapi.Name(principal, gssapi.NameType.kerberos_principal), usage="initiate"
            )
            credentials.lifetime  # noqa: B018 - asks the KDC now, so a bad keytab fails here
        except gssapi.exceptions.GSSError as error:
            raise KerberosError(
                f"cannot use the keytab {keytab} for {principal}: {_words(error)} (check "
                "sasl.kerberos.principal and sasl.kerberos.keytab)"
            ) from None
