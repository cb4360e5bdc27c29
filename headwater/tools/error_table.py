"""docs/errors.md: every ErrorCode with its gRPC status, retriability and what a client
does about it, generated from ``headwater.shared.errors`` and ``CLIENT_ACTION`` below.

    python -m headwater.tools.error_table > docs/errors.md

This module is pure: no I/O.
"""

from __future__ import annotations

from typing import Final

from headwater.shared.errors import GRPC_STATUS_OF, ErrorCode, is_retriable

_REFRESH = "refresh metadata (Metadata), then send again to the partition's leader"
_FIND_COORDINATOR = "find the coordinator again (FindCoordinator), then retry"
_FIX_REQUEST = "fix the request: the message names the field and the valid range"

CLIENT_ACTION: Final[dict[ErrorCode, str]] = {
    ErrorCode.UNKNOWN_SERVER_ERROR: "an unexpected failure in the node (its log has the "
    "traceback); report it. Retry only what is safe to repeat",
    ErrorCode.OFFSET_OUT_OF_RANGE: "the offset is below the log start (retention, deletion) "
    "or past the high watermark: reset the position by the consumer's offset reset policy "
    "(ListOffsets earliest or latest)",
    ErrorCode.CORRUPT_MESSAGE: "the batch breaks a rule of docs/record-batch-format.md, "
    "named in the message: fix the encoder. Resending the same bytes fails the same way",
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: "the topic does not exist (yet, or any more): "
    "retry while it is being created, then give up; a partition number the topic does "
    "not have is PARTITION_OUT_OF_RANGE instead",
    ErrorCode.INVALID_FETCH_SIZE: _FIX_REQUEST,
    ErrorCode.LEADER_NOT_AVAILABLE: "an election is in progress: back off, " + _REFRESH,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: "leadership moved: " + _REFRESH,
    ErrorCode.REQUEST_TIMED_OUT: "the replicas did not confirm in time; the write may or "
    "may not have been stored: retry (an idempotent producer's retry is never duplicated)",
    ErrorCode.BROKER_NOT_AVAILABLE: "back off, then retry (another node may answer)",
    ErrorCode.MESSAGE_TOO_LARGE: "the batch, or its body once decompressed, exceeds the "
    "topic's max_message_bytes (named in the message): send smaller batches, or raise the "
    "topic setting",
    ErrorCode.OFFSET_METADATA_TOO_LARGE: "shorten the commit's metadata to 4096 bytes",
    ErrorCode.NETWORK_EXCEPTION: "the connection broke; whether the node acted on the "
    "request is unknown: reconnect and retry what is safe to repeat",
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS: "back off, then retry",
    ErrorCode.COORDINATOR_NOT_AVAILABLE: "back off, then " + _FIND_COORDINATOR,
    ErrorCode.NOT_COORDINATOR: _FIND_COORDINATOR,
    ErrorCode.INVALID_TOPIC_EXCEPTION: "use a valid topic name (the message gives the rule)",
    ErrorCode.RECORD_LIST_TOO_LARGE: "send fewer records per request",
    ErrorCode.NOT_ENOUGH_REPLICAS: "fewer in-sync replicas than min_insync_replicas; nothing "
    "was appended: back off and retry",
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: "appended by the leader but not confirmed by "
    "min_insync_replicas: retry (an idempotent producer's retry is never duplicated)",
    ErrorCode.INVALID_REQUIRED_ACKS: "use ACKS_ALL for idempotent batches; a valid Acks value",
    ErrorCode.INVALID_GROUP_ID: "use a group id of 1 to 255 bytes",
    ErrorCode.UNKNOWN_MEMBER_ID: "join the group again with member_epoch 0",
    ErrorCode.INVALID_SESSION_TIMEOUT: _FIX_REQUEST,
    ErrorCode.TOPIC_AUTHORIZATION_FAILED: "the principal lacks an ACL on the topic "
    "(docs/security.md): an operator grants it",
    ErrorCode.GROUP_AUTHORIZATION_FAILED: "the principal lacks an ACL on the group",
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED: "the principal lacks an ACL on the cluster; or "
    "the call went to a node's inter-broker listener, which serves only the nodes of the "
    "cluster: connect to its client listener (--listen) instead",
    ErrorCode.INVALID_TIMESTAMP: "a record timestamp is outside the range the message names "
    "(the topic's message_timestamp_* settings)",
    ErrorCode.TOPIC_ALREADY_EXISTS: "the topic exists: use it (or delete it first)",
    ErrorCode.INVALID_PARTITIONS: _FIX_REQUEST,
    ErrorCode.INVALID_REPLICATION_FACTOR: "the factor exceeds the live brokers or the valid "
    "range: " + _FIX_REQUEST,
    ErrorCode.INVALID_REPLICA_ASSIGNMENT: _FIX_REQUEST,
    ErrorCode.INVALID_CONFIG: _FIX_REQUEST,
    ErrorCode.NOT_CONTROLLER: "a controller election is in progress: back off, then retry",
    ErrorCode.INVALID_REQUEST: _FIX_REQUEST,
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER: "start the partition's sequence again at a new "
    "producer epoch (docs/record-batch-format.md, Idempotent producers)",
    ErrorCode.DUPLICATE_SEQUENCE_NUMBER: "the batch was written before: count it as written",
    ErrorCode.INVALID_PRODUCER_EPOCH: "a newer instance of this producer took over: stop",
    ErrorCode.INVALID_TXN_STATE: "the transaction is not in a state that allows this call "
    "(an end that contradicts the one under way): abort and begin again",
    ErrorCode.INVALID_PRODUCER_ID_MAPPING: "the producer id is not the transactional id's "
    "current one: initialize the producer again",
    ErrorCode.INVALID_TRANSACTION_TIMEOUT: _FIX_REQUEST,
    ErrorCode.CONCURRENT_TRANSACTIONS: "the transactional id's previous transaction is still "
    "ending: retry shortly",
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "the caller may not use this "
    "transactional id: ask for write on it",
    ErrorCode.KAFKA_STORAGE_ERROR: "the leader's disk failed; leadership moves: " + _REFRESH,
    ErrorCode.SASL_AUTHENTICATION_FAILED: "fix the username or password; retrying the same "
    "credentials fails the same way",
    ErrorCode.UNKNOWN_PRODUCER_ID: "start the partition again at a new producer epoch, "
    "sequence 0 (or ask InitProducerId for a new id)",
    ErrorCode.REASSIGNMENT_IN_PROGRESS: "wait for the partition's reassignment to finish",
    ErrorCode.NON_EMPTY_GROUP: "stop the group's members first",
    ErrorCode.GROUP_ID_NOT_FOUND: "the group does not exist",
    ErrorCode.FENCED_LEADER_EPOCH: "the client's leader epoch is older than the leader's: "
    + _REFRESH,
    ErrorCode.UNKNOWN_LEADER_EPOCH: "the client's leader epoch is newer than this node's: "
    "back off, " + _REFRESH,
    ErrorCode.UNSUPPORTED_COMPRESSION_TYPE: "use codec 0 (none), 3 (lz4) or 4 (zstd)",
    ErrorCode.STALE_BROKER_EPOCH: "internal (brokers only): the broker registers again",
    ErrorCode.OFFSET_NOT_AVAILABLE: "a new leader is catching up its high watermark: retry",
    ErrorCode.INVALID_RECORD: "a record breaks the topic's rules (a compacted topic's "
    "records need keys): fix the records",
    ErrorCode.GROUP_MAX_SIZE_REACHED: "the group has group_max_size members: use another "
    "group, or raise the setting",
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL: "the group has members of the other group protocol "
    "(Kafka's classic JoinGroup, or ConsumerGroupHeartbeat): use another group id, or let "
    "those members leave first",
    ErrorCode.PRODUCER_FENCED: "a newer instance of this transactional producer took over: stop",
    ErrorCode.THROTTLING_QUOTA_EXCEEDED: "a limit on open streams, long polls or "
    "concurrent work was reached: back off, then retry",
    ErrorCode.FENCED_MEMBER_EPOCH: "give up every partition (on_lost), join again with "
    "member_epoch 0",
    ErrorCode.UNRELEASED_INSTANCE_ID: "another live member holds the group_instance_id: use "
    "another, or wait for it to leave",
    ErrorCode.UNSUPPORTED_ASSIGNOR: "use a server assignor the group supports (uniform, range)",
    ErrorCode.STALE_MEMBER_EPOCH: "heartbeat to learn the current assignment, then commit "
    "only partitions the member holds",
    ErrorCode.INVALID_REGULAR_EXPRESSION: "fix the subscription pattern (RE2 syntax)",
    ErrorCode.PARTITION_NOT_ASSIGNED: "commit only partitions assigned to the member",
    ErrorCode.TLS_HANDSHAKE_FAILED: "client-side only: fix the trust settings (CA, server "
    "name) or the scheme (docs/security.md)",
    ErrorCode.FETCH_RESPONSE_TOO_LARGE: "raise the client's gRPC receive limit and "
    "max_response_bytes above the batch size the message names",
    ErrorCode.PARTITION_OUT_OF_RANGE: "the partition number is not in [0, partitions) of the "
    "topic (the message names the range): send to a partition the topic has. After "
    "CreatePartitions, refresh metadata once before giving up",
    ErrorCode.SASL_SESSION_EXPIRED: "log in again (Sasl.Authenticate) and retry; the "
    "project's clients do it by themselves",
}
assert set(CLIENT_ACTION) == set(ErrorCode) - {ErrorCode.NONE}


