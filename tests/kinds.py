"""Which kind each test module is, for a reader and for ``pytest -m``: ``unit`` tests run in
the test process alone (pure cores, in-process servers, real files); ``simulated`` ones
drive the simulated cluster (``tests/sim_cluster.py``); ``processes`` ones start real
programs (headwater nodes, the CLI, Spark's JVM, kcat, Docker). ``tests/conftest.py`` marks
every collected test with its module's kind; ``make test-unit`` runs the unit kind alone,
and ``tests/test_layers.py`` checks that every test module is listed here once."""

from __future__ import annotations

from typing import Final

UNIT: Final = frozenset(
    {
        "test_access_core",
        "test_accumulator",
        "test_acls",
        "test_admin_types",
        "test_batch",
        "test_broker_liveness",
        "test_broker_session",
        "test_chaos_checker",
        "test_chaos_replicas",
        "test_classic_groups",
        "test_compaction",
        "test_config",
        "test_consume_format",
        "test_consumer_records",
        "test_controller",
        "test_fetch_session",
        "test_file_log_recovery",
        "test_follower_truncation",
        "test_replica_roles",
        "test_generated_code",
        "test_group_shard",
        "test_groups_core",
        "test_groups_decisions",
        "test_kafka_admission",
        "test_kafka_connection",
        "test_kafka_consumer_heartbeat",
        "test_layers",
        "test_leader_epochs",
        "test_log_conformance",
        "test_transactions_core",
        "test_membership",
        "test_positions",
        "test_producer_settings",
        "test_producer_state",
        "test_raft_follower_append",
        "test_raft_journal",
        "test_replication_math",
        "test_scram",
        "test_sealed_files",
        "test_spark_planning",
        "test_spark_sink_chunks",
        "test_storage_faults",
    }
)
SIMULATED: Final = frozenset(
    {
        "test_sim_cluster",
    }
)
PROCESSES: Final = frozenset(
    {
        "test_api_contract",
        "test_authorization",
        "test_boundary_sweep",
        "test_chaos",
        "test_cli",
        "test_cli_output",
        "test_client_aio",
        "test_client_api",
        "test_client_engines",
        "test_cluster",
        "test_compression_bombs",
        "test_crash",
        "test_deploy",
        "test_deploy_host",
        "test_deploy_tls",
        "test_dev_cluster",
        "test_disk_full",
        "test_extras",
        "test_fork_safety",
        "test_groups",
        "test_hardening",
        "test_hostile_requests",
        "test_hostile_requests_cluster",
        "test_idempotence",
        "test_isr_stale_metadata",
        "test_kafka_attacks",
        "test_kafka_clients",
        "test_kafka_cluster",
        "test_kafka_security",
        "test_kafka_wire",
        "test_log_cleaner",
        "test_metrics",
        "test_peer_streams",
        "test_producer_send_paths",
        "test_pure_cores",
        "test_quotas",
        "test_replication",
        "test_rust_example",
        "test_safety",
        "test_sasl_sessions",
        "test_security_attacks",
        "test_security_cluster",
        "test_server",
        "test_slow_disk",
        "test_spark",
        "test_stock_client_limits",
        "test_tls",
        "test_two_fronts",
    }
)

KIND_OF_MODULE: Final = {
    **dict.fromkeys(UNIT, "unit"),
    **dict.fromkeys(SIMULATED, "simulated"),
    **dict.fromkeys(PROCESSES, "processes"),
}
