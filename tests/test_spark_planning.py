"""Offset planning of the Spark source (pure): options, read limits, ranges, data loss."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headwater.sparkconnector import planning
from headwater.sparkconnector.planning import OptionError, parse_options

backlogs = st.dictionaries(
    st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 5)),
    st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)),
    min_size=1,
    max_size=8,
)


@given(backlogs, st.integers(1, 30_000))
def test_cap_by_limit_reads_exactly_the_limit_in_proportion(
    spans: dict[tuple[str, int], tuple[int, int]], limit: int
) -> None:
    start = {k: min(a, b) for k, (a, b) in spans.items()}
    latest = {k: max(a, b) for k, (a, b) in spans.items()}
    end = planning.cap_by_limit(start, latest, limit)
    total = sum(latest[k] - start[k] for k in start)
    assert sum(end[k] - start[k] for k in start) == min(limit, total)
    for key, first in start.items():
        assert first <= end[key] <= latest[key]
        if total > limit:  # each share is within one record of its proportion
            share = limit * (latest[key] - first) / total
            assert abs((end[key] - first) - share) < 1


@given(
    backlogs, st.one_of(st.none(), st.integers(1, 3000)), st.one_of(st.none(), st.integers(1, 20))
)
def test_ranges_cover_each_partition_once(
    spans: dict[tuple[str, int], tuple[int, int]],
    max_records: int | None,
    min_partitions: int | None,
) -> None:
    start = {k: min(a, b) for k, (a, b) in spans.items()}
    end = {k: max(a, b) for k, (a, b) in spans.items()}
    ranges = planning.plan_ranges(start, end, min_partitions, max_records)
    for key, first in start.items():
        mine = sorted(
            (r.from_offset, r.until_offset) for r in ranges if (r.topic, r.partition) == key
        )
        covered = [o for a, b in mine for o in range(a, b)]
        assert covered == list(range(first, end[key]))
    for r in ranges:
        assert r.size > 0
        if max_records is not None:
            assert r.size <= max_records


def test_options_are_checked_with_the_problem_named() -> None:
    good = {"bootstrap": "h:1", "subscribe": "t"}
    bad = [
        ({"bootstrap": "h:1"}, "exactly one of subscribe"),
        ({**good, "subscribePattern": "x"}, "exactly one of subscribe"),
        ({**good, "startingOffsets": '{"t": {"x": 1}}'}, "is not a partition"),
        ({**good, "startingOffsets": '{"t": {"0": -3}}'}, "-2 \\(earliest\\)"),
        ({**good, "startingOffsets": "[1]"}, "must be a JSON object"),
        ({**good, "maxOffsetsPerTrigger": "ten"}, "must be an integer >= 1"),
        ({**good, "failOnDataLoss": "maybe"}, "true or false"),
        ({**good, "maxTriggerDelay": "soon"}, "duration like"),
        ({**good, "startingTimestamp": "-5"}, "must be >= 0"),
        ({"bootstrap": "h:1", "assign": '{"t": [-1]}'}, "assign must be"),
        ({**good, "fetchMaxBytes": str(1 << 30)}, "the limit is"),
    ]
    for options, message in bad:
        with pytest.raises(OptionError, match=message):
            parse_options(options, streaming=True)
    with pytest.raises(OptionError, match="for batch reads"):
        parse_options({**good, "endingOffsets": "latest"}, streaming=True)
    parsed = parse_options(
        {
            **good,
            "STARTINGOFFSETS": "earliest",
            "maxTriggerDelay": "2m",
            "kafka.bootstrap.servers": "x",
        },
        streaming=True,
    )
    assert parsed.starting.kind == "earliest"
    assert parsed.max_trigger_delay_ms == 120_000
    assert parse_options(good, streaming=False).starting.kind == "earliest"  # batch default


def test_offsets_round_trip_and_foreign_checkpoints_are_refused() -> None:
    offsets = {("t", 0): 5, ("t", 1): 7, ("u", 0): 0}
    ids = {"t": "id-t", "u": "id-u"}
    assert planning.decode_offsets(planning.encode_offsets(offsets, ids)) == (offsets, ids)
    with pytest.raises(OptionError, match="not a Headwater offset"):
        planning.decode_offsets({"t": {"0": 5}})  # Spark's Kafka source offset


def test_data_loss_names_deleted_ranges_and_recreated_topics() -> None:
    findings = planning.data_loss(
        {("t", 0): 5, ("t", 1): 9, ("u", 0): 3},
        {("t", 0): 8, ("t", 1): 2, ("u", 0): 0},
        {"t": "old", "u": "u1"},
        {"t": "old", "u": "u2"},
    )
    assert findings == [
        "topic 'u' was deleted and created again (id u1 is now u2); its old records are gone",
        "t-0: offsets 5 to 7 were deleted before they were read (the log now starts at 8)",
    ]


def test_sink_options_and_columns_are_checked_with_the_problem_named() -> None:
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    from headwater.sparkconnector.sink import (
        CHUNK_BYTES_MAX,
        SinkOptionError,
        check_input_schema,
        parse_sink_options,
    )

    for options, message in [
        ({"topic": " "}, "the topic option is empty"),
        (
            {"topic": "t", "batchBytes": "big"},
            rf"give a number of bytes in \[1024, {CHUNK_BYTES_MAX}\]",
        ),
        ({"topic": "t", "batchBytes": "10"}, rf"valid range is \[1024, {CHUNK_BYTES_MAX}\]"),
        ({"topic": "t", "batchBytes": str(CHUNK_BYTES_MAX + 1)}, "valid range is"),
    ]:
        with pytest.raises(SinkOptionError, match=message):
            parse_sink_options({"bootstrap": "h:1", **options})
    # As in Kafka's sink: no default address (a default found another cluster).
    with pytest.raises(SinkOptionError, match=r"kafka\.bootstrap\.servers is required"):
        parse_sink_options({"topic": "t"})
    parsed = parse_sink_options({"TOPIC": "t", "checkpointLocation": "/ck", "Bootstrap": "h:1"})
    assert (parsed.topic, parsed.sink_id, parsed.bootstrap) == ("t", "/ck", "h:1")

    def schema(**columns: object) -> StructType:
        return StructType([StructField(name, kind) for name, kind in columns.items()])

    with pytest.raises(SinkOptionError, match="column partition is string; it must be int"):
        check_input_schema(schema(value=StringType(), partition=StringType()), parsed)
    with pytest.raises(SinkOptionError, match="column key is int; it must be binary or string"):
        check_input_schema(schema(value=StringType(), key=IntegerType()), parsed)
    check_input_schema(schema(value=StringType(), partition=IntegerType()), parsed)


def test_tls_options_take_kafka_and_headwater_names_over_the_environment() -> None:
    from headwater.shared.tls import ClientSecurity
    from headwater.sparkconnector.planning import OptionError, security_options

    kafka = security_options(
        {
            "kafka.security.protocol": "SSL",
            "kafka.ssl.truststore.location": "/ca.pem",
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.keystore.location": "/client.pem",
        }
    )
    assert kafka == ClientSecurity("tls", "/ca.pem", "/client.pem", "/client.pem")
    native = security_options(
        {"headwater.tls.ca.file": "/ca.pem", "HEADWATER.TLS.SERVER.NAME": "n"}
    )
    assert native.tls and native.server_name == "n"
    inherited = ClientSecurity("tls", "/env-ca.pem")
    assert security_options({}, inherited) == inherited
    assert security_options({"kafka.security.protocol": "PLAINTEXT"}, inherited) == ClientSecurity()
    jaas = (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" '
        'password="p\\"w d";'
    )
    sasl = security_options(
        {
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-256",
            "kafka.sasl.jaas.config": jaas,
            "kafka.ssl.truststore.location": "/ca.pem",
        }
    )
    assert sasl == ClientSecurity("tls", "/ca.pem", username="alice", password='p"w d')
    named = {"headwater.username": "bob", "headwater.password": " x "}
    assert security_options({**named, "kafka.security.protocol": "SASL_PLAINTEXT"}) == (
        ClientSecurity("SASL_PLAINTEXT", username="bob", password=" x ")
    )
    with pytest.raises(OptionError, match="in the clear"):
        security_options(named)
    for options, problem in (
        ({"kafka.ssl.truststore.type": "JKS"}, "PEM files only"),
        ({"kafka.security.protocol": "SASL_SSL"}, "needs credentials"),
        ({"kafka.sasl.mechanism": "GSSAPI"}, "valid: SCRAM-SHA-256, PLAIN"),
        ({"kafka.sasl.jaas.config": "com.sun.Krb5LoginModule required;"}, "ScramLoginModule"),
        ({"kafka.sasl.jaas.config": 'x.ScramLoginModule required username="a";'}, "password"),
        ({"headwater.username": "a:b"}, "without ':'"),
        ({"headwater.tls.cert.file": "/c.pem"}, "go together"),
    ):
        with pytest.raises(OptionError, match=problem):
            security_options(options)


# ------------------------------------------------------------------ the options table

JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p";'
ACCEPTED_VALUES = {
    "assign": '{"t": [0]}',
    "subscribe": "t",
    "subscribePattern": "t.*",
    "kafka.bootstrap.servers": "h:2",
    "startingTimestamp": "5",
    "startingOffsetsByTimestamp": '{"t": {"0": 5}}',
    "startingOffsets": "earliest",
    "endingTimestamp": "9",
    "endingOffsetsByTimestamp": '{"t": {"0": 9}}',
    "endingOffsets": '{"t": {"0": 7}}',
    "failOnDataLoss": "false",
    "maxOffsetsPerTrigger": "10",
    "minOffsetsPerTrigger": "10",
    "maxTriggerDelay": "1m",
    "minPartitions": "4",
    "maxRecordsPerPartition": "100",
    "includeHeaders": "true",
    "startingOffsetsByTimestampStrategy": "latest",
    "headwater.bootstrap.servers": "h:2",
    "bootstrap.servers": "h:2",
    "bootstrap": "h:2",
    "fetchMaxBytes": "1048576",
    "groupId": "g",
    "kafka.security.protocol": "SSL",
    "headwater.security.protocol": "SSL",
    "security.protocol": "SSL",
    "kafka.sasl.jaas.config": JAAS,
    "kafka.sasl.mechanism": "SCRAM-SHA-256",
    "headwater.username": "u",
    "headwater.password": "p",
    "kafka.ssl.truststore.location": "/ca.pem",
    "kafka.ssl.truststore.type": "PEM",
    "kafka.ssl.keystore.location": "/client.pem",
    "kafka.ssl.keystore.type": "PEM",
    "kafka.ssl.key.password": "",
    "kafka.ssl.keystore.password": "",
    "headwater.tls.ca.file": "/ca.pem",
    "headwater.tls.cert.file": "/cert.pem",
    "headwater.tls.key.file": "/key.pem",
    "headwater.tls.server.name": "node-1",
}
"""A value each supported option takes (one test per row)."""
COMPANIONS = {
    "headwater.password": {"headwater.username": "u"},
    "headwater.tls.cert.file": {"headwater.tls.key.file": "/key.pem"},
    "headwater.tls.key.file": {"headwater.tls.cert.file": "/cert.pem"},
}
"""What an option needs beside it."""

SUPPORTED = [r for r in planning.SOURCE_OPTIONS if r.support != planning.REFUSED]
REFUSED = [r for r in planning.SOURCE_OPTIONS if r.support == planning.REFUSED]


def test_every_supported_row_has_a_value_to_try() -> None:
    assert sorted(ACCEPTED_VALUES) == sorted(r.name for r in SUPPORTED)


@pytest.mark.parametrize("row", SUPPORTED, ids=lambda r: r.name)
def test_each_supported_option_is_taken(row: planning.OptionRow) -> None:
    """Given alone beside a subscription (and with what it needs), the option is taken,
    under its own name and in another case."""
    base = {"bootstrap": "h:1", "subscribe": "t"}
    if row.name in ("assign", "subscribePattern"):
        base = {"bootstrap": "h:1"}
    if row.name.startswith(
        ("kafka.ssl", "headwater.shared.tls", "kafka.sasl", "headwater.user", "headwater.pass")
    ):
        base["headwater.security.protocol"] = "SSL"
    base |= COMPANIONS.get(row.name, {})
    streaming = not row.name.startswith("ending")
    for name in (row.name, row.name.upper()):
        parsed = parse_options({**base, name: ACCEPTED_VALUES[row.name]}, streaming=streaming)
        assert (
            parsed.subscription.topics
            or parsed.subscription.pattern
            or parsed.subscription.assigned
        )


@pytest.mark.parametrize("row", REFUSED, ids=lambda r: r.name)
def test_each_refused_option_fails_with_its_reason(row: planning.OptionRow) -> None:
    """Refused options used to be ignored, so that a batch read bounded by
    endingTimestamp read everything."""
    for streaming in (True, False):
        with pytest.raises(OptionError) as raised:
            parse_options({"bootstrap": "h:1", "subscribe": "t", row.name: "1"}, streaming)
        assert str(raised.value) == f"option {row.name} is refused: {row.meaning}"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("startingOffset", "did you mean startingOffsets?"),
        ("failOnDataloss ", "did you mean failOnDataLoss?"),
        (
            "kafka.max.poll.records",
            "unknown option 'kafka.max.poll.records'; valid options: assign",
        ),
        ("path", "unknown option 'path'"),
    ],
)
def test_an_unknown_option_fails_naming_the_valid_ones(name: str, expected: str) -> None:
    """A typo or a Kafka client setting Headwater does not honour was silently ignored."""
    with pytest.raises(OptionError) as raised:
        parse_options({"bootstrap": "h:1", "subscribe": "t", name: "x"}, streaming=True)
    assert expected in str(raised.value)
    assert "docs/spark.md" in str(raised.value)


def test_docs_spark_md_is_the_table() -> None:
    from pathlib import Path

    from headwater.sparkconnector.options_doc import spark_doc

    written = (Path(__file__).parent.parent / "docs" / "spark.md").read_text()
    assert written == spark_doc(), (
        "run python -m headwater.sparkconnector.options_doc > docs/spark.md"
    )


# ------------------------------------------------------------------ Kafka's rules

BASE = {"bootstrap": "h:1", "subscribe": "t"}
PARTITIONS = [("t", 0), ("t", 1)]
EARLIEST = {("t", 0): 10, ("t", 1): 0}
LATEST = {("t", 0): 50, ("t", 1): 30}


def test_bootstrap_is_required() -> None:
    """Without it the source dialled 127.0.0.1:7700, which on a shared machine was
    another cluster ("topic(s) 'clicks' do not exist")."""
    for options in ({"subscribe": "t"}, {"subscribe": "t", "kafka.bootstrap.servers": " "}):
        with pytest.raises(OptionError, match=r"kafka\.bootstrap\.servers is required"):
            parse_options(options, streaming=None)


def test_timestamps_take_precedence_as_in_kafka() -> None:
    """startingTimestamp, then startingOffsetsByTimestamp, then startingOffsets; the
    same for the ending options (startingOffsetsByTimestamp used to win)."""
    every = {
        **BASE,
        "startingTimestamp": "5",
        "startingOffsetsByTimestamp": '{"t": {"0": 6}}',
        "startingOffsets": "earliest",
        "endingTimestamp": "7",
        "endingOffsetsByTimestamp": '{"t": {"0": 8}}',
        "endingOffsets": "latest",
    }
    parsed = parse_options(every, streaming=False)
    assert (parsed.starting.kind, parsed.starting.timestamp_ms) == ("timestamp", 5)
    assert (parsed.ending.kind, parsed.ending.timestamp_ms) == ("timestamp", 7)
    del every["startingTimestamp"], every["endingTimestamp"]
    parsed = parse_options(every, streaming=False)
    assert (parsed.starting.kind, dict(parsed.starting.per_partition)) == (
        "timestamps",
        {("t", 0): 6},
    )
    assert (parsed.ending.kind, dict(parsed.ending.per_partition)) == ("timestamps", {("t", 0): 8})
    assert parsed.ending.option == "endingOffsetsByTimestamp"


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"endingTimestamp": "5"}, True, "endingTimestamp is for batch reads"),
        ({"endingOffsetsByTimestamp": '{"t": {"0": 5}}'}, True, "is for batch reads"),
        ({"startingOffsets": '{"t": {"0": -1}}'}, False, r"cannot be latest \(-1\)"),
        ({"startingOffsets": "latest"}, False, "cannot be latest"),
        ({"endingOffsets": '{"t": {"0": -2}}'}, False, "cannot be earliest"),
        ({"endingTimestamp": "soon"}, False, "endingTimestamp is 'soon'; give ms"),
        ({"endingOffsetsByTimestamp": '{"t": {"0": -4}}'}, False, "timestamps are ms"),
        ({"startingOffsetsByTimestampStrategy": "earliest"}, True, "valid: error, latest"),
        ({"startingOffsetsByTimestampStrategy": ""}, True, "valid: error, latest"),
        # The kind of read is named before a value is parsed.
        ({"endingTimestamp": "soon"}, True, "endingTimestamp is for batch reads"),
        ({"groupId": "g"}, False, "groupId is for streams"),
    ],
)
def test_values_that_contradict_the_kind_of_read_are_named(
    options: dict[str, str], streaming: bool, message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        parse_options({**BASE, **options}, streaming=streaming)


def test_load_time_checks_leave_the_kind_of_read_open() -> None:
    """``streaming=None`` (``DataSource.schema``, at ``load()``) checks only what holds
    for both kinds: the batch-only and stream-only options wait for the reader."""
    parse_options({**BASE, "endingTimestamp": "5", "groupId": "g"}, streaming=None)
    with pytest.raises(OptionError, match="did you mean"):
        parse_options({**BASE, "endingTimestamps": "5"}, streaming=None)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ('{"t": {"0": 5}}', "it leaves out t-1"),
        ('{"t": {"0": 5, "1": 6, "2": 7}}', "it names t-2, which the query does not read"),
        ('{"u": {"0": 5}}', "it leaves out t-0, t-1; it names u-0"),
    ],
)
def test_a_partition_map_must_name_every_partition(raw: str, problem: str) -> None:
    """Partitions left out of a startingOffsets map used to start at earliest; Kafka's
    source refuses such a map, and so does Headwater, for every per-partition option."""
    for name, kind, fill in (
        ("startingOffsets", "offsets", r"-2 \(earliest\) or -1 \(latest\)"),
        ("endingOffsets", "offsets", r"-1 \(latest\) or an offset"),
        ("startingOffsetsByTimestamp", "timestamps", "a timestamp"),
        ("endingOffsetsByTimestamp", "timestamps", "a timestamp"),
    ):
        parsed = parse_options({**BASE, name: raw}, streaming=False)
        spec = parsed.starting if name.startswith("starting") else parsed.ending
        assert (spec.kind, spec.option) == (kind, name)
        with pytest.raises(OptionError, match=f"{name} must name every partition.*{problem}.*"):
            planning.check_partition_map(spec, PARTITIONS)
        resolve = (
            (lambda spec=spec: planning.resolve_start(spec, PARTITIONS, EARLIEST, LATEST, {}))
            if name.startswith("starting")
            else (lambda spec=spec: planning.resolve_end(spec, PARTITIONS, LATEST, {}))
        )
        with pytest.raises(OptionError, match=f"Give {fill} for each partition"):
            resolve()


def test_offsets_past_the_end_are_named_and_start_or_end_there() -> None:
    """Offsets past a partition's end were clamped in silence; they are data loss in
    Kafka's source (failOnDataLoss decides), and are named with the valid range."""
    spec = parse_options(
        {**BASE, "startingOffsets": '{"t": {"0": 51, "1": 30}}'}, streaming=False
    ).starting
    assert planning.past_the_end(spec, LATEST) == [
        "startingOffsets: t-0 ends at offset 50, before the 51 asked for (valid: -2, -1 or 0..50)"
    ]
    assert planning.resolve_start(spec, PARTITIONS, EARLIEST, LATEST, {}) == {
        ("t", 0): 50,
        ("t", 1): 30,
    }
    ending = parse_options(
        {**BASE, "endingOffsets": '{"t": {"0": -1, "1": 99}}'}, streaming=False
    ).ending
    assert planning.past_the_end(ending, LATEST) == [
        "endingOffsets: t-1 ends at offset 30, before the 99 asked for (valid: -1 or 0..30)"
    ]
    assert planning.resolve_end(ending, PARTITIONS, LATEST, {}) == LATEST


