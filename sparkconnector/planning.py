"""Offset planning for the Spark source: options, offsets, read limits and input ranges.

Pure: no I/O, no pyspark. The data source classes (``headwater.sparkconnector.source``)
fetch the facts (partitions, earliest and latest offsets, topic ids) and ask this module
what to read.

**Options** keep the names of Spark's Kafka source where the meaning is the same
(``subscribe``, ``subscribePattern``, ``assign``, ``startingOffsets``, ``endingOffsets``,
``startingTimestamp``, ``startingOffsetsByTimestamp``, ``maxOffsetsPerTrigger``,
``minOffsetsPerTrigger``, ``maxTriggerDelay``, ``failOnDataLoss``, ``includeHeaders``,
``minPartitions``, ``maxRecordsPerPartition``); the bootstrap addresses are
``headwater.bootstrap.servers`` (also accepted: ``bootstrap.servers``,
``kafka.bootstrap.servers``, ``bootstrap``).

**Per-partition JSON** is Kafka's: ``{"topic": {"0": 23, "1": -2}}``, where -2 means
earliest and -1 latest (``startingOffsets``, ``endingOffsets``);
``{"topic": {"0": 1700000000000}}`` gives timestamps in ms (``startingOffsetsByTimestamp``).

**Streaming offsets** (what Spark checkpoints) are
``{"offsets": {"topic": {"0": 23}}, "topicIds": {"topic": "<id>"}}``: the next offset to
read of every partition, and the id of every topic, so that a topic deleted and created
again under the same name is noticed (data loss) instead of being read from stale offsets.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from headwater.shared.errors import HeadwaterError
from headwater.shared.tls import ClientSecurity
from headwater.shared.topics import check_group_id

EARLIEST: Final = -2
LATEST: Final = -1
BOOTSTRAP_KEYS: Final = (
    "headwater.bootstrap.servers",
    "bootstrap.servers",
    "kafka.bootstrap.servers",
    "bootstrap",
)
DEFAULT_MAX_TRIGGER_DELAY_MS: Final = 15 * 60 * 1000
FETCH_BYTES_DEFAULT: Final = 8 << 20
FETCH_BYTES_MAX: Final = 64 << 20

Key = tuple[str, int]  # (topic, partition)


class OptionError(ValueError):
    """An option is missing, malformed or out of range; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Subscription:
    """Which partitions to read: named topics, topics matching a pattern, or an explicit
    list of partitions (``assigned``)."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[Key, ...] = ()

    def topics_from(self, existing: list[str]) -> list[str]:
        """The subscribed topics among ``existing`` (names that exist now)."""
        if self.assigned:
            wanted = {t for t, _ in self.assigned}
            return sorted(t for t in existing if t in wanted)
        if self.pattern is not None:
            compiled = re.compile(self.pattern)
            return sorted(t for t in existing if compiled.fullmatch(t) and not t.startswith("__"))
        return sorted(t for t in existing if t in self.topics)

    def partitions_from(self, counts: Mapping[str, int]) -> list[Key]:
        """Every subscribed partition, given the partition count of each existing topic."""
        if self.assigned:
            return sorted(k for k in self.assigned if k[0] in counts and k[1] < counts[k[0]])
        return sorted((t, p) for t in self.topics_from(list(counts)) for p in range(counts[t]))

    def missing_partitions(self, counts: Mapping[str, int]) -> list[Key]:
        """Assigned partitions of existing topics that do not exist (``assign`` names
        partitions; a topic's count only grows)."""
        return sorted(k for k in self.assigned if k[0] in counts and k[1] >= counts[k[0]])

    def named_topics(self) -> list[str]:
        """Topics named outright (not by pattern): these must exist."""
        if self.assigned:
            return sorted({t for t, _ in self.assigned})
        return list(self.topics)


@dataclass(frozen=True, slots=True)
class StartSpec:
    """Where a new query starts, or a batch read ends: ``kind`` is earliest, latest,
    offsets, timestamp or timestamps; ``per_partition`` holds offsets (or timestamps) by
    partition, and names every subscribed partition (Kafka's rule, checked by
    ``check_partition_map`` once the partitions are known); ``option`` is the option that
    gave it, for messages."""

    kind: str = "latest"
    per_partition: Mapping[Key, int] = field(default_factory=dict)
    timestamp_ms: int = 0
    option: str = "startingOffsets"


NO_MATCH_ERROR: Final = "error"
NO_MATCH_LATEST: Final = "latest"


@dataclass(frozen=True, slots=True)
class SourceOptions:
    bootstrap: str
    subscription: Subscription
    starting: StartSpec
    ending: StartSpec
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    fail_on_data_loss: bool = True
    no_match_strategy: str = NO_MATCH_ERROR
    """startingOffsetsByTimestampStrategy: what a partition without a record as recent as
    its starting timestamp does: fail the query (error) or start at its end (latest)."""
    include_headers: bool = False
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fetch_max_bytes: int = FETCH_BYTES_DEFAULT
    group_id: str | None = None
    """Streams: commit each finished micro-batch's end offsets to this consumer group."""
    security: ClientSecurity = field(default_factory=ClientSecurity)
    """TLS settings of every client the source makes (``security_options``)."""


# --------------------------------------------------------------------------- options

SAME: Final = "same"
"""The option means what it means for Spark's Kafka source."""
DIFFERS: Final = "differs"
"""Supported, with a difference the row says."""
OWN: Final = "Headwater"
"""Headwater's own option (Kafka's source has none like it)."""
REFUSED: Final = "refused"
"""Given, it fails the query when the reader is created, with the row's reason."""


@dataclass(frozen=True, slots=True)
class OptionRow:
    """One source option: its name (Spark's options are case-insensitive), how Headwater
    supports it, and what it means or why it is refused."""

    name: str
    support: str
    meaning: str


SECURITY_ROWS: Final[tuple[OptionRow, ...]] = (
    # Security: Kafka's client settings that Headwater honours (the escape hatch for
    # kafka.* settings), and Headwater's names for them.
    OptionRow(
        "kafka.security.protocol",
        DIFFERS,
        "`PLAINTEXT`, `SSL`, `SASL_SSL` or `SASL_PLAINTEXT` (a user's password); also "
        "`headwater.security.protocol`, `security.protocol` (docs/security.md)",
    ),
    OptionRow("headwater.security.protocol", OWN, "as `kafka.security.protocol`"),
    OptionRow("security.protocol", OWN, "as `kafka.security.protocol`"),
    OptionRow(
        "kafka.sasl.jaas.config",
        DIFFERS,
        'a user\'s credentials: `...ScramLoginModule required username="..." '
        'password="...";` (or `PlainLoginModule`)',
    ),
    OptionRow(
        "kafka.sasl.mechanism",
        DIFFERS,
        "`SCRAM-SHA-256` (default: a login per node, the password never travels) or `PLAIN` "
        "(the password with every call)",
    ),
    OptionRow("headwater.username", OWN, "a user's name (with `headwater.password`)"),
    OptionRow("headwater.password", OWN, "the user's password"),
    OptionRow(
        "kafka.ssl.truststore.location",
        DIFFERS,
        "PEM file of the CAs that sign the nodes' certificates; also `headwater.tls.ca.file`",
    ),
    OptionRow("kafka.ssl.truststore.type", DIFFERS, "`PEM` only"),
    OptionRow(
        "kafka.ssl.keystore.location",
        DIFFERS,
        "PEM file holding the client's certificate chain and key (mutual TLS)",
    ),
    OptionRow("kafka.ssl.keystore.type", DIFFERS, "`PEM` only"),
    OptionRow(
        "kafka.ssl.key.password",
        DIFFERS,
        "refused when not empty: keys must be unencrypted PEM",
    ),
    OptionRow(
        "kafka.ssl.keystore.password",
        DIFFERS,
        "refused when not empty: keys must be unencrypted PEM",
    ),
    OptionRow("headwater.tls.ca.file", OWN, "as `kafka.ssl.truststore.location`"),
    OptionRow("headwater.tls.cert.file", OWN, "the client's certificate (mutual TLS)"),
    OptionRow("headwater.tls.key.file", OWN, "the client's key (mutual TLS)"),
    OptionRow(
        "headwater.tls.server.name",
        OWN,
        "name to check the nodes' certificates against instead of the host dialled",
    ),
)
"""Security options of the source and the sink alike."""

SOURCE_OPTIONS: Final[tuple[OptionRow, ...]] = (
    # Spark's Kafka source (spark-sql-kafka-0-10, Spark 4), in its documentation's order.
    OptionRow("assign", SAME, 'the partitions to read, JSON `{"topic": [0, 1]}`'),
    OptionRow("subscribe", SAME, "a comma-separated list of topics"),
    OptionRow(
        "subscribePattern",
        DIFFERS,
        "a Python regular expression (not Java's) matched against the whole topic name; "
        "internal topics (`__` prefix) are never matched; new matching topics are picked up",
    ),
    OptionRow(
        "kafka.bootstrap.servers",
        DIFFERS,
        "`host:port[,host:port]` of Headwater nodes' client listeners, required as in "
        "Kafka's source (there is no default); also `headwater.bootstrap.servers`, "
        "`bootstrap.servers`, `bootstrap`",
    ),
    OptionRow(
        "startingTimestamp",
        SAME,
        "start every partition at its first record at or after this time (ms); takes "
        "precedence over `startingOffsetsByTimestamp` and `startingOffsets`",
    ),
    OptionRow(
        "startingOffsetsByTimestamp",
        SAME,
        'the same per partition, JSON `{"topic": {"0": 1700000000000}}` naming every '
        "subscribed partition; takes precedence over `startingOffsets`",
    ),
    OptionRow(
        "startingOffsets",
        SAME,
        "`latest` (streams' default), `earliest` (batch default) or JSON "
        '`{"topic": {"0": 23, "1": -2}}` (-2 earliest, -1 latest, not for batch reads) '
        "naming every subscribed partition; an offset past the partition's end is data "
        "loss (`failOnDataLoss`)",
    ),
    OptionRow(
        "endingTimestamp",
        SAME,
        "batch reads: end every partition before its first record at or after this time "
        "(ms), at its end when there is none; takes precedence over "
        "`endingOffsetsByTimestamp` and `endingOffsets`",
    ),
    OptionRow(
        "endingOffsetsByTimestamp",
        SAME,
        "batch reads: the same per partition, JSON as `startingOffsetsByTimestamp`; takes "
        "precedence over `endingOffsets`",
    ),
    OptionRow(
        "endingOffsets",
        SAME,
        "batch reads: `latest` (default) or JSON as `startingOffsets` (-2 is not allowed); "
        "an offset past the partition's end is data loss (`failOnDataLoss`)",
    ),
    OptionRow(
        "failOnDataLoss",
        SAME,
        "`true` (default): fail when records may be lost: unread records deleted "
        "(retention), a topic recreated, a given offset past a partition's end; `false`: "
        "warn and go on (from the log start, or the end)",
    ),
    OptionRow(
        "kafkaConsumer.pollTimeoutMs",
        REFUSED,
        "not needed: executors fetch over gRPC streams with their own deadlines; remove it",
    ),
    OptionRow(
        "fetchOffset.numRetries",
        REFUSED,
        "not needed: the client retries offset requests for up to its request timeout; remove it",
    ),
    OptionRow(
        "fetchOffset.retryIntervalMs",
        REFUSED,
        "not needed: the client retries offset requests with its own backoff; remove it",
    ),
    OptionRow(
        "maxOffsetsPerTrigger",
        SAME,
        "records per micro-batch at most, split across partitions in proportion to their backlog",
    ),
    OptionRow(
        "minOffsetsPerTrigger",
        SAME,
        "records per micro-batch at least, waiting up to `maxTriggerDelay`",
    ),
    OptionRow("maxTriggerDelay", SAME, "default `15m`"),
    OptionRow("minPartitions", SAME, "split large offset ranges into at least this many tasks"),
    OptionRow(
        "maxRecordsPerPartition", SAME, "split offset ranges into tasks of at most this many"
    ),
    OptionRow(
        "groupIdPrefix",
        REFUSED,
        "not supported: the source reads without a consumer group; give `groupId` to see "
        "a stream's lag in a group",
    ),
    OptionRow(
        "kafka.group.id",
        REFUSED,
        "not supported: the source reads without a consumer group; give `groupId` to see "
        "a stream's lag in a group",
    ),
    OptionRow("includeHeaders", SAME, "add `headers: array<struct<key: string, value: binary>>`"),
    OptionRow(
        "startingOffsetsByTimestampStrategy",
        SAME,
        "`error` (default): a partition without a record as recent as its starting "
        "timestamp fails the query; `latest`: it starts at its end",
    ),
    # Headwater's own.
    OptionRow("headwater.bootstrap.servers", OWN, "as `kafka.bootstrap.servers`"),
    OptionRow("bootstrap.servers", OWN, "as `kafka.bootstrap.servers`"),
    OptionRow("bootstrap", OWN, "as `kafka.bootstrap.servers`"),
    OptionRow(
        "fetchMaxBytes",
        OWN,
        f"bytes per fetch from a partition leader; default {FETCH_BYTES_DEFAULT >> 20} MiB, at "
        f"most {FETCH_BYTES_MAX >> 20} MiB",
    ),
    OptionRow(
        "groupId",
        OWN,
        "streams: also commit each finished micro-batch's end offsets to this consumer "
        "group, so that `headwater groups describe GROUP` shows the query's lag",
    ),
    *SECURITY_ROWS,
)
"""Every option the source takes or refuses (``docs/spark.md`` is generated from it)."""

SINK_OPTIONS: Final[tuple[OptionRow, ...]] = (
    # Spark's Kafka sink (spark-sql-kafka-0-10, Spark 4), then Spark's own.
    OptionRow(
        "kafka.bootstrap.servers",
        DIFFERS,
        "`host:port[,host:port]` of Headwater nodes' client listeners, required as in "
        "Kafka's sink; also `headwater.bootstrap.servers`, `bootstrap.servers`, `bootstrap`",
    ),
    OptionRow(
        "topic",
        SAME,
        "the topic every row is written to; it overrides a `topic` column, which is "
        "used without it",
    ),
    OptionRow(
        "checkpointLocation",
        SAME,
        "streams: the query's checkpoint (Spark's option); it also names the sink's state, "
        "so that a replayed micro-batch is not written twice",
    ),
    OptionRow(
        "includeHeaders",
        DIFFERS,
        "taken and not needed: a `headers` column is written whenever the rows have one",
    ),
    OptionRow(
        "queryName",
        SAME,
        "streams: the query's name (Spark's option, which Spark passes to the sink); the "
        "sink does not use it",
    ),
    OptionRow(
        "kafka.acks",
        REFUSED,
        "not needed: the sink always writes with acks=all (idempotent, exactly once for "
        "replayed micro-batches)",
    ),
    OptionRow(
        "kafka.compression.type",
        REFUSED,
        "not supported: the sink writes uncompressed batches",
    ),
    OptionRow(
        "kafka.linger.ms",
        REFUSED,
        "not needed: the sink sends each chunk of `batchBytes` when it is full",
    ),
    OptionRow(
        "kafka.partitioner.class",
        REFUSED,
        "not supported: records go to their `partition` column, else Kafka's murmur2 "
        "partition of their key, else one partition per Spark task",
    ),
    OptionRow(
        "path",
        OWN,
        "batch writes: `save(path)` names the sink's state, as `sinkId` does (Spark passes "
        "it as an option)",
    ),
    OptionRow("headwater.bootstrap.servers", OWN, "as `kafka.bootstrap.servers`"),
    OptionRow("bootstrap.servers", OWN, "as `kafka.bootstrap.servers`"),
    OptionRow("bootstrap", OWN, "as `kafka.bootstrap.servers`"),
    OptionRow(
        "sinkId",
        OWN,
        "names the sink's state (records what each micro-batch wrote, for replays); "
        "default: the checkpoint location, else `path`",
    ),
    OptionRow(
        "batchBytes",
        OWN,
        "bytes per appended batch; default 1 MiB, from 1 KiB to 4 MiB - 1 KiB (the "
        "topics' default `max_message_bytes`)",
    ),
    *SECURITY_ROWS,
)
"""Every option the sink takes (``docs/spark.md`` is generated from it)."""

_SOURCE_OPTION_ROWS: Final = {row.name.lower(): row for row in SOURCE_OPTIONS}
_SINK_OPTION_ROWS: Final = {row.name.lower(): row for row in SINK_OPTIONS}


def check_option_names(options: Mapping[str, str], sink: bool = False) -> None:
    """Refuse a refused option with its reason, and an unknown one (a typo, a Kafka
    client setting Headwater does not honour) with the closest valid names and the full
    list: an option that does nothing must not look as if it did. ``sink``: check
    against the sink's options instead of the source's."""
    rows = _SINK_OPTION_ROWS if sink else _SOURCE_OPTION_ROWS
    for name in options:
        row = rows.get(name.lower())
        if row is not None:
            if row.support == REFUSED:
                raise OptionError(f"option {row.name} is refused: {row.meaning}")
            continue
        valid = [r.name for r in rows.values() if r.support != REFUSED]
        close = difflib.get_close_matches(name, valid, n=3, cutoff=0.75)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise OptionError(
            f"unknown option {name!r}; {hint}valid options: {', '.join(valid)} (docs/spark.md)"
        )


def options_table_markdown(rows: tuple[OptionRow, ...] = SOURCE_OPTIONS) -> str:
    """Option rows (the source's by default) as a Markdown table of ``docs/spark.md``."""
    lines = ["| option | support | meaning |", "|---|---|---|"]
    lines += [f"| `{r.name}` | {r.support} | {r.meaning} |" for r in rows]
    return "\n".join(lines)


SECURITY_OPTIONS: Final = {
    "protocol": ("headwater.security.protocol", "kafka.security.protocol", "security.protocol"),
    "ca_file": ("headwater.tls.ca.file", "kafka.ssl.truststore.location"),
    "cert_file": ("headwater.tls.cert.file", "kafka.ssl.keystore.location"),
    "key_file": ("headwater.tls.key.file", "kafka.ssl.keystore.location"),
    "server_name": ("headwater.tls.server.name",),
    "username": ("headwater.username",),
    "password": ("headwater.password",),
}
"""Option names of each TLS setting, Headwater's first, then Kafka's. Kafka's keystore
is one PEM file holding the client's certificate chain and key (``ssl.keystore.type``
PEM); its truststore a PEM file of CA certificates (``ssl.truststore.type`` PEM)."""


def security_options(
    options: Mapping[str, str], environment: ClientSecurity | None = None
) -> ClientSecurity:
    """The TLS settings the options give; unset ones come from ``environment`` (the
    driver's HEADWATER_SECURITY_PROTOCOL and HEADWATER_TLS_*, resolved once here so that
    executors use what the driver was given). OptionError names a bad value."""
    for kind in ("truststore", "keystore"):
        store_type = _get(options, f"kafka.ssl.{kind}.type")
        if store_type is not None and store_type.strip().upper() != "PEM":
            raise OptionError(
                f"kafka.ssl.{kind}.type is {store_type!r}; Headwater reads PEM files only "
                f"(convert a JKS or PKCS12 store with keytool/openssl)"
            )
    mechanism = _get(options, "kafka.sasl.mechanism")
    if mechanism is not None and mechanism.strip().upper() not in SASL_MECHANISMS:
        raise OptionError(
            f"kafka.sasl.mechanism is {mechanism!r}; valid: {', '.join(SASL_MECHANISMS)} "
            "(a Headwater user's password: a SCRAM login, or sent with every call)"
        )
    for password in ("kafka.ssl.key.password", "kafka.ssl.keystore.password"):
        if _get(options, password):
            raise OptionError(
                f"{password}: encrypted keys are not supported; give an unencrypted PEM key "
                "(openssl pkey -in key.pem -out plain.pem)"
            )
    base = environment if environment is not None else ClientSecurity()
    chosen: dict[str, str] = {}
    if mechanism is not None:
        chosen["sasl_mechanism"] = mechanism.strip().upper()
    jaas = _get(options, "kafka.sasl.jaas.config")
    if jaas is not None:
        chosen.update(jaas_credentials(jaas))
    for setting, names in SECURITY_OPTIONS.items():
        value = next((v for name in names if (v := _get(options, name)) is not None), None)
        if value is not None:
            chosen[setting] = value if setting == "password" else value.strip()
    try:
        return base.with_overrides(**chosen)
    except HeadwaterError as error:
        raise OptionError(f"security options: {error.message}") from None


SASL_MECHANISMS: Final = ("SCRAM-SHA-256", "PLAIN")
JAAS_CHARS_MAX: Final = 4096
_JAAS_FIELD: Final = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


def jaas_credentials(text: str) -> dict[str, str]:
    """username and password of a Kafka ``sasl.jaas.config`` value (ScramLoginModule or
    PlainLoginModule, ``required username="..." password="...";``)."""
    if len(text) > JAAS_CHARS_MAX:
        raise OptionError(f"kafka.sasl.jaas.config is longer than {JAAS_CHARS_MAX} characters")
    module = text.strip().split(None, 1)[0] if text.strip() else ""
    if not module.endswith(("ScramLoginModule", "PlainLoginModule")):
        raise OptionError(
            f"kafka.sasl.jaas.config names {module[:80]!r}; valid: "
            "org.apache.kafka.common.security.scram.ScramLoginModule (or PlainLoginModule) "
            'required username="..." password="...";'
        )
    fields = {k: re.sub(r"\\(.)", r"\1", v) for k, v in _JAAS_FIELD.findall(text)}
    if not fields.get("username") or "password" not in fields:
        raise OptionError('kafka.sasl.jaas.config needs username="..." and password="..."')
    return {"username": fields["username"], "password": fields["password"]}


def _get(options: Mapping[str, str], name: str) -> str | None:
    """Option lookup, case-insensitive as Spark's options are."""
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return None


def _positive(options: Mapping[str, str], name: str) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"{name} is {raw!r}; it must be an integer >= 1") from None
    if value < 1:
        raise OptionError(f"{name} is {value}; it must be >= 1")
    return value


