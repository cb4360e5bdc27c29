"""The one error model of Headwater: stable codes, a retriable flag, one exception type.

Codes reuse Apache Kafka's names and numbers where Kafka has them, so that operators and
client authors can carry their knowledge over. The mapping from a code to a gRPC status
code lives here and nowhere else (``GRPC_STATUS_OF``; docs/errors.md is generated from it
by ``headwater.tools.error_table``); the server attaches the code and the retriable flag as a
``google.rpc.ErrorInfo`` detail (reason = the code's name, metadata
``code`` and ``retriable``), which clients in any language can read from the standard
``grpc-status-details-bin`` trailer.

This module is pure: no I/O.
"""

from __future__ import annotations

import enum
from typing import Final

SHOWN_INPUT_CHARS_MAX: Final = 256
"""An error quotes at most this much of one piece of client input (``shown``)."""


class ErrorCode(enum.IntEnum):
    """Operating errors that clients expect; numbers are stable and part of the API."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    BROKER_NOT_AVAILABLE = 8
    MESSAGE_TOO_LARGE = 10
    OFFSET_METADATA_TOO_LARGE = 12
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    KAFKA_STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    UNKNOWN_PRODUCER_ID = 59
    REASSIGNMENT_IN_PROGRESS = 60
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    UNSUPPORTED_COMPRESSION_TYPE = 76
    STALE_BROKER_EPOCH = 77
    OFFSET_NOT_AVAILABLE = 78
    INVALID_RECORD = 87
    GROUP_MAX_SIZE_REACHED = 81
    THROTTLING_QUOTA_EXCEEDED = 89
    PRODUCER_FENCED = 90
    FENCED_MEMBER_EPOCH = 110
    UNRELEASED_INSTANCE_ID = 111
    UNSUPPORTED_ASSIGNOR = 112
    STALE_MEMBER_EPOCH = 113
    INVALID_REGULAR_EXPRESSION = 128
    PARTITION_NOT_ASSIGNED = 1001
    TLS_HANDSHAKE_FAILED = 1002  # client-side only: never sent by a node
    FETCH_RESPONSE_TOO_LARGE = 1003
    PARTITION_OUT_OF_RANGE = 1004
    SASL_SESSION_EXPIRED = 1005


# Retriable: the same request may succeed later without change (Kafka's RetriableException).
# CORRUPT_MESSAGE deviates from Kafka (which retries it): a batch whose CRC fails on arrival
# was built or framed wrongly by the client in every case seen over gRPC/TCP, so resending
# the same bytes cannot help.
_RETRIABLE: frozenset[ErrorCode] = frozenset(
    {
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.BROKER_NOT_AVAILABLE,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.NOT_CONTROLLER,
        ErrorCode.THROTTLING_QUOTA_EXCEEDED,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.OFFSET_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.SASL_SESSION_EXPIRED,
        ErrorCode.CONCURRENT_TRANSACTIONS,
    }
)


def is_retriable(code: ErrorCode) -> bool:
    """True when the same request may succeed later without change."""
    return code in _RETRIABLE


class GrpcCode(enum.IntEnum):
    """gRPC status code numbers (grpc.StatusCode values), kept here so this module is pure."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


