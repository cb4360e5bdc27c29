"""What the headwater command prints, read as a pipe and a script read it: whole cells in
plain columns, the configs a topic overrides, who holds a group's partitions, and client
settings taken before or after the command."""

from __future__ import annotations

import io
import json
import subprocess

import pytest

from headwater.cli import produce as cli_produce
from headwater.cli.output import Table
from headwater.shared.errors import ErrorCode, HeadwaterError
from tests.node_process import HEADWATER, NodeProcess, run_cli, wait_until


def fields(text: bytes) -> list[list[str]]:
    return [line.split() for line in text.decode().splitlines()]


def test_a_table_keeps_every_cell_whole_in_columns_awk_can_count() -> None:
    table = Table("member", "client id", "assigned")
    table.add_row("m" * 90, "", "orders-0,1")
    table.add_row("short", "billing\tetl", None)
    lines = table.lines()
    assert lines[0].split() == ["MEMBER", "CLIENT-ID", "ASSIGNED"]
    assert lines[1].split() == ["m" * 90, "-", "orders-0,1"]
    assert lines[2].split() == ["short", "billing\\tetl", "-"]
    assert len({line.index(line.split()[1]) for line in lines}) == 1  # aligned
    assert not any(line.endswith(" ") for line in lines)
    table.add_column("lag")
    assert table.lines()[1].split()[-1] == "-"
    with pytest.raises(ValueError, match="a row of 2 cells in a table of 4"):
        table.add_row("a", "b")


@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
def test_input_lines_past_the_limit_come_out_as_none(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_produce, "SKIP_CHUNK_BYTES", chunk)
    data = b"a\n" + b"x" * 25 + b"\n\n" + b"y" * 10 + b"\n" + b"z" * 11
    assert list(cli_produce.bounded_lines(io.BytesIO(data), 10)) == [
        b"a",
        None,
        b"",
        b"y" * 10,
        None,
    ]
    assert list(cli_produce.bounded_lines(io.BytesIO(b""), 10)) == []
    assert list(cli_produce.bounded_lines(io.BytesIO(b"last"), 10)) == [b"last"]


def test_describe_prints_whole_columns_and_only_the_overridden_configs(
    node: NodeProcess,
) -> None:
    b = ["--bootstrap", node.address]
    name = "orders-" + "x" * 120  # a name far wider than a terminal
    created = run_cli(
        "topics", "create", name, "--partitions", "3", "--config", "retention.ms=60000", *b
    )
    assert created.returncode == 0, created.stderr
    produced = run_cli("produce", name, "--key-separator", ":", *b, input_bytes=b"a:1\nb:2\n")
    assert produced.returncode == 0, produced.stderr
    described = run_cli("topics", "describe", name, *b)
    assert described.returncode == 0, described.stderr
    assert "…".encode() not in described.stdout and b"\xe2\x94" not in described.stdout
    rows = fields(described.stdout)
    assert rows[0] == ["topic", name, "id", rows[0][3]]
    header = rows[1]
    assert header[:4] == ["PARTITION", "LEADER", "REPLICAS", "ISR"]
    partitions = rows[2:5]
    assert [r[0] for r in partitions] == ["0", "1", "2"]
    assert all(len(r) == len(header) for r in partitions)
    high_watermark = header.index("HIGH-WATERMARK")
    assert sum(int(r[high_watermark]) for r in partitions) == 2
    # The configs set on the topic, not the 16 defaults (kafka-configs --describe).
    assert rows[-2:] == [["CONFIG", "VALUE"], ["retention_ms", "60000"]]
    every = fields(run_cli("topics", "describe", name, "--all-configs", *b).stdout)
    sources = {row[0]: row[2] for row in every[every.index(["CONFIG", "VALUE", "SOURCE"]) + 1 :]}
    assert sources["retention_ms"] == "override" and sources["segment_bytes"] == "default"
    assert len(sources) >= 16
    as_json = json.loads(run_cli("topics", "describe", name, "--json", *b).stdout)
    assert as_json["config_overrides"] == ["retention_ms"] and len(as_json["configs"]) >= 16
    listed = fields(run_cli("topics", "list", *b).stdout)
    assert listed[0] == ["TOPIC", "PARTITIONS", "REPLICATION", "ID"] and listed[1][0] == name