def test_starting_timestamps_without_a_match_follow_the_strategy() -> None:
    spec = parse_options({**BASE, "startingTimestamp": "1000"}, streaming=True).starting
    found: dict[tuple[str, int], int | None] = {("t", 0): 20, ("t", 1): None}
    with pytest.raises(OptionError, match="t-1 has no record with a timestamp at or after 1000"):
        planning.resolve_start(spec, PARTITIONS, EARLIEST, LATEST, found)
    assert planning.resolve_start(spec, PARTITIONS, EARLIEST, LATEST, found, "latest") == {
        ("t", 0): 20,
        ("t", 1): 30,
    }


def test_a_timestamp_found_past_the_end_starts_at_the_end() -> None:
    """The timestamp lookup runs after the partition ends were read: with records
    arriving meanwhile it can find an offset beyond them, which must not start a read
    after its end (a spurious "starting offset is after the ending offset")."""
    spec = parse_options({**BASE, "startingTimestamp": "1000"}, streaming=False).starting
    found: dict[tuple[str, int], int | None] = {("t", 0): 57, ("t", 1): 3}
    start = planning.resolve_start(spec, PARTITIONS, EARLIEST, LATEST, found)
    assert start == {("t", 0): 50, ("t", 1): 3}
    assert (
        planning.inverted_ranges(
            start,
            planning.resolve_end(
                parse_options(BASE, streaming=False).ending, PARTITIONS, LATEST, {}
            ),
        )
        == []
    )


