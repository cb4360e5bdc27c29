"""The compose deployment with mutual TLS (deploy/docker-compose.tls.yml, ``make up
TLS=1``) run for real: certificates made by ``headwater tls init`` on first use, three
nodes healthy through a TLS health check, a replicated topic written and read back with
the printed client settings, a plaintext client and one without a certificate refused,
and ``make down VOLUMES=1``.

Runs after tests/test_deploy.py and test_deploy_host.py have taken their deployments
down (all publish the same ports). Skipped, saying why, where no Docker Engine runs.
"""

from __future__ import annotations

import shutil

import pytest

from headwater.client import Admin, ClientSecurity, Consumer, Producer
from headwater.shared.errors import ErrorCode, HeadwaterError
from tests.node_process import wait_until
from tests.test_deploy import BOOTSTRAP, ROOT, _docker_runs, make

RECORDS = 5_000

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(_docker_runs() is not None, reason=f"docker-compose: {_docker_runs()}"),
]


def test_tls_deployment_serves_mutual_tls_clients_only() -> None:
    tls_dir = ROOT / "deploy/.tls"
    made_here = not tls_dir.exists()
    make("down", "VOLUMES=1", timeout_s=300)
    up = make("up", "TLS=1", timeout_s=1800)
    try:
        assert up.returncode == 0, f"make up failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
        assert "3 nodes healthy" in up.stdout, "the healthcheck passes through TLS"
        printed = dict(
            line.removeprefix("export ").split("=", 1)
            for line in up.stdout.splitlines()
            if line.startswith("export HEADWATER_")
        )
        security = ClientSecurity(
            printed["HEADWATER_SECURITY_PROTOCOL"],
            printed["HEADWATER_TLS_CA_FILE"],
            printed["HEADWATER_TLS_CERT_FILE"],
            printed["HEADWATER_TLS_KEY_FILE"],
        )
        with Admin(BOOTSTRAP, security=security) as admin:
            admin.create_topic("sealed", 3, 3, {"min_insync_replicas": "2"})
        with Producer(BOOTSTRAP, acks="all", security=security) as producer:
            for i in range(RECORDS):
                producer.send("sealed", f"s{i}".encode(), key=str(i).encode())
            producer.flush()
        consumer = Consumer(BOOTSTRAP, auto_offset_reset="earliest", security=security)
        seen: set[bytes] = set()
        try:
            consumer.assign([("sealed", p) for p in range(3)])

            def all_read() -> bool:
                seen.update(r.value for r in consumer.poll(timeout_ms=500) if r.value)
                return len(seen) == RECORDS

            wait_until(all_read, 60, f"all {RECORDS} records back through TLS")
        finally:
            consumer.close()
        for refused in (ClientSecurity(), ClientSecurity("tls", security.ca_file)):
            with (
                pytest.raises(HeadwaterError) as raised,
                Admin(BOOTSTRAP, request_timeout_s=2, security=refused) as admin,
            ):
                admin.list_topics()
            assert raised.value.code == ErrorCode.NETWORK_EXCEPTION
    finally:
        down = make("down", "VOLUMES=1", timeout_s=300)
        if made_here:
            shutil.rmtree(tls_dir, ignore_errors=True)
    assert down.returncode == 0, down.stderr
