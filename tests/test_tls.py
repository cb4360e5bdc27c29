"""TLS and mutual TLS (docs/security.md): the pure parts (settings from the environment,
principal mapping, handshake failures, certificate checks at start) with seeded inputs,
then real nodes with real certificates: mTLS clients accepted, a certificate from
another CA, an expired one, none at all and plaintext refused; a client that does not
trust the node gets TLS_HANDSHAKE_FAILED at once; a node with an expired or mismatched
certificate refuses to start; the health probe speaks TLS from the node's own settings;
and a 3-node cluster with TLS on both listeners loses no acks=all write while leaders are
killed.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from headwater.cli.security import apply_client_settings
from headwater.client import Admin, ClientSecurity, Consumer, Producer, RecordFuture
from headwater.node.cluster.peers import peer_error
from headwater.node.config import NodeConfig
from headwater.node.security.tls_setup import load_node_tls
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_errors import from_rpc_error
from headwater.shared.tls import handshake_failure
from headwater.tools.devcluster import LocalCluster, LocalNode
from headwater.tools.ports import free_port_block
from headwater.tools.tls_certs import DevPki, Issued, create_ca, create_dev_pki, issue, write
from tests.node_process import HEADWATER, run_cli, wait_until

# ------------------------------------------------------------------------------ pure


def test_settings_come_from_the_environment_with_kafka_names() -> None:
    assert not ClientSecurity.from_env({}).tls
    assert ClientSecurity.from_env({"HEADWATER_SECURITY_PROTOCOL": "SSL"}).tls
    implied = ClientSecurity.from_env({"HEADWATER_TLS_CA_FILE": "/ca.pem"})
    assert implied.tls and implied.ca_file == "/ca.pem"
    with pytest.raises(HeadwaterError, match="protocol is plaintext"):
        ClientSecurity.from_env(
            {"HEADWATER_SECURITY_PROTOCOL": "plaintext", "HEADWATER_TLS_SERVER_NAME": "x"}
        )
    for protocol, problem in (
        ("SASL_SSL", "needs credentials"),
        ("tcp", "unknown; valid: PLAINTEXT, SSL"),
    ):
        with pytest.raises(HeadwaterError, match=problem) as raised:
            ClientSecurity.from_env({"HEADWATER_SECURITY_PROTOCOL": protocol})
        assert raised.value.code == ErrorCode.INVALID_CONFIG
    with pytest.raises(HeadwaterError, match="go together"):
        ClientSecurity("tls", cert_file="/c.pem")
    with pytest.raises(HeadwaterError, match="protocol is plaintext"):
        ClientSecurity("plaintext", ca_file="/ca.pem")
    flagged = ClientSecurity().with_overrides(ca_file="/ca.pem", cert_file="", key_file="")
    assert flagged.tls and flagged.ca_file == "/ca.pem"


def test_handshake_failures_say_what_to_fix() -> None:
    cases = {
        "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL "
        "routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: certificate has expired": (
            "has expired"
        ),
        "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate": "tls_ca_file",
        "Custom verification check failed with error: UNAUTHENTICATED: Hostname "
        "Verification Check failed.": "tls_server_name",
        "SSL_ERROR_SSL: error:100000f7:SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER": (
            "does not speak TLS"
        ),
    }
    for details, advice in cases.items():
        found = handshake_failure(details)
        assert found is not None and advice in found, (details, found)
    assert "self-signed" in (
        handshake_failure(
            "CERTIFICATE_VERIFY_FAILED: self signed certificate"  # BoringSSL's spelling
        )
        or ""
    )
    assert "not valid yet" in (
        handshake_failure("CERTIFICATE_VERIFY_FAILED: certificate is not yet valid") or ""
    )
    for ordinary in ("Handshake read failed", "Handshake write failed", "Handshake timed out"):
        assert handshake_failure(f"ipv4:127.0.0.1:7700: {ordinary}") is None, ordinary
    assert handshake_failure("ipv4:127.0.0.1:7700: Socket closed") is None
    assert handshake_failure("Connection refused") is None


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return create_dev_pki(tmp_path_factory.mktemp("pki"), (1, 2, 3))


def _node_config(pki: DevPki, **overrides: str) -> NodeConfig:
    files = pki.nodes[1]
    settings = {
        "tls_cert_file": str(files.cert_file),
        "tls_key_file": str(files.key_file),
        "tls_ca_file": str(files.ca_file),
        **overrides,
    }
    return NodeConfig(**settings)  # type: ignore[arg-type]


def test_node_settings_are_checked_together(pki: DevPki) -> None:
    node = pki.nodes[1]
    with pytest.raises(HeadwaterError, match="go together"):
        NodeConfig(tls_cert_file=str(node.cert_file))
    with pytest.raises(HeadwaterError, match="need TLS"):
        NodeConfig(tls_ca_file=str(node.ca_file))
    with pytest.raises(HeadwaterError, match="needs tls_ca_file"):
        _node_config(pki, tls_ca_file="", tls_client_auth="required")
    with pytest.raises(HeadwaterError, match="TLS needs tls_ca_file"):
        _node_config(pki, tls_ca_file="")  # one node verifies itself when it registers
    with pytest.raises(HeadwaterError, match="TLS needs tls_ca_file"):
        _node_config(
            pki,
            tls_ca_file="",
            quorum="1@127.0.0.1:7801,2@127.0.0.1:7803",
            cluster_secret="s" * 32,
        )
    with pytest.raises(HeadwaterError, match="valid: none, required"):
        _node_config(pki, tls_client_auth="optional")
    loaded = load_node_tls(_node_config(pki, tls_client_auth="required"))
    assert loaded is not None and loaded.client_auth_required
    assert load_node_tls(NodeConfig()) is None


def test_a_node_refuses_certificates_it_could_not_serve_with(pki: DevPki, tmp_path: Path) -> None:
    files = pki.nodes[1]
    soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=400)
    with pytest.raises(HeadwaterError, match="expired on"):
        load_node_tls(_node_config(pki), now=soon)
    earlier = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2)
    with pytest.raises(HeadwaterError, match="not valid before"):
        load_node_tls(_node_config(pki), now=earlier)
    with pytest.raises(HeadwaterError, match="is not the key of"):
        load_node_tls(_node_config(pki, tls_key_file=str(pki.nodes[2].key_file)))
    (tmp_path / "empty.pem").write_text("not a certificate\n")
    with pytest.raises(HeadwaterError, match="holds no PEM block"):
        load_node_tls(_node_config(pki, tls_ca_file=str(tmp_path / "empty.pem")))
    (tmp_path / "huge.pem").write_bytes(b"-----BEGIN CERTIFICATE-----\n" + b"A" * (1 << 21))
    with pytest.raises(HeadwaterError, match="valid: up to 1048576"):
        load_node_tls(_node_config(pki, tls_cert_file=str(tmp_path / "huge.pem")))
    with pytest.raises(HeadwaterError, match="cannot be read"):
        load_node_tls(_node_config(pki, tls_key_file=str(tmp_path / "missing.key")))
    assert files.key_file.stat().st_mode & 0o077 == 0, "private keys are owner-only"


# ------------------------------------------------------------------------- one node


@pytest.fixture(scope="module")
def mtls_node(pki: DevPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNode]:
    """One node whose client listener requires a client certificate from ``pki``."""
    root = tmp_path_factory.mktemp("mtls")
    node = LocalNode(root / "data", tls=pki.nodes[1], tls_client_auth=True)
    node.start()
    try:
        yield node
    finally:
        node.kill()


def _client(pki: DevPki) -> ClientSecurity:
    return ClientSecurity(
        "tls", str(pki.ca_file), str(pki.client.cert_file), str(pki.client.key_file)
    )


def _refused(address: str, security: ClientSecurity) -> HeadwaterError:
    """The error of a call that every attempt fails (within a short request timeout)."""
    with (
        pytest.raises(HeadwaterError) as raised,
        Admin(address, request_timeout_s=1.5, security=security) as admin,
    ):
        admin.list_topics()
    return raised.value


def test_mutual_tls_accepts_its_ca_and_refuses_every_other_client(
    mtls_node: LocalNode, pki: DevPki, tmp_path: Path
) -> None:
    address = mtls_node.address
    with Admin(address, security=_client(pki)) as admin:
        admin.create_topic("secured", 1, 1)
    with Producer(address, acks="all", security=_client(pki)) as producer:
        producer.send("secured", b"through TLS").result(timeout=30)
    consumer = Consumer(address, auto_offset_reset="earliest", security=_client(pki))
    try:
        consumer.assign([("secured", 0)])
        got: list[bytes] = []
        wait_until(
            lambda: got.extend(r.value for r in consumer.poll(timeout_ms=200) if r.value) or got,
            30,
            "the record back through TLS",
        )
        assert got == [b"through TLS"]
    finally:
        consumer.close()

    other_ca = create_ca("Another CA")
    stranger = write(issue(other_ca, "mallory"), tmp_path, "mallory", pki.ca_file)
    ca_cert = (pki.folder / "ca.crt").read_bytes()
    ca_key = (pki.folder / "ca.key").read_bytes()
    expired = write(
        issue(Issued(ca_cert, ca_key), "old-client", days=-1), tmp_path, "old", pki.ca_file
    )
    for label, security in (
        (
            "another CA's certificate",
            ClientSecurity(
                "tls", str(pki.ca_file), str(stranger.cert_file), str(stranger.key_file)
            ),
        ),
        (
            "an expired certificate",
            ClientSecurity("tls", str(pki.ca_file), str(expired.cert_file), str(expired.key_file)),
        ),
        ("no certificate", ClientSecurity("tls", str(pki.ca_file))),
        ("plaintext", ClientSecurity()),
    ):
        error = _refused(address, security)
        # The refusal reaches the client as a closed connection (TLS 1.3 sends the
        # server's alert after the client's side of the handshake is done).
        assert error.code == ErrorCode.NETWORK_EXCEPTION, (label, error)
    log = mtls_node.log()
    for cause in ("PEER_DID_NOT_RETURN_A_CERTIFICATE", "CERTIFICATE_VERIFY_FAILED"):
        assert cause in log, f"the node's log names the refused handshakes ({cause})"

    wrong_trust = ClientSecurity(
        "tls", str(tmp_path / "mallory.crt"), str(pki.client.cert_file), str(pki.client.key_file)
    )
    began = time.monotonic()
    with (
        pytest.raises(HeadwaterError) as raised,
        Admin(address, request_timeout_s=60, security=wrong_trust) as admin,
    ):
        admin.list_topics()
    error = raised.value
    assert error.code == ErrorCode.TLS_HANDSHAKE_FAILED and not error.retriable
    assert "not signed by a CA this client trusts" in str(error)
    assert time.monotonic() - began < 20, "a handshake the client refuses is not retried"

    renamed = ClientSecurity(
        "tls",
        str(pki.ca_file),
        str(pki.client.cert_file),
        str(pki.client.key_file),
        "elsewhere.example",
    )
    assert _refused(address, renamed).code == ErrorCode.TLS_HANDSHAKE_FAILED


@pytest.fixture
def plaintext_port() -> Iterator[str]:
    """A plaintext gRPC server with no services: a TLS client's handshake fails there."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def test_one_node_refusing_the_handshake_does_not_stop_the_others(
    mtls_node: LocalNode, pki: DevPki, plaintext_port: str
) -> None:
    """TLS_HANDSHAKE_FAILED is not retried against the same node, but the client still
    tries every other bootstrap address (in a shuffled order) before giving up."""
    for _ in range(4):
        with Admin(f"{plaintext_port},{mtls_node.address}", security=_client(pki)) as admin:
            admin.list_topics()