def _boolean(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "1", "yes"):
        return True
    if raw.strip().lower() in ("false", "0", "no"):
        return False
    raise OptionError(f"{name} is {raw!r}; it must be true or false")


def parse_duration_ms(raw: str, name: str) -> int:
    """``"15m"``, ``"30s"``, ``"500ms"``, ``"2h"`` or a plain number of ms."""
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|min|h|d)?\s*", raw)
    if not match:
        raise OptionError(f"{name} is {raw!r}; use a duration like 500ms, 30s, 15m or 2h")
    scale = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}
    scale["d"] = 86_400_000
    return int(match.group(1)) * scale[match.group(2)]


def _partition_json(raw: str, name: str) -> dict[Key, int]:
    """Kafka's per-partition JSON: ``{"topic": {"0": 23}}``."""
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(f"{name} is not valid JSON ({exc.msg}): {raw!r}") from None
    if not isinstance(parsed, dict):
        raise OptionError(f'{name} must be a JSON object like {{"topic": {{"0": 23}}}}')
    result: dict[Key, int] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise OptionError(f"{name}: topic {topic!r} must map partition numbers to numbers")
        for partition, value in partitions.items():
            try:
                index = int(partition)
            except ValueError:
                raise OptionError(
                    f"{name}: {partition!r} of {topic!r} is not a partition"
                ) from None
            if index < 0 or not isinstance(value, int) or isinstance(value, bool):
                raise OptionError(
                    f"{name}: {topic}-{partition} must be a partition >= 0 with an integer"
                )
            result[(topic, index)] = value
    return result