def test_assigned_partitions_that_do_not_exist_are_named() -> None:
    subscription = parse_options(
        {"bootstrap": "h:1", "assign": '{"t": [0, 5], "gone": [0]}'}, streaming=True
    ).subscription
    assert subscription.missing_partitions({"t": 2}) == [("t", 5)]


def test_ending_timestamps_end_before_the_first_later_record_or_at_the_end() -> None:
    spec = parse_options({**BASE, "endingTimestamp": "1000"}, streaming=False).ending
    found: dict[tuple[str, int], int | None] = {("t", 0): 20, ("t", 1): None}
    assert planning.resolve_end(spec, PARTITIONS, LATEST, found) == {("t", 0): 20, ("t", 1): 30}


def test_a_read_starting_after_its_end_is_named() -> None:
    assert planning.inverted_ranges({("t", 0): 20, ("t", 1): 5}, {("t", 0): 10, ("t", 1): 5}) == [
        "t-0: the starting offset 20 is after the ending offset 10"
    ]


SINK_VALUES = {
    "kafka.bootstrap.servers": "h:2",
    "topic": "t",
    "checkpointLocation": "/ck",
    "path": "/out",
    "headwater.bootstrap.servers": "h:2",
    "bootstrap.servers": "h:2",
    "bootstrap": "h:2",
    "sinkId": "s",
    "batchBytes": "4096",
    "includeHeaders": "true",
    "queryName": "q",
}
"""A value each sink option takes besides the security ones (tried in the source's
rows)."""