GRPC_STATUS_OF: dict[ErrorCode, GrpcCode] = {
    ErrorCode.UNKNOWN_SERVER_ERROR: GrpcCode.INTERNAL,
    ErrorCode.OFFSET_OUT_OF_RANGE: GrpcCode.OUT_OF_RANGE,
    ErrorCode.CORRUPT_MESSAGE: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: GrpcCode.NOT_FOUND,
    ErrorCode.INVALID_FETCH_SIZE: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.LEADER_NOT_AVAILABLE: GrpcCode.UNAVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.REQUEST_TIMED_OUT: GrpcCode.DEADLINE_EXCEEDED,
    ErrorCode.BROKER_NOT_AVAILABLE: GrpcCode.UNAVAILABLE,
    ErrorCode.MESSAGE_TOO_LARGE: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.NETWORK_EXCEPTION: GrpcCode.UNAVAILABLE,
    ErrorCode.INVALID_TOPIC_EXCEPTION: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.RECORD_LIST_TOO_LARGE: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.NOT_ENOUGH_REPLICAS: GrpcCode.UNAVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: GrpcCode.UNAVAILABLE,
    ErrorCode.INVALID_REQUIRED_ACKS: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_TIMESTAMP: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.TOPIC_AUTHORIZATION_FAILED: GrpcCode.PERMISSION_DENIED,
    ErrorCode.GROUP_AUTHORIZATION_FAILED: GrpcCode.PERMISSION_DENIED,
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED: GrpcCode.PERMISSION_DENIED,
    ErrorCode.SASL_AUTHENTICATION_FAILED: GrpcCode.UNAUTHENTICATED,
    ErrorCode.TOPIC_ALREADY_EXISTS: GrpcCode.ALREADY_EXISTS,
    ErrorCode.INVALID_PARTITIONS: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_REPLICATION_FACTOR: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_REPLICA_ASSIGNMENT: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_CONFIG: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.NOT_CONTROLLER: GrpcCode.UNAVAILABLE,
    ErrorCode.INVALID_REQUEST: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.DUPLICATE_SEQUENCE_NUMBER: GrpcCode.ALREADY_EXISTS,
    ErrorCode.INVALID_PRODUCER_EPOCH: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.INVALID_TXN_STATE: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.INVALID_PRODUCER_ID_MAPPING: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.INVALID_TRANSACTION_TIMEOUT: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.CONCURRENT_TRANSACTIONS: GrpcCode.UNAVAILABLE,
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: GrpcCode.PERMISSION_DENIED,
    ErrorCode.KAFKA_STORAGE_ERROR: GrpcCode.UNAVAILABLE,
    ErrorCode.UNKNOWN_PRODUCER_ID: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.REASSIGNMENT_IN_PROGRESS: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.FENCED_LEADER_EPOCH: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.UNKNOWN_LEADER_EPOCH: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.UNSUPPORTED_COMPRESSION_TYPE: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.STALE_BROKER_EPOCH: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.OFFSET_NOT_AVAILABLE: GrpcCode.UNAVAILABLE,
    ErrorCode.INVALID_RECORD: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.THROTTLING_QUOTA_EXCEEDED: GrpcCode.RESOURCE_EXHAUSTED,
    ErrorCode.PRODUCER_FENCED: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.OFFSET_METADATA_TOO_LARGE: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS: GrpcCode.UNAVAILABLE,
    ErrorCode.COORDINATOR_NOT_AVAILABLE: GrpcCode.UNAVAILABLE,
    ErrorCode.NOT_COORDINATOR: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.INVALID_GROUP_ID: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.UNKNOWN_MEMBER_ID: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.INVALID_SESSION_TIMEOUT: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.NON_EMPTY_GROUP: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.GROUP_ID_NOT_FOUND: GrpcCode.NOT_FOUND,
    ErrorCode.GROUP_MAX_SIZE_REACHED: GrpcCode.RESOURCE_EXHAUSTED,
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.FENCED_MEMBER_EPOCH: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.UNRELEASED_INSTANCE_ID: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.UNSUPPORTED_ASSIGNOR: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.STALE_MEMBER_EPOCH: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.INVALID_REGULAR_EXPRESSION: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.PARTITION_NOT_ASSIGNED: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.TLS_HANDSHAKE_FAILED: GrpcCode.UNAVAILABLE,
    ErrorCode.FETCH_RESPONSE_TOO_LARGE: GrpcCode.FAILED_PRECONDITION,
    ErrorCode.PARTITION_OUT_OF_RANGE: GrpcCode.INVALID_ARGUMENT,
    ErrorCode.SASL_SESSION_EXPIRED: GrpcCode.UNAUTHENTICATED,
}
assert set(GRPC_STATUS_OF) == set(ErrorCode) - {ErrorCode.NONE}

ERROR_DOMAIN = "headwater.v1"
"""The ``google.rpc.ErrorInfo.domain`` of every Headwater error detail."""


def shown(value: str) -> str:
    """``value`` quoted for an error message, cut to SHOWN_INPUT_CHARS_MAX characters with
    the full length named: errors never echo a client's input whole (an 8 KB name would
    overflow a gRPC status's metadata and hide the error behind RESOURCE_EXHAUSTED)."""
    if len(value) <= SHOWN_INPUT_CHARS_MAX:
        return repr(value)
    return f"{value[:SHOWN_INPUT_CHARS_MAX]!r}... ({len(value)} characters)"


class HeadwaterError(Exception):
    """An operating error with a stable code, raised by the broker and by clients alike.

    ``message`` says what was wrong and, where there is one, the valid range.
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"

    @property
    def retriable(self) -> bool:
        return is_retriable(self.code)