def test_a_failed_handshake_between_nodes_is_not_the_clients_error(
    pki: DevPki, plaintext_port: str
) -> None:
    """A node passing on a client's call reports a peer it could not handshake with as
    BROKER_NOT_AVAILABLE (retriable), never as the client-side TLS_HANDSHAKE_FAILED."""
    with grpc.secure_channel(plaintext_port, _client(pki).credentials()) as channel:
        call = channel.unary_unary("/headwater.v1.Broker/Metadata")
        with pytest.raises(grpc.RpcError) as raised:
            call(b"", timeout=10)
    assert from_rpc_error(raised.value, "x").code == ErrorCode.TLS_HANDSHAKE_FAILED
    relayed = peer_error(raised.value, plaintext_port)
    assert relayed.code == ErrorCode.BROKER_NOT_AVAILABLE and relayed.retriable


def test_the_health_probe_speaks_tls_with_the_nodes_own_settings(
    mtls_node: LocalNode, pki: DevPki
) -> None:
    probe = [sys.executable, "-m", "headwater.healthcheck", mtls_node.address]
    node_env = {k: v for k, v in mtls_node.env.items() if k.startswith("HEADWATER_TLS_")}
    base = {k: v for k, v in os.environ.items() if not k.startswith("HEADWATER_")}
    served = subprocess.run(
        probe, env={**base, **node_env}, capture_output=True, text=True, check=False
    )
    assert served.returncode == 0, served.stdout + served.stderr
    plain = subprocess.run(probe, env=base, capture_output=True, text=True, check=False)
    assert plain.returncode == 1
    cli = run_cli("cluster", "health", "--address", mtls_node.address, env=node_env)
    assert cli.returncode == 0, cli.stderr


