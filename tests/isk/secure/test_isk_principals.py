"""ISK's principals without Kafka: config parsing (Kafka settings inherited, secrets never shown),
bearer tokens and their expiry, vended S3 credentials naming their principal, and the catalog
and S3 gateway serving each principal only what its ``readable`` answer allows
(here a fixed answer; Kafka's own answer is tested on the secured stack in
tests/isk/secure/test_isk_acls.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.client import BaseClient
from botocore.config import Config
from botocore.exceptions import ClientError
from pydantic import ValidationError

from bergstream.core.api import KafkaClientSettings
from bergstream.core.problems import pydantic_problems
from bergstream.plugins.isk_gateway.http.credentials import CredentialKeys
from bergstream.plugins.isk_gateway.http.principals import (
    IskPrincipalConfig,
    Principal,
    PrincipalDirectory,
    PrincipalRefused,
)
from bergstream.plugins.isk_gateway.http.server import IskHttpConfig, IskHttpService
from bergstream.plugins.isk_gateway.http.sigv4 import SigV4Error, verify_sigv4
from bergstream.plugins.isk_gateway.kafka.authorization import (
    DESCRIBE,
    OPERATIONS_NOT_COMPUTED,
    READ,
    TopicAuthorizer,
    readable_topics,
)
from bergstream.plugins.isk_gateway.settings import IskServiceConfig
from bergstream.plugins.isk_gateway.tables.provider import LoadedTable, ProviderUnavailable
from tests.kits.isk_http_fakes import FakeProvider, table_metadata
from tests.kits.sigv4 import signed

ROOT_KEY, ROOT_SECRET = "isk-root", "root-secret/with+chars"
SERVICE_PASSWORD = "service-pa55word"
READER_PASSWORD = "reader-pa55word"
CLIENT_SECRET = "reader-client-secret"
BASIC_PASSWORD = "basic-pa55word"
SECRETS = (SERVICE_PASSWORD, READER_PASSWORD, CLIENT_SECRET, BASIC_PASSWORD, ROOT_SECRET)


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n")  # existence is all parsing checks
    return path


def service_config(ca: Path, principals: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "kafka_bootstrap": "127.0.0.1:1",
        "kafka_client": {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "admin",
            "sasl.password": SERVICE_PASSWORD,
            "ssl.ca.location": str(ca),
        },
        "http": {"access_key": ROOT_KEY, "secret_key": ROOT_SECRET, **extra},
        "principals": principals,
    }


def reader_entry(**overrides: Any) -> dict[str, Any]:
    return {
        "name": "reader",
        "client_id": "reader-client",
        "client_secret": CLIENT_SECRET,
        "sasl.username": "reader",
        "sasl.password": READER_PASSWORD,
        **overrides,
    }


def problems_text(error: ValidationError) -> str:
    """What ``bergstream config check`` prints of an error (inputs included)."""
    return "\n".join(f"{loc}: {message}" for loc, message in pydantic_problems(error))


# ------------------------------------------------------------------------------- config


def test_without_principals_the_service_identity_serves_everyone(ca: Path) -> None:
    config = IskServiceConfig.model_validate(service_config(ca, []))
    assert config.principals == [] and config.authorization_cache_seconds == 10.0
    bare = IskServiceConfig.model_validate(
        {"kafka_bootstrap": "127.0.0.1:1", "http": {"access_key": "a", "secret_key": "b"}}
    )
    assert bare.principals == []


def test_sasl_credentials_inherit_how_to_reach_kafka_never_who_connects(ca: Path) -> None:
    config = IskServiceConfig.model_validate(service_config(ca, [reader_entry()]))
    kafka = config.principals[0].kafka_client
    assert kafka.security_protocol == "SASL_SSL" and kafka.sasl_mechanism == "SCRAM-SHA-512"
    assert kafka.ssl_ca_location == ca
    assert kafka.sasl_username == "reader"
    assert kafka.librdkafka()["sasl.password"] == READER_PASSWORD
    shown = repr(config) + str(config) + repr(config.principals)
    assert all(secret not in shown for secret in SECRETS)


def test_an_oauth_client_inherits_the_services_identity_provider_never_its_client(
    ca: Path,
) -> None:
    data = service_config(ca, [])
    endpoint = "https://idp.example/realms/k/protocol/openid-connect/token"
    data["kafka_client"] = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.client.id": "isk",
        "sasl.oauthbearer.client.secret": SERVICE_PASSWORD,
        "sasl.oauthbearer.token.endpoint.url": endpoint,
        "sasl.oauthbearer.scope": "kafka",
        "ssl.ca.location": str(ca),
    }
    entry = {
        "name": "reader",
        "client_id": "reader-client",
        "client_secret": CLIENT_SECRET,
        "kafka_client": {
            "sasl.oauthbearer.client.id": "reader",
            "sasl.oauthbearer.client.secret": READER_PASSWORD,
        },
    }
    data["principals"] = [entry]
    kafka = IskServiceConfig.model_validate(data).principals[0].kafka_client
    assert (kafka.sasl_mechanism, kafka.sasl_oauthbearer_client_id) == ("OAUTHBEARER", "reader")
    assert kafka.sasl_oauthbearer_token_endpoint_url == endpoint
    assert kafka.sasl_oauthbearer_scope == "kafka"
    assert kafka.librdkafka()["sasl.oauthbearer.client.secret"] == READER_PASSWORD


def test_a_client_certificate_of_the_service_is_not_inherited(tmp_path: Path, ca: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("c")
    key.write_text("k")
    data = service_config(ca, [reader_entry()])
    data["kafka_client"].update(
        {"ssl.certificate.location": str(cert), "ssl.key.location": str(key)}
    )
    kafka = IskServiceConfig.model_validate(data).principals[0].kafka_client
    assert kafka.ssl_certificate_location is None and kafka.ssl_key_location is None


def test_a_kafka_client_block_with_a_properties_file_is_used_whole(
    tmp_path: Path, ca: Path
) -> None:
    properties = tmp_path / "noaccess.properties"
    properties.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanisms=PLAIN\nsasl.username=noaccess\n"
        f"sasl.password={READER_PASSWORD}\nssl.ca.location={ca}\n"
    )
    entry = {
        "name": "noaccess",
        "user": "nobody",
        "password": BASIC_PASSWORD,
        "kafka_client": {"properties_file": str(properties)},
    }
    kafka = IskServiceConfig.model_validate(service_config(ca, [entry])).principals[0].kafka_client
    assert (kafka.sasl_username, kafka.sasl_mechanism) == ("noaccess", "PLAIN")
    # A block without a file inherits the keys it does not give.
    entry["kafka_client"] = {"sasl.username": "x", "sasl.password": "y", "sasl.mechanism": "PLAIN"}
    kafka = IskServiceConfig.model_validate(service_config(ca, [entry])).principals[0].kafka_client
    assert (kafka.security_protocol, kafka.sasl_mechanism, kafka.ssl_ca_location) == (
        "SASL_SSL",
        "PLAIN",
        ca,
    )


@pytest.mark.parametrize(
    ("principals", "expected"),
    [
        ([reader_entry(**{"sasl.username": None, "sasl.password": None})], "no Kafka credentials"),
        ([reader_entry(client_id=None, client_secret=None)], "no catalog credential"),
        ([reader_entry(client_secret=None)], "set both client_id and client_secret"),
        ([reader_entry(user="u")], "set both user and password"),
        ([reader_entry(**{"sasl.password": None})], "needs sasl.password"),
        ([reader_entry(name="bad name")], "principal name 'bad name'"),
        (
            [reader_entry(), reader_entry(client_id="other")],
            "name 'reader' is given more than once",
        ),
        (
            [reader_entry(), reader_entry(name="second")],
            "client_id 'reader-client' is given more than once",
        ),
        (
            [reader_entry(kafka_client={"sasl.username": "other"})],
            "sasl.username given both in the principal and in its kafka_client",
        ),
    ],
)
def test_mistakes_are_named_without_showing_secrets(
    ca: Path, principals: list[dict[str, Any]], expected: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        IskServiceConfig.model_validate(service_config(ca, principals))
    text = problems_text(caught.value)
    assert expected in text, text
    assert all(secret not in text for secret in SECRETS), text


def test_the_single_oauth_client_cannot_be_used_with_principals(ca: Path) -> None:
    data = service_config(ca, [reader_entry()], client_id="cid", client_secret=CLIENT_SECRET)
    with pytest.raises(ValidationError) as caught:
        IskServiceConfig.model_validate(data)
    text = problems_text(caught.value)
    assert "give that client its own principals entry" in text
    assert all(secret not in text for secret in SECRETS), text


def test_a_principal_without_a_kafka_identity_is_refused(ca: Path) -> None:
    data = service_config(ca, [reader_entry(**{"sasl.username": None, "sasl.password": None})])
    data["kafka_client"] = {}
    data["principals"][0]["kafka_client"] = {"security.protocol": "PLAINTEXT"}
    with pytest.raises(ValidationError) as caught:
        IskServiceConfig.model_validate(data)
    assert "its Kafka connection has no identity" in problems_text(caught.value)


# ------------------------------------------------------------------ tokens and S3 keys


def principal_config(name: str, client: str | None = None, user: str | None = None) -> Any:
    return IskPrincipalConfig.model_validate(
        {
            "name": name,
            "client_id": client,
            "client_secret": CLIENT_SECRET + name if client else None,
            "user": user,
            "password": BASIC_PASSWORD + name if user else None,
            "kafka_client": {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": name,
                "sasl.password": READER_PASSWORD,
            },
        }
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


READABLE = {"reader": frozenset({"orders"}), "admin": frozenset({"orders", "payments"})}


async def fixed_readable(principal: Principal) -> frozenset[str]:
    if principal.name == "refused":
        raise PrincipalRefused("Kafka refused the credentials configured for principal 'refused'")
    return READABLE.get(principal.name, frozenset())


def directory(clock: Clock | None = None, root_secret: str = ROOT_SECRET) -> PrincipalDirectory:
    return PrincipalDirectory(
        [
            principal_config("reader", client="reader-client", user="reader-user"),
            principal_config("admin", client="admin-client"),
            principal_config("nobody", user="nobody"),
            principal_config("refused", client="refused-client"),
        ],
        root_access_key=ROOT_KEY,
        root_secret=root_secret,
        token_ttl_seconds=60,
        readable=fixed_readable,
        clock=clock or Clock(),
    )


def test_tokens_name_their_principal_and_expire() -> None:
    clock = Clock()
    principals = directory(clock)
    reader = principals.client("reader-client", CLIENT_SECRET + "reader")
    assert reader is not None and reader.name == "reader"
    token = principals.issue_token(reader)
    assert principals.token_principal(token) == reader
    clock.now += 59
    assert principals.token_principal(token) == reader
    clock.now += 1
    assert principals.token_principal(token) is None  # expired


def test_forged_tokens_are_refused() -> None:
    principals = directory()
    reader = principals.principals[0]
    token = principals.issue_token(reader)
    prefix, name, expiry, mac = token.split(".")
    admin = base64.urlsafe_b64encode(b"admin").decode().rstrip("=")
    assert principals.token_principal(f"{prefix}.{admin}.{expiry}.{mac}") is None
    assert principals.token_principal(f"{prefix}.{name}.{int(expiry) + 1000}.{mac}") is None
    assert principals.token_principal(f"{prefix}.{name}.{expiry}.{'0' * len(mac)}") is None
    assert principals.token_principal("garbage") is None
    # A token of a gateway with another root secret is not this gateway's.
    assert directory(root_secret="another").token_principal(token) is None


def test_catalog_credentials_are_checked() -> None:
    principals = directory()
    assert principals.client("reader-client", "wrong") is None
    assert principals.client("unknown", CLIENT_SECRET + "reader") is None
    assert principals.basic("reader-user", BASIC_PASSWORD + "reader") == principals.principals[0]
    assert principals.basic("reader-user", CLIENT_SECRET + "reader") is None
    assert principals.basic("reader-client", CLIENT_SECRET + "reader") is None


def test_principals_are_found_by_name() -> None:
    principals = directory()
    assert principals.by_name("reader") == principals.principals[0]
    assert principals.by_name("admin") == principals.principals[1]
    assert principals.by_name("unknown") is None and principals.by_name("") is None
    assert READER_PASSWORD not in repr(principals.principals[0])


def test_signatures_map_to_the_principal_whose_secret_made_them() -> None:
    keys = {"KEY-A": "secret-a", "AKIDEXAMPLE": "secret-b"}
    method, path, query, headers = signed(secret="secret-b")  # signs as AKIDEXAMPLE
    found = verify_sigv4(method=method, raw_path=path, raw_query=query, headers=headers, keys=keys)
    assert found == "AKIDEXAMPLE"
    with pytest.raises(SigV4Error, match="signature does not match"):
        verify_sigv4(
            method=method,
            raw_path=path,
            raw_query=query,
            headers=headers,
            keys={"AKIDEXAMPLE": "secret-a"},
        )
    with pytest.raises(SigV4Error, match="unknown access key"):
        verify_sigv4(
            method=method, raw_path=path, raw_query=query, headers=headers, keys={"KEY-A": "x"}
        )


def test_readable_topics_need_describe_and_read() -> None:
    readable, not_computed = readable_topics(
        [
            ("both", READ | DESCRIBE, False),
            ("all-bits", -1 & 0x7FFFFFFF, False),
            ("read-only", READ, False),
            ("describe-only", DESCRIBE, False),
            ("unknown", OPERATIONS_NOT_COMPUTED, False),
            ("__consumer_offsets", READ | DESCRIBE, True),
            (None, READ | DESCRIBE, False),
        ]
    )
    assert readable == {"both", "all-bits"} and not_computed == 1


async def test_an_unreachable_kafka_is_unavailable_not_a_refusal() -> None:
    authorizer = TopicAuthorizer("127.0.0.1:1", ttl_seconds=5, timeout=2)
    principal = directory().principals[0]
    with pytest.raises(ProviderUnavailable, match="cannot ask Kafka what principal 'reader'"):
        await authorizer.readable(principal)


# ---------------------------------------------------- the catalog and the S3 gateway

CLUSTER = "c"
ORDERS_KEY = f"{CLUSTER}/hotset/orders/data/p=0/day=-/0-1.parquet"
PAYMENTS_KEY = f"{CLUSTER}/hotset/payments/data/p=0/day=-/0-1.parquet"


class Gateway:
    """An IskHttpService with principals on free ports, in its own loop thread."""

    def __init__(self, provider: FakeProvider) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.principals = directory()
        config = IskHttpConfig(
            catalog_port=0, s3_port=0, access_key=ROOT_KEY, secret_key=ROOT_SECRET
        )
        self.service = IskHttpService(config, provider, self.principals)
        self._run(self.service.start())
        assert self.service.catalog_url and self.service.s3_url
        self.catalog_url: str = self.service.catalog_url
        self.s3_url: str = self.service.s3_url

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def close(self) -> None:
        self._run(self.service.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()

    def vended(self, client_id: str, table: str) -> dict[str, str]:
        """The S3 config LoadTable vends OAuth client ``client_id`` for ``hotset.<table>``."""
        url = f"{self.catalog_url}/v1/namespaces/hotset/tables/{table}"
        status, body = call(url, headers=bearer(self, client_id))
        assert status == 200, body
        config: dict[str, str] = body["config"]
        return config

    def s3(self, client_id: str, table: str) -> BaseClient:
        """A client with the credentials vended to ``client_id`` for ``hotset.<table>``."""
        config = self.vended(client_id, table)
        return s3_client(
            self.s3_url,
            config["s3.access-key-id"],
            config["s3.secret-access-key"],
            config["s3.session-token"],
        )

    def issued(self, principal: str | None, table: str) -> BaseClient:
        """A client with credentials for ``principal`` issued directly with the root (as
        LoadTable would, before Kafka's answer changed)."""
        vended = CredentialKeys(ROOT_KEY, ROOT_SECRET).issue(
            f"{CLUSTER}/hotset/{table}", principal, 60
        )
        return s3_client(self.s3_url, vended.access_key, vended.secret_key, vended.session_token)


def s3_client(url: str, key: str, secret: str, token: str | None = None) -> BaseClient:
    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        aws_session_token=token,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    provider = FakeProvider()
    for table in ("orders", "payments"):
        provider.tables["hotset", table] = LoadedTable(
            f"s3://bergstream/{CLUSTER}/hotset/{table}/metadata/1.metadata.json",
            # Vended credentials are scoped to the table's location: the gateway's key layout.
            {
                **table_metadata("hotset", table),
                "location": f"s3://bergstream/{CLUSTER}/hotset/{table}",
            },
        )
    provider.files[ORDERS_KEY] = b"orders bytes"
    provider.files[PAYMENTS_KEY] = b"payments bytes"
    running = Gateway(provider)
    yield running
    running.close()


def call(
    url: str, *, headers: dict[str, str] | None = None, data: bytes | None = None
) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
            return response.status, json.loads(body) if body else None
    except urllib.error.HTTPError as error:
        body = error.read()
        return error.code, json.loads(body) if body else None


def token(gateway: Gateway, client_id: str, secret: str) -> tuple[int, Any]:
    form = urllib.parse.urlencode(
        {"grant_type": "client_credentials", "client_id": client_id, "client_secret": secret}
    ).encode()
    return call(f"{gateway.catalog_url}/v1/oauth/tokens", data=form)


def bearer(gateway: Gateway, client_id: str) -> dict[str, str]:
    status, body = token(gateway, client_id, CLIENT_SECRET + client_id.removesuffix("-client"))
    assert status == 200, body
    assert body["token_type"] == "bearer" and body["expires_in"] == 60
    return {"Authorization": f"Bearer {body['access_token']}"}


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_the_catalog_lists_and_loads_only_readable_tables(gateway: Gateway) -> None:
    tables = f"{gateway.catalog_url}/v1/namespaces/hotset/tables"
    for headers, expected in [
        (bearer(gateway, "reader-client"), ["orders"]),
        (basic("reader-user", BASIC_PASSWORD + "reader"), ["orders"]),
        (bearer(gateway, "admin-client"), ["orders", "payments"]),
        (basic("nobody", BASIC_PASSWORD + "nobody"), []),
    ]:
        status, body = call(tables, headers=headers)
        assert status == 200, body
        assert [i["name"] for i in body["identifiers"]] == expected
    reader = bearer(gateway, "reader-client")
    status, body = call(f"{tables}/orders", headers=reader)
    assert status == 200
    # Temporary credentials for this table, naming the principal; never the root pair.
    config = body["config"]
    vended = CredentialKeys(ROOT_KEY, ROOT_SECRET).verify(config["s3.session-token"])
    assert (vended.principal, vended.scope) == ("reader", f"{CLUSTER}/hotset/orders")
    assert (config["s3.access-key-id"], config["s3.secret-access-key"]) == (
        vended.access_key,
        vended.secret_key,
    )
    assert ROOT_SECRET not in json.dumps(body) and ROOT_KEY not in json.dumps(body)
    for path in ("payments", "payments/credentials", "does-not-exist"):
        status, body = call(f"{tables}/{path}", headers=reader)
        assert status == 404 and body["error"]["type"] == "NoSuchTableException", body
    status, _ = call(f"{tables}/orders/credentials", headers=reader)
    assert status == 200


def test_the_catalog_refuses_missing_and_wrong_credentials(gateway: Gateway) -> None:
    tables = f"{gateway.catalog_url}/v1/namespaces/hotset/tables"
    for headers in (
        {},
        basic("reader-user", "wrong"),
        basic("unknown", "x"),
        {"Authorization": "Bearer isk1.cmVhZGVy.99999999999.00"},
        {"Authorization": "Basic !!!"},
    ):
        status, body = call(tables, headers=headers)
        assert status == 401 and body["error"]["type"] == "NotAuthorizedException", body
    status, body = token(gateway, "reader-client", "wrong")
    assert status == 401 and body["error"] == "invalid_client"
    # Kafka refusing a principal's configured credentials is an authentication error too.
    status, body = call(tables, headers=bearer(gateway, "refused-client"))
    assert status == 401 and "refused the credentials" in body["error"]["message"]


def test_token_exchange_keeps_the_principal(gateway: Gateway) -> None:
    subject = bearer(gateway, "reader-client")["Authorization"].removeprefix("Bearer ")
    form = urllib.parse.urlencode(
        {
            "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
            "subject_token": subject,
            "subject_token_type": "urn:ietf:params:oauth:token-type:access_token",
        }
    ).encode()
    status, body = call(f"{gateway.catalog_url}/v1/oauth/tokens", data=form)
    assert status == 200
    principals = gateway.principals
    assert principals.token_principal(body["access_token"]) == principals.principals[0]


def s3_code(caught: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    response: Any = caught.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def test_s3_serves_a_principal_only_its_readable_tables(gateway: Gateway) -> None:
    reader = gateway.s3("reader-client", "orders")
    assert reader.get_object(Bucket="bergstream", Key=ORDERS_KEY)["Body"].read() == b"orders bytes"
    for key in (PAYMENTS_KEY, "hotset/orders/data/blob.bin"):  # another table; no table
        with pytest.raises(ClientError) as caught:
            reader.get_object(Bucket="bergstream", Key=key)
        assert s3_code(caught) == ("AccessDenied", 403)
    with pytest.raises(ClientError) as caught:
        reader.head_object(Bucket="bergstream", Key=PAYMENTS_KEY)
    assert s3_code(caught)[1] == 403
    listed = reader.list_objects_v2(Bucket="bergstream", Prefix=f"{CLUSTER}/")
    assert [o["Key"] for o in listed["Contents"]] == [ORDERS_KEY]
    # The admin may read both tables, each with the credentials of that table only.
    admin = gateway.s3("admin-client", "payments")
    assert admin.get_object(Bucket="bergstream", Key=PAYMENTS_KEY)["Body"].read() == (
        b"payments bytes"
    )
    with pytest.raises(ClientError) as caught:
        admin.get_object(Bucket="bergstream", Key=ORDERS_KEY)
    assert s3_code(caught) == ("AccessDenied", 403)
    # Credentials naming a principal Kafka no longer lets read the table: refused on use.
    nobody = gateway.issued("nobody", "orders")
    assert nobody.list_objects_v2(Bucket="bergstream").get("Contents", []) == []
    for principal in ("nobody", "refused"):
        with pytest.raises(ClientError) as caught:
            gateway.issued(principal, "orders").get_object(Bucket="bergstream", Key=ORDERS_KEY)
        assert s3_code(caught) == ("AccessDenied", 403)
    assert gateway.issued("reader", "orders").get_object(Bucket="bergstream", Key=ORDERS_KEY)


def test_s3_refuses_the_root_key_and_credentials_of_no_principal(gateway: Gateway) -> None:
    reader = gateway.vended("reader-client", "orders")
    admin = gateway.vended("admin-client", "orders")
    for client in (
        s3_client(gateway.s3_url, ROOT_KEY, ROOT_SECRET),  # the root pair is never a key
        s3_client(gateway.s3_url, reader["s3.access-key-id"], reader["s3.secret-access-key"]),
        s3_client(
            gateway.s3_url,
            reader["s3.access-key-id"],
            admin["s3.secret-access-key"],
            reader["s3.session-token"],
        ),
        gateway.issued(None, "orders"),  # no principal: only a gateway without principals
        gateway.issued("unknown", "orders"),
    ):
        with pytest.raises(ClientError) as caught:
            client.get_object(Bucket="bergstream", Key=ORDERS_KEY)
        assert s3_code(caught) in {("AccessDenied", 403), ("SignatureDoesNotMatch", 403)}


def test_kafka_settings_of_a_principal_are_its_own() -> None:
    settings = directory().principals[0].kafka
    assert isinstance(settings, KafkaClientSettings) and settings.sasl_username == "reader"