def _subscription(options: Mapping[str, str]) -> Subscription:
    given = {
        name: value
        for name in ("subscribe", "subscribePattern", "assign")
        if (value := _get(options, name)) is not None
    }
    if len(given) != 1:
        raise OptionError(
            "give exactly one of subscribe (topic list), subscribePattern (regex) or assign "
            f'(JSON like {{"topic": [0, 1]}}); got {sorted(given) or "none"}'
        )
    ((name, value),) = given.items()
    if name == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise OptionError("subscribe is empty; give a comma-separated list of topics")
        return Subscription(topics=topics)
    if name == "subscribePattern":
        try:
            re.compile(value)
        except re.error as exc:
            raise OptionError(f"subscribePattern {value!r} is not a valid regex: {exc}") from None
        return Subscription(pattern=value)
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise OptionError(f"assign is not valid JSON ({exc.msg}): {value!r}") from None
    if not isinstance(parsed, dict) or not all(
        isinstance(ps, list) and all(isinstance(p, int) and p >= 0 for p in ps)
        for ps in parsed.values()
    ):
        raise OptionError('assign must be a JSON object like {"topic": [0, 1]}')
    assigned = tuple(sorted((t, p) for t, ps in parsed.items() for p in ps))
    if not assigned:
        raise OptionError("assign names no partitions")
    return Subscription(assigned=assigned)