def test_a_node_with_an_expired_certificate_does_not_start(pki: DevPki, tmp_path: Path) -> None:
    ca = Issued((pki.folder / "ca.crt").read_bytes(), (pki.folder / "ca.key").read_bytes())
    old = write(
        issue(ca, "node-1", ("localhost",), ("127.0.0.1",), days=-1), tmp_path, "old", pki.ca_file
    )
    node = LocalNode(tmp_path / "data", tls=old)
    node.start(wait=False)
    assert node.process is not None
    assert node.process.wait(timeout=60) != 0
    assert "expired on" in node.log() and "renew it" in node.log()


# ------------------------------------------------------------------------ a cluster


@pytest.mark.slow
def test_a_tls_cluster_loses_no_acks_all_write_while_leaders_are_killed(
    pki: DevPki, tmp_path: Path
) -> None:
    """Both listeners speak TLS (nodes verify each other with the CA; clients present a
    certificate): replication, forwarding and the controller's calls all pass through
    it, and acknowledged writes survive three leader kills."""
    cluster = LocalCluster(tmp_path, 3, tls=pki, tls_client_auth=True)
    cluster.start()
    try:
        cluster.wait_settled()
        security = cluster.client_security
        with Admin(cluster.bootstrap(), security=security) as admin:
            admin.create_topic("safe-tls", 1, 3, {"min_insync_replicas": "2"})
        acked: set[bytes] = set()
        stop = threading.Event()
        errors: list[BaseException] = []

        def produce() -> None:
            sequence = 0
            try:
                with Producer(cluster.bootstrap(), acks="all", security=security) as producer:
                    while not stop.is_set():
                        futures: list[tuple[bytes, RecordFuture]] = []
                        for _ in range(50):
                            value = b"v%07d" % sequence
                            sequence += 1
                            futures.append((value, producer.send("safe-tls", value)))
                        for value, future in futures:
                            try:
                                future.result(timeout=60)
                                acked.add(value)
                            except HeadwaterError:
                                pass
            except BaseException as exc:  # reported by the test below
                errors.append(exc)

        producer_thread = threading.Thread(target=produce, daemon=True)
        producer_thread.start()
        try:
            for _ in range(3):
                floor = len(acked)
                wait_until(lambda floor=floor: len(acked) >= floor + 500, 60, "acknowledged writes")
                with Admin(cluster.bootstrap(), security=security) as admin:
                    leader = admin.describe_topics(["safe-tls"])[0].partitions[0].leader
                cluster.nodes[leader].kill()
                floor = len(acked)
                wait_until(
                    lambda floor=floor: len(acked) >= floor + 500, 60, "writes to a new leader"
                )
                cluster.nodes[leader].start()

                def healed() -> bool:
                    with Admin(cluster.bootstrap(), security=security) as admin:
                        return len(admin.describe_topics(["safe-tls"])[0].partitions[0].isr) == 3

                wait_until(healed, 60, "the ISR to heal through TLS")
        finally:
            stop.set()
            producer_thread.join(timeout=120)
        assert not errors, errors
        consumer = Consumer(cluster.bootstrap(), auto_offset_reset="earliest", security=security)
        seen: set[bytes] = set()
        try:
            consumer.assign([("safe-tls", 0)])

            def all_read() -> bool:
                seen.update(r.value for r in consumer.poll(timeout_ms=500) if r.value)
                return acked <= seen

            wait_until(all_read, 120, f"all {len(acked)} acknowledged values read back")
        finally:
            consumer.close()
        assert len(acked) >= 3000
    finally:
        cluster.close()