def render_markdown() -> str:
    """docs/errors.md."""
    lines = [
        "# Errors",
        "",
        "Generated from `headwater/shared/errors.py` and `headwater/tools/error_table.py` by",
        "`python -m headwater.tools.error_table`; do not edit.",
        "",
        "A failed call ends with the gRPC status below. Its details (the standard",
        "`grpc-status-details-bin` trailer, a serialized `google.rpc.Status`) carry one",
        '`google.rpc.ErrorInfo` with domain `"headwater.v1"`, `reason` the code\'s name and',
        'metadata `code` (the number) and `retriable` (`"true"` or `"false"`); the status',
        "message is `<NAME>: <what was wrong, and the valid range>`. Answers that carry an",
        "error per item instead of ending the call (ProduceStream's answers, CreateTopics'",
        "and DeleteTopics' results, OffsetCommit's results) carry `error_code`,",
        "`error_message` and `retriable` fields with the same meaning.",
        "",
        "**Retriable** means the same request may succeed later without change: back off",
        "(100 ms, doubling, up to a few seconds) and send it again, refreshing metadata",
        "first where the table says so. A code that is not retriable fails the same way",
        "until the request or the cluster's settings change.",
        "",
        "gRPC statuses that carry no ErrorInfo come from the transport: `UNAVAILABLE` (the",
        "node cannot be reached: retry, or try another node), `DEADLINE_EXCEEDED` (the",
        "client's deadline passed: the request may or may not have been acted on),",
        "`CANCELLED`, and `RESOURCE_EXHAUSTED` without ErrorInfo (a message over a gRPC size",
        "limit: raise the receiving side's limit). Some client libraries report a connection",
        "that breaks in the middle of a call as `UNKNOWN` (tonic built without its `server`",
        "feature says `transport error`): a status without ErrorInfo is the transport's, and",
        "a client treats it as a broken connection. An answer over the client's own receive",
        "limit is refused by the client library itself, also without ErrorInfo (tonic:",
        "`OUT_OF_RANGE`, the status of `OFFSET_OUT_OF_RANGE` too; grpc-go and grpc-java:",
        "`RESOURCE_EXHAUSTED`): switch on ErrorInfo's reason, never on the status code alone.",
        "",
        "| code | name | gRPC status | retriable | what a client does |",
        "|---|---|---|---|---|",
    ]
    for code in sorted(set(ErrorCode) - {ErrorCode.NONE}, key=int):
        retriable = "yes" if is_retriable(code) else "no"
        status = f"{GRPC_STATUS_OF[code].name} ({int(GRPC_STATUS_OF[code])})"
        lines.append(
            f"| {int(code)} | `{code.name}` | {status} | {retriable} | {CLIENT_ACTION[code]} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