def _timestamp(raw: str, name: str) -> int:
    try:
        stamp = int(raw)
    except ValueError:
        raise OptionError(f"{name} is {raw!r}; give ms since the epoch") from None
    if stamp < 0:
        raise OptionError(f"{name} is {stamp}; it must be >= 0")
    return stamp


def _position(options: Mapping[str, str], side: str, default: str) -> StartSpec:
    """Where reads start (``side`` "starting") or a batch read ends ("ending"), by
    Kafka's precedence: ``{side}Timestamp``, then ``{side}OffsetsByTimestamp``, then
    ``{side}Offsets``."""
    timestamp_name = f"{side}Timestamp"
    by_timestamp_name = f"{side}OffsetsByTimestamp"
    offsets_name = f"{side}Offsets"
    timestamp = _get(options, timestamp_name)
    if timestamp is not None:
        return StartSpec(
            "timestamp", timestamp_ms=_timestamp(timestamp, timestamp_name), option=timestamp_name
        )
    by_timestamp = _get(options, by_timestamp_name)
    if by_timestamp is not None:
        stamps = _partition_json(by_timestamp, by_timestamp_name)
        if any(v < 0 for v in stamps.values()):
            raise OptionError(f"{by_timestamp_name}: timestamps are ms since the epoch, >= 0")
        return StartSpec("timestamps", stamps, option=by_timestamp_name)
    raw = _get(options, offsets_name)
    if raw is None:
        return StartSpec(default, option=offsets_name)
    if raw.strip().lower() in ("earliest", "latest"):
        return StartSpec(raw.strip().lower(), option=offsets_name)
    offsets = _partition_json(raw, offsets_name)
    if any(v < EARLIEST for v in offsets.values()):
        raise OptionError(f"{offsets_name}: offsets must be >= 0, or -2 (earliest) / -1 (latest)")
    return StartSpec("offsets", offsets, option=offsets_name)