def test_groups_describe_names_each_member_by_its_client_id(node: NodeProcess) -> None:
    b = ["--bootstrap", node.address]
    assert run_cli("topics", "create", "held", "--partitions", "2", *b).returncode == 0
    consume = [*HEADWATER, "consume", "held", "--group", "who", "--timeout-ms", "60000", *b]
    members = [
        subprocess.Popen(consume, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen(
            [*HEADWATER, "--client-id", "billing-etl", *consume[len(HEADWATER) :]],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    ]
    try:

        def described() -> dict[str, object] | None:
            shown = run_cli("groups", "describe", "who", "--json", *b)
            data = json.loads(shown.stdout) if shown.returncode == 0 else None
            settled = (
                data and len(data["members"]) == 2 and all(m["assigned"] for m in data["members"])
            )
            return data if settled else None

        wait_until(described, 60, "two members holding a partition each")
        table = run_cli("groups", "describe", "who", *b)
        rows = fields(table.stdout)
        assert rows[1] == ["MEMBER", "CLIENT-ID", "HOST", "ASSIGNED"]
        by_client = {row[1]: row for row in rows[2:4]}
        assert set(by_client) == {"headwater-cli", "billing-etl"}
        assert all(len(row[0]) == 32 for row in by_client.values())  # whole member ids
        assert all(row[2] == "127.0.0.1" for row in by_client.values())  # as the node saw it
        assert sorted(row[3] for row in by_client.values()) == ["held-0", "held-1"]
    finally:
        for member in members:
            member.terminate()
        for member in members:
            member.wait(30)


def test_client_settings_go_before_or_after_the_command(node: NodeProcess) -> None:
    assert run_cli("--bootstrap", node.address, "topics", "create", "placed").returncode == 0
    listed = run_cli("topics", "list", "--json", "--client-id", "ops", "--bootstrap", node.address)
    assert listed.returncode == 0 and [t["name"] for t in json.loads(listed.stdout)] == ["placed"]
    # A setting after the command is applied: TLS towards a plaintext node fails the call.
    refused = run_cli(
        "topics", "list", "--bootstrap", node.address, "--tls-ca-file", "/nonexistent/ca.crt"
    )
    assert refused.returncode == 1 and b"/nonexistent/ca.crt" in refused.stderr
    # After the command, a flag wins over the one before it.
    both = run_cli("--client-id", "first", "topics", "list", "--client-id", "x" * 300)
    assert both.returncode != 0 and b"client" in both.stderr.lower()
    health = run_cli("cluster", "health", env={"HEADWATER_BOOTSTRAP": node.address})
    assert health.returncode == 0 and node.address.encode() in health.stdout


def test_cluster_status_counts_internal_topics_apart(node: NodeProcess) -> None:
    b = ["--bootstrap", node.address]
    assert run_cli("topics", "create", "mine", "--partitions", "2", *b).returncode == 0
    consumed = run_cli("consume", "mine", "--group", "g", "--timeout-ms", "500", *b)
    assert consumed.returncode == 0, consumed.stderr  # makes __consumer_offsets

    def status() -> dict[str, object] | None:
        data = json.loads(run_cli("cluster", "status", "--json", *b).stdout)
        return data if data["internal_topics"] else None

    data = wait_until(status, 30, "__consumer_offsets in the status")
    assert data["topics"] == 1 and data["partitions"] == 2
    last = run_cli("cluster", "status", *b).stdout.decode().splitlines()[-1]
    assert last.startswith("1 topic(s), 2 partition(s) (and __consumer_offsets, ")


class SlowFlush:
    """A producer whose flush times out ``slow`` times before it finishes."""

    delivery_timeout_s = 120.0

    def __init__(self, slow: int) -> None:
        self.slow = slow
        self.calls = 0

    def flush(self, timeout_s: float | None = None) -> None:
        self.calls += 1
        if self.calls <= self.slow:
            raise HeadwaterError(
                ErrorCode.REQUEST_TIMED_OUT, f"flush did not finish in {timeout_s}"
            )


def test_a_flush_longer_than_a_second_says_once_what_it_waits_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cli_produce.flush_telling_why(SlowFlush(0), lambda: 0)  # type: ignore[arg-type]
    assert capsys.readouterr().err == ""
    slow = SlowFlush(3)
    cli_produce.flush_telling_why(slow, lambda: 7)  # type: ignore[arg-type]
    assert slow.calls == 4
    (note,) = capsys.readouterr().err.splitlines()
    assert note.startswith("waiting for 7 record(s) to be acknowledged: ") and "120 s" in note


def test_a_member_left_without_partitions_says_what_it_waits_for(node: NodeProcess) -> None:
    b = ["--bootstrap", node.address]
    assert run_cli("topics", "create", "single", "--partitions", "1", *b).returncode == 0
    holder = subprocess.Popen(
        [*HEADWATER, "consume", "single", "--group", "one", "--timeout-ms", "60000", *b],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def held() -> bool:
            shown = run_cli("groups", "describe", "one", "--json", *b)
            return shown.returncode == 0 and any(
                m["assigned"] for m in json.loads(shown.stdout)["members"]
            )

        wait_until(held, 60, "the first member to hold the partition")
        second = run_cli("consume", "single", "--group", "one", "--timeout-ms", "3000", *b)
        assert second.returncode == 0, second.stderr
        (note,) = second.stderr.decode().splitlines()
        assert note.startswith("waiting for group one to give this member partitions: ")
    finally:
        holder.terminate()
        holder.wait(30)
