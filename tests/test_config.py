"""Configuration: precedence, validation messages, and generated docs."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from headwater.cli.main import main as cli_main
from headwater.node.config import (
    KAFKA_TOPIC_CONFIG_NAMES,
    SETTINGS,
    NodeConfig,
    canonical_topic_configs,
    load,
    parse_topic_configs,
    render_markdown,
    topic_setting_name,
)
from headwater.node.replicas.log_manager import DataDirError, loopback_secret_path, shared_secret
from headwater.shared.addresses import DEFAULT_LISTEN
from headwater.shared.errors import ErrorCode, HeadwaterError

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_are_a_single_local_node() -> None:
    config = load(None, {}, {})
    assert config.listen == DEFAULT_LISTEN == "127.0.0.1:7700"
    assert config.data_dir == "./data"
    assert config.retention_ms == 7 * 24 * 3600 * 1000
    assert config.flush_policy == "os"


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    file = tmp_path / "hw.toml"
    file.write_text(
        '[headwater]\nnode_id = 4\ndata_dir = "/from/file"\nretention_ms = 1000\nlisten = "127.0.0.1:9000"\n'
    )
    env = {"HEADWATER_DATA_DIR": "/from/env", "HEADWATER_RETENTION_MS": "2000"}
    config = load(file, env, {"data_dir": "/from/flag", "node_id": None})
    assert (config.node_id, config.data_dir, config.retention_ms, config.listen) == (
        4,
        "/from/flag",
        2000,
        "127.0.0.1:9000",
    )


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ({"HEADWATER_NODE_ID": "abc"}, "must be an integer"),
        ({"HEADWATER_CONCURRENT_CALLS_MAX": "1"}, "valid range is [16, 100000]"),
        ({"HEADWATER_FLUSH_POLICY": "sometimes"}, "valid: os, interval, ack"),
        ({"HEADWATER_LISTEN": "nowhere"}, "HOST:PORT"),
        ({"HEADWATER_RETENTION_BYTES": "-7"}, "or -1 (no limit)"),
    ],
)
def test_invalid_values_name_the_key_source_and_range(
    source: dict[str, str], fragment: str
) -> None:
    with pytest.raises(HeadwaterError) as info:
        load(None, source, {})
    assert info.value.code == ErrorCode.INVALID_CONFIG
    assert fragment in info.value.message
    assert next(iter(source)) in info.value.message


def test_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("node_id = = 3")
    with pytest.raises(HeadwaterError, match="not valid TOML"):
        load(bad, {}, {})
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("colour = 'blue'")
    with pytest.raises(HeadwaterError, match="unknown key"):
        load(unknown, {}, {})
    with pytest.raises(HeadwaterError, match="cannot read"):
        load(tmp_path / "missing.toml", {}, {})


def test_topic_configs_fill_in_defaults_and_reject_unknown_keys() -> None:
    values = parse_topic_configs({"retention_ms": "-1"}, NodeConfig())
    assert values["retention_ms"] == "-1" and values["segment_bytes"] == str(1 << 30)
    with pytest.raises(HeadwaterError, match="unknown topic config"):
        parse_topic_configs({"node_id": "3"}, NodeConfig())


def test_topic_configs_take_kafka_names_and_store_the_nodes() -> None:
    stored = canonical_topic_configs(
        {"retention.ms": "01000", "unclean.leader.election.enable": "true", "segment_ms": "5"},
        NodeConfig(),
    )
    assert stored == {"retention_ms": "1000", "unclean_leader_election": "true", "segment_ms": "5"}
    assert topic_setting_name("cleanup.policy") == "cleanup_policy"
    assert KAFKA_TOPIC_CONFIG_NAMES["max_message_bytes"] == "max.message.bytes"
    with pytest.raises(HeadwaterError, match="given twice"):
        canonical_topic_configs({"retention.ms": "1", "retention_ms": "2"}, NodeConfig())
    with pytest.raises(HeadwaterError, match="or Kafka's names"):
        topic_setting_name("retention")


def test_configuration_doc_is_current() -> None:
    assert (ROOT / "docs/configuration.md").read_text() == render_markdown(), (
        "run python -m headwater.node.config > docs/configuration.md"
    )
    assert len(SETTINGS) == len({s.name for s in SETTINGS})


def test_a_cluster_beyond_loopback_needs_the_cluster_secret() -> None:
    wide = "1@10.0.0.1:7701,2@10.0.0.2:7701,3@10.0.0.3:7701"
    with pytest.raises(HeadwaterError) as info:
        load(None, {}, {"quorum": wide, "listen": "10.0.0.1:7700"})
    assert "HEADWATER_CLUSTER_SECRET" in info.value.message
    with pytest.raises(HeadwaterError):
        load(None, {}, {"roles": "broker", "controller_addresses": "127.0.0.1:7702"})
    config = load(
        None, {"HEADWATER_CLUSTER_SECRET": "s"}, {"quorum": wide, "listen": "10.0.0.1:7700"}
    )
    assert config.cluster_secret == "s"
    # The older name still works; the new one wins when both are set.
    legacy = load(
        None, {"HEADWATER_RAFT_SECRET": "old"}, {"quorum": wide, "listen": "10.0.0.1:7700"}
    )
    assert legacy.cluster_secret == "old"
    both = {"HEADWATER_RAFT_SECRET": "old", "HEADWATER_CLUSTER_SECRET": "new"}
    assert load(None, both, {"quorum": wide, "listen": "10.0.0.1:7700"}).cluster_secret == "new"
    # One machine: a loopback quorum may run without one (its nodes share a generated one).
    local = "1@127.0.0.1:7701,2@127.0.0.1:7711,3@127.0.0.1:7721"
    assert load(None, {}, {"quorum": local}).cluster_secret == ""


def test_a_lone_node_never_binds_its_raft_port_to_a_wildcard() -> None:
    assert load(None, {}, {"listen": "0.0.0.0:7700"}).quorum_voters == {1: "127.0.0.1:0"}
    assert load(None, {}, {"listen": "10.1.2.3:7700"}).quorum_voters == {1: "10.1.2.3:0"}


def test_a_loopback_cluster_without_a_secret_shares_a_private_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 11: the nodes of a loopback-only cluster with no cluster_secret derived their
    key from the quorum, which any local user could compute; they now share a random one
    in a file of their user's only."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    quorum = "1@127.0.0.1:7701,2@127.0.0.1:7711,3@127.0.0.1:7721"
    path = loopback_secret_path(quorum)
    assert path.parent == tmp_path / f"headwater-{os.getuid()}"
    first = shared_secret(path)
    assert len(first) == 64 and shared_secret(path) == first  # every node reads the same
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert loopback_secret_path(quorum.replace("7721", "7722")) != path
    # Anything another user could read or swap is refused, not used.
    path.chmod(0o644)
    with pytest.raises(DataDirError) as info:
        shared_secret(path)
    assert "not private" in str(info.value) and "HEADWATER_CLUSTER_SECRET" in str(info.value)
    path.unlink()
    target = tmp_path / "elsewhere"
    target.write_text("a" * 64)
    target.chmod(0o600)
    path.symlink_to(target)
    with pytest.raises(DataDirError):
        shared_secret(path)


@pytest.mark.parametrize("internal_listen", ["", "0.0.0.0:0"])
def test_an_advertised_inter_broker_address_needs_a_fixed_internal_port(
    internal_listen: str,
) -> None:
    """The port other nodes are told must be the one bound: with no internal_listen, or
    port 0, the system picks a port the advertised address cannot know."""
    with pytest.raises(HeadwaterError) as info:
        NodeConfig(internal_advertised_address="node1:7701", internal_listen=internal_listen)
    assert info.value.code == ErrorCode.INVALID_CONFIG
    assert "fixed port" in info.value.message
    fixed = NodeConfig(internal_advertised_address="node1:7701", internal_listen="0.0.0.0:7701")
    assert fixed.internal_advertised_address == "node1:7701"


def test_the_kafka_listener_is_off_by_default_and_read_from_file_env_and_flags(
    tmp_path: Path,
) -> None:
    config = load(None, {}, {})
    assert (config.kafka_listen, config.kafka_advertised_address) == ("", "")
    assert config.kafka_address(9092) == ""  # no Kafka listener: nothing to register
    file = tmp_path / "hw.toml"
    file.write_text('kafka_listen = "0.0.0.0:9092"\nkafka_advertised_address = "file:9092"\n')
    env = {
        "HEADWATER_KAFKA_LISTEN": "0.0.0.0:9093",
        "HEADWATER_KAFKA_ADVERTISED_ADDRESS": "env:9093",
    }
    assert load(file, {}, {}).kafka_address(9092) == "file:9092"
    from_env = load(file, env, {})
    assert from_env.kafka_listen == "0.0.0.0:9093"
    assert from_env.kafka_advertised_address == "env:9093"
    from_flags = load(file, env, {"kafka_listen": "10.0.0.1:9094"})
    assert from_flags.kafka_listen == "10.0.0.1:9094"
    assert from_flags.kafka_address(9094) == "env:9093"


@pytest.mark.parametrize(
    ("kafka_listen", "advertised_address", "kafka_port", "expected"),
    [
        ("10.0.0.1:9092", "", 9092, "10.0.0.1:9092"),
        ("127.0.0.1:0", "", 40123, "127.0.0.1:40123"),  # the port the system picked
        ("0.0.0.0:9092", "", 9092, "127.0.0.1:9092"),  # the listen host
        ("0.0.0.0:9092", "broker1.example:7700", 9092, "broker1.example:9092"),
        ("[::]:9092", "[2001:db8::1]:7700", 9092, "[2001:db8::1]:9092"),
        ("[::1]:9092", "", 9092, "[::1]:9092"),
    ],
)
def test_the_kafka_address_replaces_a_wildcard_host_with_the_client_host(
    kafka_listen: str, advertised_address: str, kafka_port: int, expected: str
) -> None:
    config = NodeConfig(kafka_listen=kafka_listen, advertised_address=advertised_address)
    assert config.kafka_address(kafka_port) == expected


@pytest.mark.parametrize("kafka_listen", ["", "0.0.0.0:0"])
def test_an_advertised_kafka_address_needs_a_fixed_kafka_port(kafka_listen: str) -> None:
    """The port Kafka clients are told must be the one bound: with no kafka_listen, or
    port 0, the system picks a port the advertised address cannot know."""
    with pytest.raises(HeadwaterError) as info:
        load(None, {"HEADWATER_KAFKA_ADVERTISED_ADDRESS": "node1:9092"}, {})
    assert info.value.code == ErrorCode.INVALID_CONFIG
    with pytest.raises(HeadwaterError) as info:
        NodeConfig(kafka_advertised_address="node1:9092", kafka_listen=kafka_listen)
    assert info.value.code == ErrorCode.INVALID_CONFIG
    assert "kafka_advertised_address needs kafka_listen with a fixed port" in info.value.message
    fixed = NodeConfig(kafka_advertised_address="node1:9092", kafka_listen="0.0.0.0:9092")
    assert fixed.kafka_address(9092) == "node1:9092"


def test_kafka_logins_over_plaintext_need_the_operator_to_allow_them() -> None:
    with pytest.raises(HeadwaterError) as info:
        NodeConfig(kafka_listen="127.0.0.1:9092", kafka_security_protocol="SASL_PLAINTEXT")
    assert info.value.code == ErrorCode.INVALID_CONFIG
    assert "credentials_over_plaintext = allow" in info.value.message
    allowed = NodeConfig(
        kafka_listen="127.0.0.1:9092",
        kafka_security_protocol="SASL_PLAINTEXT",
        credentials_over_plaintext="allow",
    )
    assert allowed.kafka_security_protocol == "SASL_PLAINTEXT"


def test_a_node_with_tls_takes_only_tls_on_its_kafka_listener() -> None:
    """Plaintext Kafka beside TLS listeners would open a way past TLS."""
    with pytest.raises(HeadwaterError) as info:
        NodeConfig(
            kafka_listen="127.0.0.1:9092",
            tls_cert_file="c.pem",
            tls_key_file="k.pem",
            tls_ca_file="ca.pem",
        )
    assert info.value.code == ErrorCode.INVALID_CONFIG
    assert "set kafka_security_protocol to SSL or SASL_SSL" in info.value.message
    with pytest.raises(HeadwaterError) as info:
        NodeConfig(kafka_listen="127.0.0.1:9092", kafka_security_protocol="SSL")
    assert "needs the node's TLS certificate" in info.value.message
    ssl_node = NodeConfig(
        kafka_listen="127.0.0.1:9092",
        kafka_security_protocol="SASL_SSL",
        tls_cert_file="c.pem",
        tls_key_file="k.pem",
        tls_ca_file="ca.pem",
    )
    assert ssl_node.kafka_security_protocol == "SASL_SSL"


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ({"HEADWATER_KAFKA_LISTEN": "nowhere"}, "HEADWATER_KAFKA_LISTEN must be HOST:PORT"),
        (
            {"HEADWATER_KAFKA_LISTEN": "0.0.0.0:9092", "HEADWATER_KAFKA_ADVERTISED_ADDRESS": "x"},
            "HEADWATER_KAFKA_ADVERTISED_ADDRESS must be HOST:PORT",
        ),
        ({"HEADWATER_KAFKA_LISTEN": "0.0.0.0:65536"}, "a port in [0, 65535]"),
    ],
)
def test_invalid_kafka_addresses_name_the_key_and_source(
    source: dict[str, str], fragment: str
) -> None:
    with pytest.raises(HeadwaterError) as info:
        load(None, source, {})
    assert info.value.code == ErrorCode.INVALID_CONFIG
    assert fragment in info.value.message


def test_serve_takes_the_kafka_listener_flags() -> None:
    """Refused before the node starts: the flags reach the same validation."""
    runner = CliRunner()
    result = runner.invoke(cli_main, ["serve", "--kafka-advertised-address", "node1:9092"], env={})
    assert result.exit_code == 1
    assert "kafka_advertised_address needs kafka_listen with a fixed port" in result.stderr
    result = runner.invoke(cli_main, ["serve", "--kafka-listen", "nowhere"], env={})
    assert result.exit_code == 1
    assert "--kafka-listen must be HOST:PORT" in result.stderr


def test_the_offsets_topic_must_fit_under_partitions_max() -> None:
    """A node whose ``__consumer_offsets`` could never be created (more partitions than
    any topic may have) is refused at start, not left answering every group request
    COORDINATOR_NOT_AVAILABLE."""
    with pytest.raises(HeadwaterError) as info:
        NodeConfig(partitions_max=6)
    assert info.value.code == ErrorCode.INVALID_CONFIG
    assert "offsets_topic_partitions (50) exceeds partitions_max (6)" in info.value.message
    assert NodeConfig(partitions_max=6, offsets_topic_partitions=6).partitions_max == 6