SINK_REFUSED = [r for r in planning.SINK_OPTIONS if r.support == planning.REFUSED]


@pytest.mark.parametrize("row", SINK_REFUSED, ids=lambda r: r.name)
def test_each_refused_sink_option_fails_with_its_reason(row: planning.OptionRow) -> None:
    from headwater.sparkconnector.sink import SinkOptionError, parse_sink_options

    with pytest.raises(SinkOptionError) as raised:
        parse_sink_options({"bootstrap": "h:1", row.name: "1"})
    assert str(raised.value) == f"headwater sink: option {row.name} is refused: {row.meaning}"


@pytest.mark.parametrize(
    "row",
    [
        r
        for r in planning.SINK_OPTIONS
        if r not in planning.SECURITY_ROWS and r.support != planning.REFUSED
    ],
    ids=lambda r: r.name,
)
def test_each_sink_option_is_taken(row: planning.OptionRow) -> None:
    from headwater.sparkconnector.sink import parse_sink_options

    for name in (row.name, row.name.upper()):
        parsed = parse_sink_options({"bootstrap": "h:1", name: SINK_VALUES[row.name]})
        if row.name in ("sinkId", "checkpointLocation", "path"):
            assert parsed.sink_id == SINK_VALUES[row.name]
        if row.name == "batchBytes":
            assert parsed.chunk_bytes == 4096
        if row.name == "topic":
            assert parsed.topic == "t"
    assert sorted(SINK_VALUES) == sorted(
        r.name
        for r in planning.SINK_OPTIONS
        if r not in planning.SECURITY_ROWS and r.support != planning.REFUSED
    )


