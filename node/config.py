"""Node and topic configuration: one table of settings, one frozen validated config.

Sources, lowest to highest precedence: built-in defaults, a TOML file (``--config``),
``HEADWATER_<NAME>`` environment variables (e.g. ``HEADWATER_DATA_DIR``), and command-line
flags. Topic-level settings (``topic=True``) are server defaults that each topic may
override at creation (``--config retention_ms=3600000``).

docs/configuration.md is generated from ``SETTINGS`` (``python -m headwater.node.config``) and
a test checks that it is current. This module is pure apart from reading the TOML file in
``load``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from headwater.log.api import FlushPolicy, LogConfig
from headwater.log.batch import HEADER_BYTES, MESSAGE_BYTES_DEFAULT
from headwater.shared.acls import normalize_host
from headwater.shared.addresses import DEFAULT_LISTEN, format_address, parse_address
from headwater.shared.errors import ErrorCode, HeadwaterError, shown

INT32_MAX: Final = (1 << 31) - 1
INT64_MAX: Final = (1 << 63) - 1
MiB: Final = 1 << 20
DAY_MS: Final = 24 * 3600 * 1000


def parse_quorum(text: str, node_id: int, listen: str) -> dict[int, str]:
    """``ID@HOST:PORT,...`` as {id: "HOST:PORT"}; empty means {node_id: "LISTEN_HOST:0"}, a
    quorum of this node alone on a port the system picks (no other node needs to reach it,
    so a wildcard listen host gives loopback: the Raft port is never bound to a wildcard
    unless the operator names one).

    Raises INVALID_CONFIG naming the bad entry.
    """
    if not text.strip():
        host, port = parse_address(listen, "listen")
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        return {node_id: f"{host}:0"}
    voters: dict[int, str] = {}
    for entry in (e.strip() for e in text.split(",") if e.strip()):
        id_text, at, address = entry.partition("@")
        voter = _parse_int(id_text)
        if not at or voter is None or voter < 0:
            raise _invalid(f"quorum entry {entry!r} must be ID@HOST:PORT, e.g. 1@10.0.0.1:7701")
        host, port = parse_address(address, f"quorum entry {entry!r}")
        if voter in voters or f"{host}:{port}" in voters.values():
            raise _invalid(f"quorum entry {entry!r} repeats a node id or an address")
        voters[voter] = f"{host}:{port}"
    if not voters:
        raise _invalid(f"quorum {text!r} lists no voter")
    return voters


def parse_host_counts(text: str) -> dict[str, int]:
    """``ADDRESS:COUNT,ADDRESS:COUNT`` (Kafka's ``max.connections.per.ip.overrides``; an
    IPv6 address as written, its count after the last colon) as {canonical address:
    count}. INVALID_CONFIG names an entry that is not of that form."""
    overrides: dict[str, int] = {}
    for entry in (e.strip() for e in text.split(",") if e.strip()):
        address, colon, count = entry.rpartition(":")
        try:
            if not colon or not (count.isascii() and count.isdigit()) or address == "*":
                raise ValueError(entry)
            host = normalize_host(address)
        except (ValueError, HeadwaterError):
            raise _invalid(
                f"kafka_connections_per_host_overrides entry {entry[:80]!r} is not "
                "ADDRESS:COUNT (an IP address and a whole number, e.g. 10.0.0.5:4000)"
            ) from None
        if host in overrides:
            raise _invalid(f"kafka_connections_per_host_overrides names {host} twice")
        overrides[host] = int(count)
    return overrides


@dataclass(frozen=True, slots=True)
class Setting:
    """One configuration key: its default, unit, valid range or choices, and meaning."""

    name: str
    default: int | str | float
    doc: str
    unit: str = ""
    low: int | float | None = None
    high: int | float | None = None
    choices: tuple[str, ...] = ()
    minus_one_disables: bool = False
    topic: bool = False
    address: bool = False

    def parse(self, raw: object, source: str) -> int | str | float:
        """Convert and range-check a value from ``source``; raise INVALID_CONFIG if wrong."""
        if isinstance(self.default, float):
            number = _parse_float(raw)
            low_f = self.low if self.low is not None else -math.inf
            high_f = self.high if self.high is not None else math.inf
            if number is None or not low_f <= number <= high_f:
                raise _invalid(
                    f"{self.name} from {source} is {shown(str(raw))}; valid: a number in "
                    f"[{low_f}, {high_f}]"
                )
            return number
        if isinstance(self.default, int):
            value = _parse_int(raw)
            if value is None:
                raise _invalid(
                    f"{self.name} from {source} must be an integer (ASCII digits, an optional "
                    f"leading '-'), got {shown(str(raw))}"
                )
            if self.minus_one_disables and value == -1:
                return value
            low = self.low if self.low is not None else -INT64_MAX
            high = self.high if self.high is not None else INT64_MAX
            if not low <= value <= high:
                extra = " or -1 (no limit)" if self.minus_one_disables else ""
                raise _invalid(
                    f"{self.name} from {source} is {value}; valid range is [{low}, {high}]{extra}"
                )
            return value
        if not isinstance(raw, str):
            raise _invalid(f"{self.name} from {source} must be text, got {raw!r}")
        text = raw.strip()
        if self.address and text:
            parse_address(text, f"{self.name} from {source}")
        if self.choices and text not in self.choices:
            raise _invalid(
                f"{self.name} from {source} is {shown(text)}; valid: {', '.join(self.choices)}"
            )
        return text


_INTEGER: Final = re.compile(r"-?[0-9]{1,19}")
_NUMBER: Final = re.compile(r"-?[0-9]{1,19}(\.[0-9]{1,19})?([eE][-+]?[0-9]{1,3})?")


def _parse_int(raw: object) -> int | None:
    """An int, or text of ASCII digits with an optional leading minus (nothing else: no
    sign '+', no spaces, no '_', no other script's digits, as Kafka reads them)."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and _INTEGER.fullmatch(raw):
        return int(raw)
    return None


def _parse_float(raw: object) -> float | None:
    """A finite float, or text of one in ASCII (digits, an optional minus, fraction and
    exponent; no spaces, no '+' in front, no 'nan' or 'inf')."""
    if isinstance(raw, bool):
        return None
    if not isinstance(raw, int | float) and not (isinstance(raw, str) and _NUMBER.fullmatch(raw)):
        return None
    number = float(raw)
    return number if math.isfinite(number) else None


def _invalid(message: str) -> HeadwaterError:
    return HeadwaterError(ErrorCode.INVALID_CONFIG, message)


SETTINGS: Final[tuple[Setting, ...]] = (
    Setting("node_id", 1, "This node's id, unique in the cluster.", low=0, high=INT32_MAX),
    Setting("listen", DEFAULT_LISTEN, "HOST:PORT the gRPC server binds.", address=True),
    Setting(
        "advertised_address",
        "",
        "HOST:PORT clients are told to connect to; empty means the listen address.",
        address=True,
    ),
    Setting(
        "internal_listen",
        "",
        "HOST:PORT of the inter-broker listener, for nodes that prove cluster_secret only "
        "(clients are refused there): the Controller and Replica services (not on listen), "
        "and the client services for requests one node forwards to another (to a "
        "partition's leader, the controller, a group's coordinator). Empty: the listen host "
        "and a port the system picks; set it on controller nodes that broker-only nodes "
        "name in controller_addresses.",
        address=True,
    ),
    Setting(
        "internal_advertised_address",
        "",
        "HOST:PORT other nodes are told to dial for the inter-broker listener. Empty: "
        "internal_listen, with a wildcard host (0.0.0.0, ::) replaced by the "
        "advertised_address host. Set it where nodes reach each other by a name, as in "
        "docker-compose (internal_listen 0.0.0.0:7701, this node1:7701); it needs an "
        "internal_listen with a fixed port.",
        address=True,
    ),
    Setting(
        "kafka_listen",
        "",
        "HOST:PORT of the Kafka wire-protocol listener, for Kafka clients (producers, "
        "consumers, admin tools). Empty: no Kafka listener.",
        address=True,
    ),
    Setting(
        "kafka_advertised_address",
        "",
        "HOST:PORT Kafka clients are told to connect to for this node (in Kafka Metadata "
        "answers); every broker registers it with the controller. Empty: kafka_listen, with "
        "a wildcard host (0.0.0.0, ::) replaced by the advertised_address host. Set it where "
        "clients reach the node by a name (kafka_listen 0.0.0.0:9092, this node1:9092); it "
        "needs a kafka_listen with a fixed port.",
        address=True,
    ),
    Setting(
        "kafka_auto_create_topics",
        "false",
        "Whether a Kafka client's Metadata request for a topic that does not exist creates "
        "it (with num_partitions and default_replication_factor), when the request allows "
        "that (allow_auto_topic_creation: librdkafka's allow.auto.create.topics, true for "
        "producers) and the caller may create topics. Kafka's auto.create.topics.enable; "
        "off here, as in Redpanda, so that a mistyped name is an error, not a topic.",
        choices=("false", "true"),
    ),
    Setting(
        "kafka_security_protocol",
        "PLAINTEXT",
        "What the Kafka listener speaks and asks of clients (Kafka's names). PLAINTEXT: "
        "nothing, callers are User:ANONYMOUS; SASL_PLAINTEXT: a SASL login first (the "
        "mechanisms of sasl_enabled_mechanisms, PLAIN and SCRAM-SHA-256, against the node's "
        "users), which needs credentials_over_plaintext = allow since passwords and proofs "
        "cross the network in the clear; SSL: TLS with the node's certificate and "
        "tls_client_auth (a client certificate names the caller, tls_principal_mapping); "
        "SASL_SSL: TLS, then a SASL login. A node with TLS takes SSL or SASL_SSL only, one "
        "without TLS PLAINTEXT or SASL_PLAINTEXT only.",
        choices=("PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL"),
    ),
    Setting(
        "kafka_connections_max",
        4096,
        "Most connections the Kafka listener keeps open, every accepted socket counted from "
        "its accept (TLS handshakes and logins under way included). At the limit a new "
        "connection takes the place of the oldest one that has not yet logged in (on a "
        "listener without logins: that has had no request answered); it is closed at once "
        "when every open connection has.",
        unit="connections",
        low=1,
        high=1_000_000,
    ),
    Setting(
        "kafka_connections_per_host_max",
        1024,
        "Most connections one client address may hold open on the Kafka listener (Kafka's "
        "max.connections.per.ip); more are closed at once.",
        unit="connections",
        low=1,
        high=1_000_000,
    ),
    Setting(
        "kafka_connections_per_host_overrides",
        "",
        "Other limits for some addresses, ADDRESS:COUNT separated by commas "
        "(10.0.0.5:4000,::1:64; Kafka's max.connections.per.ip.overrides).",
    ),
    Setting(
        "kafka_prelogin_request_rate_per_host_max",
        200,
        "Requests a second one client address may send before logging in, over all its "
        "connections, on a Kafka listener that asks for logins (a login is 3 or 4: "
        "ApiVersions, SaslHandshake, SaslAuthenticate); past it, its connections wait before "
        "reading their next request.",
        unit="requests/s",
        low=1,
        high=1_000_000,
    ),
    Setting(
        "raft_listen",
        "",
        "HOST:PORT the Raft port binds. Empty: this node's own address in quorum. Set it "
        "(e.g. 0.0.0.0:7800) where that address is a name other nodes resolve, which can "
        "change across a container restart.",
        address=True,
    ),
    Setting(
        "metrics_listen",
        "",
        "HOST:PORT of the Prometheus metrics endpoint (HTTP, /metrics; docs/metrics.md). "
        "Empty: no metrics are served or counted.",
        address=True,
    ),
    Setting("data_dir", "./data", "Folder holding the node's topics and partition logs."),
    Setting("rack", "", "Rack (failure domain) of this node, for replica placement."),
    Setting(
        "concurrent_calls_max",
        1024,
        "Most gRPC calls in progress at once on each listener (long polls and open streams "
        "included); calls beyond it are refused with RESOURCE_EXHAUSTED. On the "
        "inter-broker listener, calls other nodes forward take at most half of it.",
        low=16,
        high=100_000,
    ),
    Setting(
        "streams_max",
        896,
        "Most FetchStreams, ProduceStreams and long-polling Fetches open at once on the "
        "client listener; more are refused (THROTTLING_QUOTA_EXCEEDED). Below "
        "concurrent_calls_max, so the rest stays free for short calls.",
        low=1,
        high=100_000,
    ),
    Setting(
        "streams_per_connection_max",
        100,
        "Most FetchStreams, ProduceStreams and long-polling Fetches one client connection "
        "may hold open; more are refused (THROTTLING_QUOTA_EXCEEDED).",
        low=1,
        high=100_000,
    ),
    Setting(
        "sealed_segment_files_max",
        256,
        "Open .log handles of sealed segments (no longer written) the node keeps for reads; "
        "beyond it the least recently used is closed and opened again by its next read. "
        "Each partition's active segment keeps its 3 files open besides.",
        low=16,
        high=1_000_000,
    ),
    Setting(
        "stream_buffer_bytes_max",
        64 * MiB,
        "Bytes of requests one ProduceStream holds in progress (read, being appended or "
        "waiting for replicas); beyond it the stream reads nothing more until earlier "
        "requests are answered (one request is always taken, whatever its size).",
        unit="bytes",
        low=1 * MiB,
        high=INT32_MAX,
    ),
    Setting(
        "request_bytes_max",
        256 * MiB,
        "Largest gRPC message the node sends or accepts.",
        unit="bytes",
        low=1 * MiB,
        high=INT32_MAX,
    ),
    Setting(
        "fetch_bytes_max",
        64 * MiB,
        "Largest max_bytes a Fetch may ask for.",
        unit="bytes",
        low=1024,
        high=INT32_MAX,
    ),
    Setting(
        "fetch_bytes_default",
        4 * MiB,
        "max_bytes of a Fetch that leaves it at 0.",
        unit="bytes",
        low=1,
        high=INT32_MAX,
    ),
    Setting(
        "fetch_wait_ms_max",
        30_000,
        "Longest max_wait_ms a Fetch may ask for.",
        unit="ms",
        low=0,
        high=300_000,
    ),
    Setting(
        "request_timeout_ms",
        30_000,
        "Default time a Produce may wait for its acks.",
        unit="ms",
        low=1,
        high=300_000,
    ),
    Setting("partitions_max", 10_000, "Most partitions one topic may have.", low=1, high=100_000),
    Setting(
        "partitions_per_node_max",
        10_000,
        "Most partition replicas one broker hosts; the controller places no more on it. A "
        "broker registers fewer when its open-file limit (raised to the hard limit at "
        "start) allows fewer, at 3 files per partition after 512 for everything else.",
        low=1,
        high=1_000_000,
    ),
    Setting("topics_max", 10_000, "Most topics the node holds.", low=1, high=1_000_000),
    Setting("default_partitions", 1, "Partitions of a topic created without a count.", low=1),
    Setting(
        "default_replication_factor",
        1,
        "Replicas of a topic created without a replication factor.",
        low=1,
        high=16,
    ),
    # ---- cluster
    Setting(
        "quorum",
        "",
        "Raft voters of the metadata quorum, as ID@HOST:PORT,... (the Raft addresses of the "
        "controller nodes, on the cluster network). Empty: a quorum of this node alone, on the "
        "listen host (loopback when that is a wildcard) and a port the system picks.",
    ),
    Setting(
        "roles",
        "controller,broker",
        "What this node does: `controller` (a Raft voter that may become the active "
        "controller), `broker` (hosts partitions), or both (combined mode).",
        choices=("controller,broker", "broker,controller", "controller", "broker"),
    ),
    Setting(
        "controller_addresses",
        "",
        "Inter-broker HOST:PORT,... (their internal_listen) of controller nodes; broker-only "
        "nodes follow the metadata from them (needed when roles is `broker`).",
    ),
    Setting(
        "cluster_secret",
        "",
        "Shared secret of the cluster's nodes: it encrypts and authenticates the Raft "
        "transport and signs every call on the inter-broker listener. Required (the same on "
        "every node) by broker-only nodes and by a quorum that reaches beyond loopback; a "
        "single node with none generates one into its data directory (cluster.secret); the "
        "nodes of a loopback-only quorum with none share one they generate into a file only "
        "their user may read ($XDG_RUNTIME_DIR or the temporary folder, headwater-UID/), "
        "with a warning. "
        "HEADWATER_RAFT_SECRET and raft_secret are read as older names of it.",
    ),
    Setting(
        "tls_cert_file",
        "",
        "PEM file of this node's certificate chain: with tls_key_file, both gRPC listeners "
        "(listen and internal_listen) speak TLS only, and this node presents it to other "
        "nodes as a client. Its subjectAltName must name every host and address clients and "
        "other nodes dial (advertised_address, internal_advertised_address). Empty: "
        "plaintext (docs/security.md).",
    ),
    Setting("tls_key_file", "", "PEM file of the private key of tls_cert_file (unencrypted)."),
    Setting(
        "tls_ca_file",
        "",
        "PEM file of the CA certificates this node trusts: to verify client certificates "
        "(tls_client_auth required) and nodes' certificates, both ways on the inter-broker "
        "listener (mutual TLS between nodes). Required with TLS.",
    ),
    Setting(
        "tls_client_auth",
        "none",
        "On the client listener: required, every client presents a certificate signed by a "
        "CA in tls_ca_file (mutual TLS); "
        "none, clients present none. A handshake refused for a missing, untrusted or expired "
        "certificate closes the connection (gRPC's TLS gives no status), and the node logs "
        "why. The certificate names the caller's principal (tls_principal_mapping).",
        choices=("none", "required"),
    ),
    Setting(
        "tls_principal_mapping",
        "cn",
        "Which part of a client certificate names the principal User:<name> that ACLs "
        "apply to: cn, the subject's common name; subject, the whole subject as RFC 4514 "
        "text (CN=alice,O=Example); san_dns, san_uri or san_email, the first subject "
        "alternative name of that kind (a certificate without one is refused, "
        "SASL_AUTHENTICATION_FAILED). Credentials in the call, when present, name the "
        "principal instead.",
        choices=("cn", "subject", "san_dns", "san_uri", "san_email"),
    ),
    Setting(
        "authorizer",
        "none",
        "acl: every call on the client listener needs an ACL that allows it (deny by "
        "default; see docs/security.md for what each call needs); none: every call is "
        "allowed. ACLs are kept in the metadata quorum either way "
        "(headwater acls add|list|remove).",
        choices=("none", "acl"),
    ),
    Setting(
        "super_users",
        "",
        "Principals that every call is allowed to, whatever the ACLs say, separated by "
        "commas: User:admin,User:ops. Needed to add the first ACLs once authorizer is acl.",
    ),
    Setting(
        "connection_rate_per_host_max",
        0,
        "New client connections a second one client host may open, on the gRPC and the "
        "Kafka listener each (gRPC: counted at each connection's first call, and the calls "
        "of connections beyond it are refused with THROTTLING_QUOTA_EXCEEDED, retriable; "
        "Kafka: counted at accept, and connections beyond it are closed at once). 0: no "
        "limit.",
        unit="connections/s",
        low=0,
        high=1_000_000,
    ),
    Setting(
        "credentials_over_plaintext",
        "refuse",
        "refuse: a call that carries credentials (authorization metadata) on a plaintext "
        "client listener is refused, since the password would cross the network in the "
        "clear; allow: accept them (for a listener only local processes reach). Applies to "
        "SCRAM logins and session tokens too: a token on a plaintext network can be "
        "replayed.",
        choices=("refuse", "allow"),
    ),
    Setting(
        "sasl_enabled_mechanisms",
        "SCRAM-SHA-256,PLAIN",
        "How users may log in on the client listener. SCRAM-SHA-256: a SCRAM exchange "
        "(Sasl.Authenticate) yields a session token; the password never travels (the "
        "project's clients use it). PLAIN: the password with every call (authorization: "
        "Basic, for gRPC clients without SCRAM); leave it out to refuse that.",
        choices=("SCRAM-SHA-256,PLAIN", "SCRAM-SHA-256", "PLAIN"),
    ),
    Setting(
        "sasl_session_lifetime_ms",
        900_000,
        "How long a session token from a SCRAM login is good for; clients log in again "
        "before it ends. A call begun with a token goes on after it expires, until its "
        "user's credential changes or an ACL it needs is removed.",
        unit="ms",
        low=1000,
        high=86_400_000,
    ),
    Setting(
        "raft_election_timeout_ms",
        300,
        "A voter that hears no leader for a random time in [this, 3 x this] starts an "
        "election; a leader that hears no majority for 5 x this steps down.",
        unit="ms",
        low=50,
        high=60_000,
    ),
    Setting(
        "replica_lag_ms_max",
        10_000,
        "A follower that has not caught up with its leader for this long leaves the ISR "
        "(it rejoins once it has caught up).",
        unit="ms",
        low=100,
        high=600_000,
    ),
    Setting(
        "replica_fetch_wait_ms_max",
        500,
        "Longest a leader holds a follower's fetch when there is nothing new.",
        unit="ms",
        low=10,
        high=30_000,
    ),
    Setting(
        "replica_fetch_bytes_max",
        8 * MiB,
        "Most bytes of records in one answer to a follower (at least one batch).",
        unit="bytes",
        low=1024,
        high=256 * MiB,
    ),
    Setting(
        "broker_heartbeat_interval_ms",
        500,
        "How often a broker heartbeats to the active controller.",
        unit="ms",
        low=10,
        high=60_000,
    ),
    Setting(
        "broker_session_timeout_ms",
        3000,
        "A broker not heard from for this long is fenced and its partitions' leadership "
        "moves to other in-sync replicas.",
        unit="ms",
        low=100,
        high=600_000,
    ),
    Setting(
        "leader_rebalance_interval_ms",
        300_000,
        "How often the controller looks for brokers whose leadership should move back to "
        "them, as preferred replicas (Kafka's leader.imbalance.check.interval.seconds); -1 "
        "never.",
        unit="ms",
        low=100,
        high=DAY_MS,
        minus_one_disables=True,
    ),
    Setting(
        "leader_imbalance_per_broker_percent",
        10,
        "At each look, the partitions a broker is the preferred leader of move back to it "
        "only when more than this share of them is led elsewhere (Kafka's "
        "leader.imbalance.per.broker.percentage); 0: at every look, any that is.",
        unit="%",
        low=0,
        high=100,
    ),
    Setting(
        "controlled_shutdown_timeout_ms",
        10_000,
        "On SIGTERM a broker waits up to this long for its leadership to move away.",
        unit="ms",
        low=0,
        high=600_000,
    ),
    Setting(
        "offsets_topic_partitions",
        50,
        "Partitions of the internal topic __consumer_offsets (created on the first use of a "
        "consumer group): a group lives in partition murmur2(group id) mod this. Read when the "
        "topic is created.",
        low=1,
        high=1000,
    ),
    Setting(
        "offsets_topic_replication_factor",
        3,
        "Replicas of each __consumer_offsets partition, at most the live brokers when it is "
        "created; its min_insync_replicas is 2 when it has 3 or more replicas, else 1.",
        low=1,
        high=16,
    ),
    Setting(
        "group_session_timeout_ms",
        45_000,
        "A group member that sends no heartbeat for this long is removed and its partitions "
        "go to other members (a member may ask for its own, 1000 to 1800000).",
        unit="ms",
        low=1000,
        high=1_800_000,
    ),
    Setting(
        "group_heartbeat_interval_ms",
        500,
        "How often group members heartbeat (a member with partitions to take or give up is "
        "told to come back sooner).",
        unit="ms",
        low=50,
        high=60_000,
    ),
    Setting(
        "group_members_max",
        1000,
        "Most members one consumer group may have.",
        low=1,
        high=100_000,
    ),
    Setting(
        "offsets_commit_timeout_ms",
        5000,
        "How long a group's write (an offset commit, a classic group's generation, a member "
        "leaving) waits for the in-sync replicas of its __consumer_offsets partition before "
        "it is answered REQUEST_TIMED_OUT, which clients retry (Kafka's "
        "offsets.commit.timeout.ms): answers on a connection go back in order, so a commit "
        "held longer holds the member's heartbeats behind it. The records may still be "
        "committed.",
        unit="ms",
        low=1,
        high=600_000,
    ),
    Setting(
        "offsets_retention_ms",
        7 * DAY_MS,
        "Committed offsets of a group without members are deleted this long after their "
        "commit (and the group with them once none is left).",
        unit="ms",
        low=1000,
        high=INT64_MAX,
    ),
    Setting(
        "producer_id_expiration_ms",
        DAY_MS,
        "An idempotent producer silent this long on a partition (by its batches' "
        "timestamps) is forgotten there; its next batch must start a new epoch at "
        "sequence 0 (clients do so on UNKNOWN_PRODUCER_ID).",
        unit="ms",
        low=1000,
        high=INT64_MAX,
    ),
    Setting(
        "log_cleaner_io_max_bytes_per_s",
        16 * MiB,
        "Most bytes a second the log cleaner reads and writes, over all compacted "
        "partitions of the node: it bounds the cleaner's share of the disk and of a core "
        "(about a fifth of one core at the default, cleaning about 8 MB of log a second; "
        "see BENCHMARKS.md).",
        unit="bytes/s",
        low=1024,
        high=INT64_MAX,
    ),
    Setting(
        "log_cleaner_keys_max",
        1_000_000,
        "Most distinct keys one cleaning pass holds in memory (its offset map); a "
        "partition with more dirty keys is cleaned over several passes.",
        low=1,
        high=100_000_000,
    ),
    Setting(
        "log_cleaner_backoff_ms",
        15_000,
        "How often the log cleaner looks for a compacted partition to clean when it found none.",
        unit="ms",
        low=10,
        high=INT64_MAX,
    ),
    Setting(
        "retention_check_interval_ms",
        60_000,
        "How often retention runs over every partition.",
        unit="ms",
        low=10,
        high=DAY_MS,
    ),
    Setting(
        "log_dir_free_bytes_min",
        16 * MiB,
        "Free space the data folder must have before the node brings it back online after "
        "a write there failed (a full disk), besides the blocks its logs had reserved and "
        "gave back when they closed: it then writes and fsyncs a test file of up to 1 MiB, "
        "and opens its logs again only if that works. Room for the replicas it hosts to "
        "catch up keeps the folder from filling again at once.",
        unit="bytes",
        low=0,
        high=INT64_MAX,
    ),
    Setting(
        "log_level",
        "info",
        "Logging threshold.",
        choices=("debug", "info", "warning", "error"),
    ),
    # ---- topic-level defaults (each topic may override them)
    Setting(
        "segment_bytes",
        1 << 30,
        "A segment rolls when the next batch would take it past this size.",
        unit="bytes",
        low=1024,
        high=INT32_MAX,
        topic=True,
    ),
    Setting(
        "min_insync_replicas",
        1,
        "With acks=all, a produce needs at least this many in-sync replicas (else "
        "NOT_ENOUGH_REPLICAS) and is answered once all of them have the batch.",
        low=1,
        high=16,
        topic=True,
    ),
    Setting(
        "unclean_leader_election",
        "false",
        "Elect a replica outside the ISR when no in-sync replica is alive (availability "
        "over durability: acknowledged records may be lost).",
        choices=("false", "true"),
        topic=True,
    ),
    Setting(
        "segment_ms",
        7 * DAY_MS,
        "A non-empty segment rolls when it is this old (counted from its creation or "
        "from the node's start, whichever is later).",
        unit="ms",
        low=1,
        high=INT64_MAX,
        topic=True,
    ),
    Setting(
        "retention_ms",
        7 * DAY_MS,
        "Segments whose newest record is older than this are deleted.",
        unit="ms",
        low=1,
        high=INT64_MAX,
        minus_one_disables=True,
        topic=True,
    ),
    Setting(
        "retention_bytes",
        -1,
        "Oldest segments are deleted while the partition would still hold this much without them.",
        unit="bytes",
        low=0,
        high=INT64_MAX,
        minus_one_disables=True,
        topic=True,
    ),
    Setting(
        "max_message_bytes",
        MESSAGE_BYTES_DEFAULT,
        "Largest record batch a producer may send (after compression). The default, 4 MiB "
        "- 1 KiB, keeps every batch fetchable by a stock gRPC client (4 MiB receive limit); "
        "larger batches need consumers that raise their limit (max_response_bytes).",
        unit="bytes",
        low=HEADER_BYTES + 8,
        high=1 << 30,
        topic=True,
    ),
    Setting(
        "message_timestamp_after_max_ms",
        3_600_000,
        "A produced record may be at most this far ahead of the leader's clock (else "
        "INVALID_TIMESTAMP): a timestamp far in the future would keep its segment from "
        "ever expiring.",
        unit="ms",
        low=0,
        high=INT64_MAX,
        topic=True,
    ),
    Setting(
        "message_timestamp_before_max_ms",
        -1,
        "A produced record may be at most this far behind the leader's clock (else "
        "INVALID_TIMESTAMP); -1: any time from 1970-01-01 on.",
        unit="ms",
        low=0,
        high=INT64_MAX,
        minus_one_disables=True,
        topic=True,
    ),
    Setting(
        "index_interval_bytes",
        4096,
        "Bytes of log between two offset index entries.",
        unit="bytes",
        low=1,
        high=INT32_MAX,
        topic=True,
    ),
    Setting(
        "flush_policy",
        "os",
        "When appends are fsynced: 'os' leaves it to the operating system (survives a "
        "process crash, not a power loss), 'interval' every flush_interval_ms, 'ack' "
        "before the produce is acknowledged (survives a power loss).",
        choices=tuple(p.value for p in FlushPolicy),
        topic=True,
    ),
    Setting(
        "flush_interval_ms",
        1000,
        "Period of fsync under flush_policy 'interval'.",
        unit="ms",
        low=1,
        high=INT64_MAX,
        topic=True,
    ),
    Setting(
        "cleanup_policy",
        "delete",
        "What removes old records: 'delete' (retention_ms and retention_bytes delete "
        "whole old segments), 'compact' (the log cleaner keeps only the newest record "
        "of each key; records need keys), or 'compact,delete' (both).",
        choices=("delete", "compact", "compact,delete"),
        topic=True,
    ),
    Setting(
        "delete_retention_ms",
        DAY_MS,
        "Compacted topics: how long a tombstone (a record with a null value) is kept "
        "once its segment is older than this, so that consumers see the deletion.",
        unit="ms",
        low=0,
        high=INT64_MAX,
        topic=True,
    ),
    Setting(
        "min_cleanable_dirty_ratio",
        0.5,
        "Compacted topics: the share of the cleanable log written since its last "
        "cleaning at which the cleaner cleans it.",
        low=0.0,
        high=1.0,
        topic=True,
    ),
    Setting(
        "min_compaction_lag_ms",
        0,
        "Compacted topics: a segment is cleaned only once all its records are this "
        "old (by timestamp), so a consumer this far behind still sees every update.",
        unit="ms",
        low=0,
        high=INT64_MAX,
        topic=True,
    ),
)

SETTINGS_BY_NAME: Final = {s.name: s for s in SETTINGS}
TOPIC_SETTINGS: Final = tuple(s.name for s in SETTINGS if s.topic)
KAFKA_TOPIC_CONFIG_NAMES: Final = {
    name: "unclean.leader.election.enable"
    if name == "unclean_leader_election"
    else name.replace("_", ".")
    for name in TOPIC_SETTINGS
}
"""Each topic setting's name in Kafka's spelling (``retention_ms``: ``retention.ms``), as
the Kafka listener shows it and as every front accepts it."""
KAFKA_TOPIC_CONFIGS_NOT_KEPT: Final = {
    "message.format.version": (
        "every batch is kept in record batch format v2 (magic 2), as Kafka 3.x keeps it "
        "whatever this config says; Kafka 4.0 removed the config"
    ),
}
"""Kafka topic configs that a Kafka 3.x broker takes and ignores, each with the reason
the node refuses it by name rather than storing a value that changes nothing."""
_TOPIC_SETTING_OF_NAME: Final = {
    **{kafka: name for name, kafka in KAFKA_TOPIC_CONFIG_NAMES.items()},
    **{name.replace("_", "."): name for name in TOPIC_SETTINGS},
    **{name: name for name in TOPIC_SETTINGS},
}


def topic_setting_name(name: str) -> str:
    """The topic setting ``name`` stands for: its own name (``retention_ms``) or its Kafka
    name (``retention.ms``). INVALID_CONFIG for anything else, naming the valid ones."""
    setting = _TOPIC_SETTING_OF_NAME.get(name)
    if setting is None and name in KAFKA_TOPIC_CONFIGS_NOT_KEPT:
        raise _invalid(f"topic config {name} is not kept: {KAFKA_TOPIC_CONFIGS_NOT_KEPT[name]}")
    if setting is None:
        raise _invalid(
            f"unknown topic config {shown(name)}; valid: {', '.join(TOPIC_SETTINGS)} "
            "(or Kafka's names: retention.ms, cleanup.policy, ...)"
        )
    return setting


def topic_setting_names(configs: Mapping[str, str]) -> dict[str, str]:
    """``configs`` keyed by the settings their names stand for (``topic_setting_name``);
    INVALID_CONFIG when two names stand for the same setting."""
    named: dict[str, str] = {}
    for name, value in configs.items():
        setting = topic_setting_name(name)
        if setting in named:
            raise _invalid(f"topic config {setting} is given twice (as {shown(name)} too)")
        named[setting] = value
    return named


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """The validated configuration of one node (see SETTINGS for meaning and ranges)."""

    node_id: int = 1
    listen: str = DEFAULT_LISTEN
    advertised_address: str = ""
    internal_listen: str = ""
    internal_advertised_address: str = ""
    kafka_listen: str = ""
    kafka_advertised_address: str = ""
    kafka_auto_create_topics: str = "false"
    kafka_security_protocol: str = "PLAINTEXT"
    kafka_connections_max: int = 4096
    kafka_connections_per_host_max: int = 1024
    kafka_connections_per_host_overrides: str = ""
    kafka_prelogin_request_rate_per_host_max: int = 200
    raft_listen: str = ""
    metrics_listen: str = ""
    data_dir: str = "./data"
    rack: str = ""
    concurrent_calls_max: int = 1024
    streams_max: int = 896
    streams_per_connection_max: int = 100
    sealed_segment_files_max: int = 256
    stream_buffer_bytes_max: int = 64 * MiB
    request_bytes_max: int = 256 * MiB
    fetch_bytes_max: int = 64 * MiB
    fetch_bytes_default: int = 4 * MiB
    fetch_wait_ms_max: int = 30_000
    request_timeout_ms: int = 30_000
    partitions_max: int = 10_000
    partitions_per_node_max: int = 10_000
    topics_max: int = 10_000
    default_partitions: int = 1
    default_replication_factor: int = 1
    quorum: str = ""
    roles: str = "controller,broker"
    controller_addresses: str = ""
    cluster_secret: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    tls_client_auth: str = "none"
    tls_principal_mapping: str = "cn"
    authorizer: str = "none"
    super_users: str = ""
    connection_rate_per_host_max: int = 0
    credentials_over_plaintext: str = "refuse"
    sasl_enabled_mechanisms: str = "SCRAM-SHA-256,PLAIN"
    sasl_session_lifetime_ms: int = 900_000
    raft_election_timeout_ms: int = 300
    replica_lag_ms_max: int = 10_000
    replica_fetch_wait_ms_max: int = 500
    replica_fetch_bytes_max: int = 8 * MiB
    broker_heartbeat_interval_ms: int = 500
    broker_session_timeout_ms: int = 3000
    leader_rebalance_interval_ms: int = 300_000
    leader_imbalance_per_broker_percent: int = 10
    controlled_shutdown_timeout_ms: int = 10_000
    offsets_topic_partitions: int = 50
    offsets_topic_replication_factor: int = 3
    group_session_timeout_ms: int = 45_000
    group_heartbeat_interval_ms: int = 500
    group_members_max: int = 1000
    offsets_commit_timeout_ms: int = 5000
    offsets_retention_ms: int = 7 * DAY_MS
    producer_id_expiration_ms: int = DAY_MS
    log_cleaner_io_max_bytes_per_s: int = 16 * MiB
    log_cleaner_keys_max: int = 1_000_000
    log_cleaner_backoff_ms: int = 15_000
    retention_check_interval_ms: int = 60_000
    log_dir_free_bytes_min: int = 16 * MiB
    log_level: str = "info"
    segment_bytes: int = 1 << 30
    min_insync_replicas: int = 1
    unclean_leader_election: str = "false"
    segment_ms: int = 7 * DAY_MS
    retention_ms: int = 7 * DAY_MS
    retention_bytes: int = -1
    max_message_bytes: int = MESSAGE_BYTES_DEFAULT
    message_timestamp_after_max_ms: int = 3_600_000
    message_timestamp_before_max_ms: int = -1
    index_interval_bytes: int = 4096
    flush_policy: str = "os"
    flush_interval_ms: int = 1000
    cleanup_policy: str = "delete"
    delete_retention_ms: int = DAY_MS
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0

    def __post_init__(self) -> None:
        for setting in SETTINGS:
            setting.parse(getattr(self, setting.name), "config")
        if self.fetch_bytes_default > self.fetch_bytes_max:
            raise _invalid(
                f"fetch_bytes_default ({self.fetch_bytes_default}) exceeds fetch_bytes_max "
                f"({self.fetch_bytes_max})"
            )
        if self.streams_max >= self.concurrent_calls_max:
            raise _invalid(
                f"streams_max ({self.streams_max}) must be below concurrent_calls_max "
                f"({self.concurrent_calls_max}): the difference is kept for short calls"
            )
        if self.offsets_topic_partitions > self.partitions_max:
            raise _invalid(
                f"offsets_topic_partitions ({self.offsets_topic_partitions}) exceeds "
                f"partitions_max ({self.partitions_max}): __consumer_offsets could never be "
                "created, and no group served"
            )
        if self.max_message_bytes + MiB > self.request_bytes_max:
            raise _invalid(
                f"max_message_bytes ({self.max_message_bytes}) must leave 1 MiB of room under "
                f"request_bytes_max ({self.request_bytes_max})"
            )

        if self.internal_advertised_address and (
            not self.internal_listen
            or parse_address(self.internal_listen, "internal_listen")[1] == 0
        ):
            raise _invalid(
                "internal_advertised_address needs internal_listen with a fixed port (the "
                "port other nodes are told must be the one bound), e.g. internal_listen "
                "0.0.0.0:7701 with internal_advertised_address node1:7701"
            )
        if self.kafka_advertised_address and (
            not self.kafka_listen or parse_address(self.kafka_listen, "kafka_listen")[1] == 0
        ):
            raise _invalid(
                "kafka_advertised_address needs kafka_listen with a fixed port (the port Kafka "
                "clients are told must be the one bound), e.g. kafka_listen 0.0.0.0:9092 with "
                "kafka_advertised_address node1:9092"
            )
        if self.kafka_security_protocol == "SASL_PLAINTEXT" and (
            self.credentials_over_plaintext != "allow"
        ):
            raise _invalid(
                "kafka_security_protocol SASL_PLAINTEXT sends passwords (PLAIN) and SCRAM "
                "proofs in the clear: set credentials_over_plaintext = allow to accept that "
                "(for a network only trusted hosts reach)"
            )
        kafka_tls = self.kafka_security_protocol in ("SSL", "SASL_SSL")
        if self.kafka_listen and self.tls_cert_file and not kafka_tls:
            raise _invalid(
                f"kafka_security_protocol {self.kafka_security_protocol} on a node with TLS "
                "(tls_cert_file) would let Kafka clients past the TLS the other listeners "
                "require: set kafka_security_protocol to SSL or SASL_SSL"
            )
        if self.kafka_listen and kafka_tls and not self.tls_cert_file:
            raise _invalid(
                f"kafka_security_protocol {self.kafka_security_protocol} needs the node's TLS "
                "certificate (tls_cert_file, tls_key_file): set them, or use PLAINTEXT or "
                "SASL_PLAINTEXT"
            )
        parse_host_counts(self.kafka_connections_per_host_overrides)
        for principal in self.super_user_set:
            kind, _, name = principal.partition(":")
            if kind != "User" or not name or name == "*":
                raise _invalid(
                    f"super_users entry {principal[:80]!r} must be User:<name>, e.g. "
                    "super_users = 'User:admin,User:ops'"
                )
        voters = self.quorum_voters  # parses and checks the quorum
        if self.is_controller and self.node_id not in voters:
            raise _invalid(
                f"node {self.node_id} has the controller role but is not in quorum "
                f"{self.quorum!r}; add {self.node_id}@HOST:PORT or use roles=broker"
            )
        if not self.is_controller and not self.controller_addresses:
            raise _invalid(
                "a broker-only node needs controller_addresses (the internal_listen HOST:PORT of "
                "controller nodes)"
            )
        for address in filter(None, self.controller_addresses.split(",")):
            parse_address(address, "controller_addresses entry")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise _invalid(
                "tls_cert_file and tls_key_file go together (TLS needs the certificate and its "
                f"key; given: cert {self.tls_cert_file!r}, key {self.tls_key_file!r})"
            )
        if not self.tls and (self.tls_ca_file or self.tls_client_auth != "none"):
            raise _invalid(
                "tls_ca_file and tls_client_auth need TLS: set tls_cert_file and tls_key_file"
            )
        if self.tls_client_auth == "required" and not self.tls_ca_file:
            raise _invalid(
                "tls_client_auth required needs tls_ca_file, the CA certificates that sign the "
                "clients' certificates"
            )
        if self.tls and not self.tls_ca_file:
            raise _invalid(
                "TLS needs tls_ca_file, the CA certificates that sign the nodes' certificates: "
                "a node verifies every other node with it, and itself (a combined node "
                "registers with its own controller over TLS); for a certificate from a public "
                "CA, point it at the system's bundle (e.g. /etc/ssl/certs/ca-certificates.crt)"
            )
        if self.needs_cluster_secret and not self.cluster_secret:
            raise _invalid(
                "a multi-node cluster needs cluster_secret, the same on every node (it "
                "authenticates the Raft transport and the inter-broker listener): set "
                "HEADWATER_CLUSTER_SECRET or cluster_secret in the config file, e.g. to the "
                "output of: python3 -c 'import secrets; print(secrets.token_hex(32))'"
            )

    @property
    def tls(self) -> bool:
        """Do the gRPC listeners speak TLS (tls_cert_file and tls_key_file set)?"""
        return bool(self.tls_cert_file)

    @property
    def super_user_set(self) -> frozenset[str]:
        """The principals of ``super_users``."""
        return frozenset(p.strip() for p in self.super_users.split(",") if p.strip())

    @property
    def is_controller(self) -> bool:
        return "controller" in self.roles.split(",")

    @property
    def is_broker(self) -> bool:
        return "broker" in self.roles.split(",")

    @property
    def quorum_voters(self) -> dict[int, str]:
        """Raft address of each voter by node id (see the ``quorum`` setting)."""
        return parse_quorum(self.quorum, self.node_id, self.listen)

    @property
    def loopback_only(self) -> bool:
        """Are the listeners and every quorum address on loopback (one machine)?"""
        hosts = [parse_address(a, "address")[0] for a in self.quorum_voters.values()]
        hosts.append(parse_address(self.listen, "listen")[0])
        if self.internal_listen:
            hosts.append(parse_address(self.internal_listen, "internal_listen")[0])
        if self.raft_listen:
            hosts.append(parse_address(self.raft_listen, "raft_listen")[0])
        return all(_is_loopback(h) for h in hosts)

    @property
    def needs_cluster_secret(self) -> bool:
        """A broker-only node, or a voter of a quorum that reaches beyond this machine.
        (A quorum of several voters all on loopback may run without one: the nodes then
        share one generated into a file only their user may read;
        ``headwater serve`` warns. One node alone generates a real one.)"""
        if not self.is_controller:
            return True
        return len(self.quorum_voters) > 1 and not self.loopback_only

    @property
    def internal_listen_address(self) -> str:
        """What the inter-broker listener binds: ``internal_listen``, or the listen host
        with port 0 (the system picks)."""
        if self.internal_listen:
            return self.internal_listen
        host, _port = parse_address(self.listen, "listen")
        return format_address(host, 0)

    @property
    def client_address(self) -> str:
        return self.advertised_address or self.listen

    def kafka_address(self, kafka_port: int) -> str:
        """The HOST:PORT Kafka clients are told for this node once the Kafka listener is
        bound on ``kafka_port`` (the port the system picked when kafka_listen's is 0):
        ``kafka_advertised_address``, or else the kafka_listen host with ``kafka_port``, a
        wildcard host (0.0.0.0, ::) replaced by the ``client_address`` host, as for the
        inter-broker listener. "" when there is no Kafka listener (``kafka_listen`` empty)."""
        if not self.kafka_listen:
            return ""
        if self.kafka_advertised_address:
            return self.kafka_advertised_address
        host = self.kafka_listen.strip().rpartition(":")[0]
        if host in ("0.0.0.0", "[::]", "::"):
            # A wildcard is not an address clients can dial: they get the client host.
            host = self.client_address.rpartition(":")[0]
        return f"{host}:{kafka_port}"

    def topic_defaults(self) -> dict[str, str]:
        return {name: str(getattr(self, name)) for name in TOPIC_SETTINGS}

    def log_config(self, overrides: Mapping[str, str] | None = None) -> LogConfig:
        """The effective LogConfig of a topic: these defaults with its overrides applied."""
        values = parse_topic_configs(overrides or {}, self)
        return LogConfig(
            segment_bytes=int(values["segment_bytes"]),
            segment_ms=int(values["segment_ms"]),
            retention_ms=int(values["retention_ms"]),
            retention_bytes=int(values["retention_bytes"]),
            max_message_bytes=int(values["max_message_bytes"]),
            message_timestamp_after_max_ms=int(values["message_timestamp_after_max_ms"]),
            message_timestamp_before_max_ms=int(values["message_timestamp_before_max_ms"]),
            index_interval_bytes=int(values["index_interval_bytes"]),
            flush_policy=FlushPolicy(values["flush_policy"]),
            flush_interval_ms=int(values["flush_interval_ms"]),
            producer_id_expiration_ms=self.producer_id_expiration_ms,
            cleanup_policy=values["cleanup_policy"],
            delete_retention_ms=int(values["delete_retention_ms"]),
            min_cleanable_dirty_ratio=float(values["min_cleanable_dirty_ratio"]),
            min_compaction_lag_ms=int(values["min_compaction_lag_ms"]),
        )


assert [f.name for f in dataclasses.fields(NodeConfig)] == [s.name for s in SETTINGS]
assert all(getattr(NodeConfig(), s.name) == s.default for s in SETTINGS)


def _is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


LEGACY_NAMES: Final = {"raft_secret": "cluster_secret"}
"""Older names still read (file key or HEADWATER_ variable) when the new one is absent."""


def canonical_topic_configs(configs: Mapping[str, str], defaults: NodeConfig) -> dict[str, str]:
    """The overrides ``configs``, checked (``parse_topic_configs``), keyed by the node's
    setting names and written as the node writes them ("1000", never "01000"): what a
    topic's metadata stores."""
    named = topic_setting_names(configs)
    values = parse_topic_configs(named, defaults)
    return {name: values[name] for name in named}


def parse_topic_configs(configs: Mapping[str, str], defaults: NodeConfig) -> dict[str, str]:
    """Validate per-topic overrides (by the node's names or Kafka's); return every topic
    setting's effective value as text, by the node's names."""
    values = defaults.topic_defaults()
    for name, raw in topic_setting_names(configs).items():
        values[name] = str(SETTINGS_BY_NAME[name].parse(raw, "topic config"))
    if int(values["max_message_bytes"]) + MiB > defaults.request_bytes_max:
        raise _invalid(
            f"max_message_bytes {values['max_message_bytes']} must leave 1 MiB under the "
            f"node's request_bytes_max ({defaults.request_bytes_max})"
        )
    return values


def load(
    file: Path | None,
    environ: Mapping[str, str],
    flags: Mapping[str, object],
) -> NodeConfig:
    """Merge defaults < TOML file < HEADWATER_* environment < flags into a NodeConfig.

    ``flags`` holds only the flags given (None values are ignored).
    """
    values: dict[str, Any] = {}
    if file is not None:
        try:
            document = tomllib.loads(file.read_text())
        except OSError as exc:
            raise _invalid(f"cannot read config file {file}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise _invalid(f"config file {file} is not valid TOML: {exc}") from exc
        section = dict(document.get("headwater", document))
        for old, new in LEGACY_NAMES.items():
            if old in section:
                value = section.pop(old)
                section.setdefault(new, value)
        unknown = sorted(set(section) - set(SETTINGS_BY_NAME))
        if unknown:
            raise _invalid(f"unknown key(s) in {file}: {', '.join(unknown)}")
        values.update({k: SETTINGS_BY_NAME[k].parse(v, str(file)) for k, v in section.items()})
    for old, new in LEGACY_NAMES.items():
        raw = environ.get(f"HEADWATER_{old.upper()}")
        if raw is not None and f"HEADWATER_{new.upper()}" not in environ:
            values[new] = SETTINGS_BY_NAME[new].parse(raw, f"HEADWATER_{old.upper()}")
    for setting in SETTINGS:
        raw = environ.get(f"HEADWATER_{setting.name.upper()}")
        if raw is not None:
            values[setting.name] = setting.parse(raw, f"HEADWATER_{setting.name.upper()}")
    for name, flag in flags.items():
        if flag is not None:
            values[name] = SETTINGS_BY_NAME[name].parse(flag, f"--{name.replace('_', '-')}")
    return NodeConfig(**values)


COMPACTION_AND_PRODUCERS_DOC: Final = """
## Log compaction

A topic with `cleanup_policy` `compact` keeps, for every key, its newest record: a table
rather than a history (Kafka's compacted topics; a KTable's changelog). `compact,delete`
does both: compaction, and retention by `retention_ms`/`retention_bytes` on top. With
`compact` alone nothing is deleted by age or size.

- Records of a compacted topic need a key: a batch with a keyless record is refused with
  `INVALID_RECORD`. A record with a null value (a *tombstone*) deletes its key: it is kept
  `delete_retention_ms` (1 day) once its segment is older than that, so that consumers
  see the deletion, then removed with everything before it of that key.
- Each node runs one cleaner thread over the compacted partitions it holds, leader or
  follower (each replica compacts its own copy; they converge on the same records). It
  picks the partition with the largest dirty share of its cleanable log once that share
  reaches the topic's `min_cleanable_dirty_ratio`, and looks again every
  `log_cleaner_backoff_ms` when none needs it. Its reads and writes together are bounded
  by `log_cleaner_io_max_bytes_per_s`; its memory by `log_cleaner_keys_max` keys per pass
  (more dirty keys than that take several passes).
- Only closed segments wholly below the high watermark whose records are all older than
  `min_compaction_lag_ms` are cleaned: the active segment never is, nor anything a
  follower could still have to truncate.
- Offsets never change and order is kept: the newest record of a key keeps its offset, so
  a compacted log has gaps. A consumer reading it sees increasing offsets with holes; a
  fetch from an offset that was removed returns the next record kept.
- A crash in the middle of a cleaning loses nothing: cleaned segments are written into
  `cleaning/` in the partition folder and swapped in atomically (`swap/`); the next start
  finishes or drops an interrupted swap.
- `headwater topics describe T` shows each partition's dirty ratio (`--json`: also the
  cleaned offset). `__consumer_offsets` is compacted (see docs/groups.md).

## Idempotent producers

`producer_id_expiration_ms` is how long a partition remembers an idempotent producer
(its epoch, next sequence and last 5 batches) after its last batch's timestamp; see the
README and docs/record-batch-format.md ("Idempotent producers"). A producer forgotten
this way has its next batch refused with `UNKNOWN_PRODUCER_ID`, and the Python producers
start that partition over at a new epoch. `headwater topics describe T --json` lists the
producers each partition tracks.
"""


def render_markdown() -> str:
    """docs/configuration.md, generated from SETTINGS."""
    lines = [
        "# Configuration",
        "",
        "Generated from `node/config.py` by `python -m headwater.node.config`; do not edit.",
        "",
        "A node reads, lowest to highest precedence: built-in defaults, the TOML file given "
        "with `headwater serve --config FILE` (keys at the top level or under `[headwater]`), "
        "`HEADWATER_<KEY>` environment variables (for example `HEADWATER_DATA_DIR=/var/hw`), "
        "and command-line flags (`--data-dir`, `--listen`, `--node-id`). Invalid values "
        "stop the node with a message that names the key, its source and the valid range.",
        "",
        "Topic-level keys are the node's defaults for new topics; each topic may override "
        "them at creation: `headwater topics create NAME --config retention_ms=3600000`.",
        "",
        "| key | default | unit | valid | topic-level | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        if s.choices:
            valid = ", ".join(f"`{c}`" for c in s.choices)
        elif isinstance(s.default, float):
            valid = f"[{s.low}, {s.high}]"
        elif isinstance(s.default, int):
            low = s.low if s.low is not None else -INT64_MAX
            high = s.high if s.high is not None else INT64_MAX
            valid = f"[{low}, {high}]" + (" or -1 (no limit)" if s.minus_one_disables else "")
        else:
            valid = "text"
        lines.append(
            f"| `{s.name}` | `{s.default}` | {s.unit} | {valid} | "
            f"{'yes' if s.topic else ''} | {s.doc} |"
        )
    return "\n".join(lines) + "\n" + COMPACTION_AND_PRODUCERS_DOC


if __name__ == "__main__":
    print(render_markdown(), end="")