# ---------------------------------------------------------------- the command line


def test_client_settings_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    config = tmp_path / "client.toml"
    config.write_text(
        'bootstrap = "10.0.0.1:7700"\nsecurity_protocol = "SSL"\n'
        'tls_ca_file = "/file/ca.crt"\ntls_server_name = "from-file"\n'
    )
    env = {"HEADWATER_TLS_CA_FILE": "/env/ca.crt"}
    security = apply_client_settings(
        {"tls_server_name": "from-flag", "tls_cert_file": None}, config, env
    )
    assert env["HEADWATER_BOOTSTRAP"] == "10.0.0.1:7700"
    assert security.tls and security.ca_file == "/env/ca.crt"
    assert security.server_name == "from-flag"
    assert env["HEADWATER_TLS_SERVER_NAME"] == "from-flag"
    # a later layer's PLAINTEXT drops earlier TLS files; a later TLS file implies SSL
    plain_env = {"HEADWATER_TLS_CA_FILE": "/env/ca.crt"}
    assert not apply_client_settings({"security_protocol": "PLAINTEXT"}, None, plain_env).tls
    assert "HEADWATER_TLS_CA_FILE" not in plain_env
    flagged = {"HEADWATER_SECURITY_PROTOCOL": "PLAINTEXT"}
    assert apply_client_settings({"tls_ca_file": "/flag/ca.crt"}, None, flagged).tls
    # a certificate is never paired with another layer's key
    mixed = {"HEADWATER_TLS_CERT_FILE": "/env/c.crt", "HEADWATER_TLS_KEY_FILE": "/env/c.key"}
    with pytest.raises(HeadwaterError, match="go together"):
        apply_client_settings({"tls_cert_file": "/flag/c.crt"}, None, mixed)
    for text, problem in (
        ('tls_ca = "x"\n', "unknown keys tls_ca; valid: bootstrap, security_protocol"),
        ("tls_ca_file = 3\n", "must be a string"),
        ("tls_ca_file = \n", "not valid TOML"),
        ('security_protocol = "SASL_SSL"\n', "needs credentials"),
    ):
        config.write_text(text)
        with pytest.raises(HeadwaterError, match=problem):
            apply_client_settings({}, config, {})
    config.write_text("#" * (65 << 10))
    with pytest.raises(HeadwaterError, match="valid: up to 65536"):
        apply_client_settings({}, config, {})


