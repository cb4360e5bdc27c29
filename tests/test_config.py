"""Configuration: precedence, validation messages, and generated docs."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from headwater.addresses import DEFAULT_LISTEN
from headwater.config import (
    SETTINGS,
    NodeConfig,
    load,
    parse_topic_configs,
    render_markdown,
)
from headwater.errors import ErrorCode, HeadwaterError
from headwater.node.log_manager import DataDirError, loopback_secret_path, shared_secret

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


def test_configuration_doc_is_current() -> None:
    assert (ROOT / "docs/configuration.md").read_text() == render_markdown(), (
        "run python -m headwater.config > docs/configuration.md"
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