def test_sink_security_options_are_taken() -> None:
    """The sink takes the source's security rows (their values are parsed by
    ``security_options``, tested above, for both)."""
    from headwater.sparkconnector.sink import parse_sink_options

    for row in planning.SECURITY_ROWS:
        planning.check_option_names({row.name: ACCEPTED_VALUES[row.name]}, sink=True)
    parsed = parse_sink_options(
        {
            "bootstrap": "h:1",
            "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.sasl.jaas.config": JAAS,
        }
    )
    assert (parsed.security.username, parsed.security.password) == ("u", "p")


@pytest.mark.parametrize(
    ("name", "expected"),
    [("topc", "did you mean topic?"), ("kafka.retries", "unknown option 'kafka.retries'")],
)
def test_an_unknown_sink_option_fails_naming_the_valid_ones(name: str, expected: str) -> None:
    """The sink ignored every option it did not know (a typo of topic wrote to the
    topic column's topics, or failed for want of one, without naming the typo)."""
    from headwater.sparkconnector.sink import SinkOptionError, parse_sink_options

    with pytest.raises(SinkOptionError) as raised:
        parse_sink_options({"bootstrap": "h:1", name: "x"})
    assert expected in str(raised.value)
    assert "valid options: kafka.bootstrap.servers, topic" in str(raised.value)