def test_serve_refuses_a_shell_holding_client_tls_settings(tmp_path: Path) -> None:
    refused = run_cli(
        "serve",
        "--data-dir",
        str(tmp_path / "d"),
        env={"HEADWATER_SECURITY_PROTOCOL": "SSL", "HEADWATER_TLS_CA_FILE": "/ca.crt"},
    )
    assert refused.returncode != 0
    assert b"HEADWATER_SECURITY_PROTOCOL is set" in refused.stderr


def test_dev_cluster_tls_takes_one_command_and_keeps_its_ca(tmp_path: Path) -> None:
    """``headwater dev-cluster --tls`` prints the client settings; the CLI with them (from
    a client config file) creates, writes and reads through mutual TLS; without a client
    certificate it is refused; a restart keeps the CA, so the settings stay valid."""
    base = free_port_block(6)
    data_dir = tmp_path / "dev"
    exports: dict[str, str] = {}
    for attempt in range(2):
        process = subprocess.Popen(
            [
                *HEADWATER,
                "dev-cluster",
                "--tls",
                "--base-port",
                str(base),
                "--data-dir",
                str(data_dir),
                "--metrics-base-port",
                "0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("HEADWATER_")},
        )
        try:
            assert process.stdout is not None
            printed: dict[str, str] = {}
            for raw in process.stdout:
                line = raw.decode()
                if line.startswith("export "):
                    name, _, value = line.removeprefix("export ").strip().partition("=")
                    printed[name] = value
                if line.startswith("Ctrl-C"):
                    break
            assert printed["HEADWATER_SECURITY_PROTOCOL"] == "SSL"
            if attempt == 0:
                exports = printed
                config = tmp_path / "client.toml"
                config.write_text(
                    f'bootstrap = "{printed["HEADWATER_BOOTSTRAP"]}"\n'
                    f'tls_ca_file = "{printed["HEADWATER_TLS_CA_FILE"]}"\n'
                    f'tls_cert_file = "{printed["HEADWATER_TLS_CERT_FILE"]}"\n'
                    f'tls_key_file = "{printed["HEADWATER_TLS_KEY_FILE"]}"\n'
                )
                clean = {"HEADWATER_CLIENT_CONFIG": str(config)}
                created = run_cli(
                    "topics", "create", "tls-cli", "--replication-factor", "3", env=clean
                )
                assert created.returncode == 0, created.stderr
                produced = run_cli("produce", "tls-cli", input_bytes=b"a\nb\nc\n", env=clean)
                assert produced.returncode == 0, produced.stderr
                refused = run_cli(
                    "--security-protocol",
                    "SSL",
                    "--tls-ca-file",
                    printed["HEADWATER_TLS_CA_FILE"],
                    "topics",
                    "list",
                    "--bootstrap",
                    printed["HEADWATER_BOOTSTRAP"],
                    timeout=120,
                )
                assert (
                    refused.returncode != 0
                    and b"refuse this client's certificate" in refused.stderr
                )
            else:
                assert printed == exports, "a restart keeps the CA and the client's files"
                read = run_cli(
                    "--client-config",
                    str(tmp_path / "client.toml"),
                    "consume",
                    "tls-cli",
                    "--from-beginning",
                    "--max-messages",
                    "3",
                    timeout=120,
                )
                assert read.returncode == 0 and read.stdout.split() == [b"a", b"b", b"c"], read
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
                assert process.stdout is not None
                process.stdout.close()


def test_tls_init_makes_named_certificates_and_refuses_bad_requests(tmp_path: Path) -> None:
    made = run_cli("tls", "init", str(tmp_path / "pki"), "--node", "node1", "--client", "alice")
    assert made.returncode == 0, made.stderr
    for name in ("ca", "node1", "alice"):
        assert (tmp_path / "pki" / f"{name}.crt").is_file()
        assert (tmp_path / "pki" / f"{name}.key").stat().st_mode & 0o077 == 0
    for args, problem in (
        (("--node", "node2"), b"ca.crt exists"),
        ((), b"give at least one --node or --client"),
        (("--node", "bad name"), b"valid names are 1..64 letters"),
        (("--node", "x", "--client", "x"), b"names must be distinct"),
    ):
        folder = tmp_path / ("pki" if problem == b"ca.crt exists" else f"other-{len(args)}")
        refused = run_cli("tls", "init", str(folder), *args)
        assert refused.returncode != 0 and problem in refused.stderr, refused.stderr