_BATCH_ONLY: Final = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")


def required_bootstrap(options: Mapping[str, str]) -> str:
    """The bootstrap addresses, under any of BOOTSTRAP_KEYS; required, as in Kafka's
    source and sink (a default address once reached another cluster)."""
    bootstrap = next((v for k in BOOTSTRAP_KEYS if (v := _get(options, k)) is not None), "")
    if not bootstrap.strip():
        raise OptionError(
            "kafka.bootstrap.servers is required (there is no default): give "
            "host:port[,host:port] of the cluster's nodes"
        )
    return bootstrap.strip()


def parse_options(
    options: Mapping[str, str],
    streaming: bool | None,
    environment: ClientSecurity | None = None,
) -> SourceOptions:
    """Validate the reader options; raise OptionError naming the problem. ``streaming``
    None checks what holds for both kinds of read (``DataSource.schema``, at ``load()``,
    before Spark says which). ``environment``: the TLS settings unset options fall back
    to."""
    check_option_names(options)
    bootstrap = required_bootstrap(options)
    subscription = _subscription(options)
    if streaming:
        given = [name for name in _BATCH_ONLY if _get(options, name) is not None]
        if given:
            raise OptionError(f"{given[0]} is for batch reads (spark.read), not streams")
    starting = _position(options, "starting", default="latest" if streaming else "earliest")
    ending = _position(options, "ending", default="latest")
    if streaming is False and (
        starting.kind == "latest"
        or (starting.kind == "offsets" and LATEST in starting.per_partition.values())
    ):
        raise OptionError(
            "startingOffsets cannot be latest (-1) for a batch read: it would read nothing"
        )
    if ending.kind == "earliest" or (
        ending.kind == "offsets" and EARLIEST in ending.per_partition.values()
    ):
        raise OptionError("endingOffsets cannot be earliest (-2); use latest (-1) or an offset")
    raw_strategy = _get(options, "startingOffsetsByTimestampStrategy")
    strategy = NO_MATCH_ERROR if raw_strategy is None else raw_strategy.strip()
    if strategy.lower() not in (NO_MATCH_ERROR, NO_MATCH_LATEST):
        raise OptionError(
            f"startingOffsetsByTimestampStrategy is {strategy!r}; valid: error, latest"
        )
    fetch_max_bytes = _positive(options, "fetchMaxBytes") or FETCH_BYTES_DEFAULT
    if fetch_max_bytes > FETCH_BYTES_MAX:
        raise OptionError(f"fetchMaxBytes is {fetch_max_bytes}; the limit is {FETCH_BYTES_MAX}")
    delay = _get(options, "maxTriggerDelay")
    group_id = _get(options, "groupId")
    if group_id is not None:
        if streaming is False:
            raise OptionError("groupId is for streams (spark.readStream), not batch reads")
        try:
            check_group_id(group_id)
        except HeadwaterError as error:
            raise OptionError(f"groupId: {error.message}") from None
    return SourceOptions(
        bootstrap=bootstrap,
        subscription=subscription,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=_positive(options, "maxOffsetsPerTrigger"),
        min_offsets_per_trigger=_positive(options, "minOffsetsPerTrigger"),
        max_trigger_delay_ms=(
            parse_duration_ms(delay, "maxTriggerDelay")
            if delay is not None
            else DEFAULT_MAX_TRIGGER_DELAY_MS
        ),
        fail_on_data_loss=_boolean(options, "failOnDataLoss", True),
        no_match_strategy=strategy.lower(),
        include_headers=_boolean(options, "includeHeaders", False),
        min_partitions=_positive(options, "minPartitions"),
        max_records_per_partition=_positive(options, "maxRecordsPerPartition"),
        fetch_max_bytes=fetch_max_bytes,
        group_id=group_id,
        security=security_options(options, environment),
    )


# --------------------------------------------------------------------------- offsets


def encode_offsets(offsets: Mapping[Key, int], topic_ids: Mapping[str, str]) -> dict[str, Any]:
    """The streaming offset Spark checkpoints (see the module docstring)."""
    by_topic: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        by_topic.setdefault(topic, {})[str(partition)] = offset
    return {
        "offsets": by_topic,
        "topicIds": {t: topic_ids[t] for t in sorted(by_topic) if t in topic_ids},
    }


def decode_offsets(value: Mapping[str, Any]) -> tuple[dict[Key, int], dict[str, str]]:
    """Inverse of ``encode_offsets``; raises OptionError on a foreign shape (for example a
    checkpoint written by another source)."""
    try:
        offsets = {
            (topic, int(partition)): int(offset)
            for topic, partitions in value["offsets"].items()
            for partition, offset in partitions.items()
        }
        topic_ids = {str(t): str(i) for t, i in value.get("topicIds", {}).items()}
    except (KeyError, AttributeError, TypeError, ValueError):
        raise OptionError(
            f"checkpointed offset {json.dumps(value)[:200]} is not a Headwater offset"
        ) from None
    return offsets, topic_ids


def _names(keys: list[Key]) -> str:
    shown = ", ".join(f"{t}-{p}" for t, p in keys[:10])
    return shown + (f" and {len(keys) - 10} more" if len(keys) > 10 else "")


def check_partition_map(spec: StartSpec, partitions: list[Key]) -> None:
    """Kafka's rule for per-partition JSON: it names exactly the subscribed partitions.
    A partition left out would otherwise start (or end) somewhere the query never said."""
    if spec.kind not in ("offsets", "timestamps"):
        return
    given, wanted = set(spec.per_partition), set(partitions)
    if given == wanted:
        return
    problems = []
    if missing := sorted(wanted - given):
        problems.append(f"it leaves out {_names(missing)}")
    if extra := sorted(given - wanted):
        problems.append(f"it names {_names(extra)}, which the query does not read")
    if spec.kind == "timestamps":
        fill = "a timestamp"
    elif spec.option.startswith("ending"):
        fill = "-1 (latest) or an offset"
    else:
        fill = "-2 (earliest) or -1 (latest)"
    raise OptionError(
        f"{spec.option} must name every partition the query reads, as in Kafka's source: "
        f"{'; '.join(problems)}. Give {fill} for each partition"
    )


def past_the_end(spec: StartSpec, latest: Mapping[Key, int]) -> list[str]:
    """Offsets ``spec`` names beyond their partition's end (the high watermark): records
    the query was told exist and do not (deleted with their topic, or never written).
    Kafka's source counts these as data loss; one message per partition."""
    if spec.kind != "offsets":
        return []
    special = "-1" if spec.option.startswith("ending") else "-2, -1"
    return [
        f"{spec.option}: {t}-{p} ends at offset {latest[(t, p)]}, before the {offset} asked "
        f"for (valid: {special} or 0..{latest[(t, p)]})"
        for (t, p), offset in sorted(spec.per_partition.items())
        if (t, p) in latest and offset > latest[(t, p)]
    ]


def resolve_start(
    spec: StartSpec,
    partitions: list[Key],
    earliest: Mapping[Key, int],
    latest: Mapping[Key, int],
    by_timestamp: Mapping[Key, int | None],
    no_match_strategy: str = NO_MATCH_ERROR,
) -> dict[Key, int]:
    """Starting offsets of ``partitions``. ``by_timestamp`` holds the offsets the broker
    found for the requested timestamps (None: no record that recent, which fails unless
    ``no_match_strategy`` is latest). An offset past the end starts at the end (the
    caller reports it first: ``past_the_end``), as does an offset found for a timestamp
    (the lookup came after ``latest`` was read); one below the log start stays, for the
    data-loss check to see."""
    check_partition_map(spec, partitions)
    start: dict[Key, int] = {}
    for key in partitions:
        if spec.kind == "earliest":
            start[key] = earliest[key]
        elif spec.kind == "latest":
            start[key] = latest[key]
        elif spec.kind in ("timestamp", "timestamps"):
            found = by_timestamp.get(key)
            if found is None:
                if no_match_strategy != NO_MATCH_LATEST:
                    stamp = (
                        spec.timestamp_ms if spec.kind == "timestamp" else spec.per_partition[key]
                    )
                    raise OptionError(
                        f"{spec.option}: {key[0]}-{key[1]} has no record with a timestamp at "
                        f"or after {stamp}; set startingOffsetsByTimestampStrategy=latest to "
                        "start such partitions at their end"
                    )
                found = latest[key]
            # The lookup ran after ``latest`` was read: what it found can lie beyond.
            start[key] = min(found, latest[key])
        else:
            wanted = spec.per_partition[key]
            start[key] = {EARLIEST: earliest[key], LATEST: latest[key]}.get(
                wanted, min(wanted, latest[key])
            )
    return start


def resolve_end(
    spec: StartSpec,
    partitions: list[Key],
    latest: Mapping[Key, int],
    by_timestamp: Mapping[Key, int | None],
) -> dict[Key, int]:
    """Ending offsets of a batch read (exclusive), never past the high watermark:
    ``by_timestamp`` holds the offsets found for ending timestamps (None: no record that
    recent, so the partition's end, as in Kafka's source)."""
    check_partition_map(spec, partitions)
    end: dict[Key, int] = {}
    for key in partitions:
        if spec.kind in ("timestamp", "timestamps"):
            found = by_timestamp.get(key)
            wanted = LATEST if found is None else found
        elif spec.kind == "offsets":
            wanted = spec.per_partition[key]
        else:
            wanted = LATEST
        end[key] = latest[key] if wanted == LATEST else min(wanted, latest[key])
    return end


def inverted_ranges(
    start: Mapping[Key, int], end: Mapping[Key, int], starting: str = "", ending: str = ""
) -> list[str]:
    """Partitions whose batch read would start after it ends (Kafka's source refuses
    these: the options contradict each other); ``starting`` and ``ending`` name the
    options that gave the offsets."""
    given = f" (by {starting} and {ending})" if starting and ending else ""
    return [
        f"{t}-{p}: the starting offset {start[(t, p)]} is after the ending offset {offset}{given}"
        for (t, p), offset in sorted(end.items())
        if (t, p) in start and start[(t, p)] > offset
    ]


def cap_by_limit(start: Mapping[Key, int], latest: Mapping[Key, int], limit: int) -> dict[Key, int]:
    """End offsets that read at most ``limit`` records in all, split across partitions in
    proportion to their backlog (largest remainders get the leftover records, so the total
    is exactly ``min(limit, backlog)``)."""
    backlog = {k: max(latest[k] - start.get(k, latest[k]), 0) for k in latest}
    total = sum(backlog.values())
    if total <= limit:
        return dict(latest)
    shares = {k: limit * size / total for k, size in backlog.items()}
    granted = {k: math.floor(share) for k, share in shares.items()}
    leftover = limit - sum(granted.values())
    for key in sorted(shares, key=lambda k: (granted[k] - shares[k], k))[:leftover]:
        granted[key] += 1
    return {k: start.get(k, latest[k]) + min(granted[k], backlog[k]) for k in latest}


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Records [from_offset, until_offset) of one partition: one Spark input partition."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    @property
    def size(self) -> int:
        return self.until_offset - self.from_offset


def plan_ranges(
    start: Mapping[Key, int],
    end: Mapping[Key, int],
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
) -> list[OffsetRange]:
    """One range per partition with records between ``start`` and ``end``, split so that
    none holds more than ``max_records_per_partition`` records and, when
    ``min_partitions`` is more than the ranges there are, the largest are split further
    (Spark's Kafka source does the same)."""
    ranges = [
        OffsetRange(t, p, start[(t, p)], end[(t, p)])
        for (t, p) in sorted(end)
        if (t, p) in start and end[(t, p)] > start[(t, p)]
    ]
    if max_records_per_partition is not None:
        ranges = [
            piece
            for r in ranges
            for piece in _split(r, math.ceil(r.size / max_records_per_partition))
        ]
    if min_partitions is not None and len(ranges) < min_partitions:
        total = sum(r.size for r in ranges)
        ranges = [
            piece
            for r in ranges
            for piece in _split(r, max(1, round(r.size / total * min_partitions)))
        ]
    return ranges


def _split(whole: OffsetRange, pieces: int) -> list[OffsetRange]:
    pieces = max(1, min(pieces, whole.size))
    bounds = [whole.from_offset + whole.size * i // pieces for i in range(pieces + 1)]
    return [
        OffsetRange(whole.topic, whole.partition, a, b)
        for a, b in itertools.pairwise(bounds)
        if b > a
    ]


# --------------------------------------------------------------------------- data loss


def data_loss(
    start: Mapping[Key, int],
    earliest: Mapping[Key, int],
    topic_ids: Mapping[str, str],
    current_ids: Mapping[str, str],
) -> list[str]:
    """What was lost between ``start`` (and the topic ids read with it) and now: records
    below the log start (retention, deletion) and topics recreated under the same name
    (their offsets start over). One message per finding."""
    recreated = sorted(
        t for t, old in topic_ids.items() if t in current_ids and current_ids[t] != old
    )
    findings = [
        f"topic {topic!r} was deleted and created again (id {topic_ids[topic]} is now "
        f"{current_ids[topic]}); its old records are gone"
        for topic in recreated
    ]
    for (topic, partition), offset in sorted(start.items()):
        if topic in recreated or (topic, partition) not in earliest:
            continue
        if offset < earliest[(topic, partition)]:
            findings.append(
                f"{topic}-{partition}: offsets {offset} to {earliest[(topic, partition)] - 1} "
                f"were deleted before they were read (the log now starts at "
                f"{earliest[(topic, partition)]})"
            )
    return findings
