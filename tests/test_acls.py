"""The ACL decision rule (headwater.shared.acls), pure: fixed cases for each clause of the rule,
and seeded random ACL sets checked against a brute-force reading of the module
docstring's rule."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.shared.acls import (
    ANY_PRINCIPAL,
    CLUSTER_RESOURCE,
    IMPLIES_DESCRIBE,
    WILDCARD,
    Acl,
    AclIndex,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    parse_acl,
)
from headwater.shared.errors import ErrorCode, HeadwaterError

TOPIC = ResourceType.TOPIC


def acl(
    name: str,
    principal: str = "User:alice",
    operation: Operation = Operation.READ,
    permission: Permission = Permission.ALLOW,
    pattern: PatternType = PatternType.LITERAL,
    host: str = WILDCARD,
    resource_type: ResourceType = TOPIC,
) -> Acl:
    return Acl(resource_type, pattern, name, principal, host, operation, permission)


def test_each_clause_of_the_rule() -> None:
    index = AclIndex(
        [
            acl("orders"),
            acl("orders", "User:bob", Operation.ALL),
            acl("orders", "User:bob", Operation.WRITE, Permission.DENY),
            acl("logs-", "User:carol", Operation.WRITE, pattern=PatternType.PREFIXED),
            acl(WILDCARD, ANY_PRINCIPAL, Operation.DESCRIBE, host="10.0.0.9"),
            acl("secret", "User:alice", Operation.READ, Permission.DENY),
            acl(
                CLUSTER_RESOURCE, "User:admin", Operation.ALTER, resource_type=ResourceType.CLUSTER
            ),
        ]
    )
    allows = index.allows
    assert allows("User:alice", "10.0.0.1", Operation.READ, TOPIC, "orders")
    assert not allows("User:alice", "10.0.0.1", Operation.WRITE, TOPIC, "orders")  # default deny
    assert allows("User:alice", "10.0.0.1", Operation.DESCRIBE, TOPIC, "orders")  # read implies
    assert allows("User:bob", "10.0.0.1", Operation.READ, TOPIC, "orders")  # all
    assert not allows("User:bob", "10.0.0.1", Operation.WRITE, TOPIC, "orders")  # deny wins
    assert allows("User:carol", "10.0.0.1", Operation.WRITE, TOPIC, "logs-app")  # prefixed
    assert not allows("User:carol", "10.0.0.1", Operation.WRITE, TOPIC, "log")
    assert allows("User:zed", "10.0.0.9", Operation.DESCRIBE, TOPIC, "anything")  # wildcards
    assert not allows("User:zed", "10.0.0.8", Operation.DESCRIBE, TOPIC, "anything")  # host
    assert not allows("User:alice", "10.0.0.1", Operation.READ, TOPIC, "secret")
    assert not allows("User:alice", "10.0.0.9", Operation.READ, TOPIC, "secret")
    # a deny of read does not deny describe (a wildcard allow of describe still applies)
    assert allows("User:alice", "10.0.0.9", Operation.DESCRIBE, TOPIC, "secret")
    assert allows("User:admin", "h", Operation.ALTER, ResourceType.CLUSTER, CLUSTER_RESOURCE)
    assert not allows("User:admin", "h", Operation.ALTER, ResourceType.GROUP, CLUSTER_RESOURCE)
    assert not AclIndex().allows("User:alice", "h", Operation.READ, TOPIC, "orders")


def test_bad_acls_are_refused_with_the_valid_values() -> None:
    assert parse_acl("TOPIC", "orders", "User:alice", "Read").operation is Operation.READ
    for args, problem in (
        (("queue", "orders", "User:alice", "read"), "valid: topic, group, cluster"),
        (("topic", "orders", "alice", "read"), "must be User:<name>"),
        (("topic", "orders", "User:alice", "consume"), "valid: read, write, create"),
        (("topic", "orders", "User:alice", "read", "maybe"), "valid: allow, deny"),
        (("topic", "", "User:alice", "read"), "resource name"),
        (("topic", "x" * 256, "User:alice", "read"), "1..255 characters"),
        (("cluster", "other", "User:alice", "alter"), "is named 'headwater-cluster'"),
        (("topic", "*", "User:alice", "read", "allow", "prefixed"), "means nothing"),
        (("topic", "t", "User:alice", "read", "allow", "literal", "a b"), "host"),
        (("topic", "t", "User:" + "a" * 300, "read"), "at most 256"),
        (("topic", "t\n", "User:alice", "read"), "control characters"),
    ):
        with pytest.raises(HeadwaterError, match=problem) as raised:
            parse_acl(*args)
        assert raised.value.code == ErrorCode.INVALID_REQUEST


def _reference(acls: list[Acl], principal: str, host: str, op: Operation, name: str) -> bool:
    """The module docstring's rule, read literally, over every ACL."""

    def covers(a: Acl) -> bool:
        if a.resource_type is not TOPIC:
            return False
        if a.pattern_type is PatternType.PREFIXED:
            return name.startswith(a.resource_name)
        return a.resource_name in (name, WILDCARD)

    matching = [
        a
        for a in acls
        if covers(a) and a.principal in (principal, ANY_PRINCIPAL) and a.host in (host, WILDCARD)
    ]
    if any(
        a.permission is Permission.DENY and a.operation in (op, Operation.ALL) for a in matching
    ):
        return False
    return any(
        a.permission is Permission.ALLOW
        and (
            a.operation in (op, Operation.ALL)
            or (op is Operation.DESCRIBE and a.operation in IMPLIES_DESCRIBE)
        )
        for a in matching
    )


NAMES = ["a", "ab", "abc", "b", "ba", WILDCARD]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_the_index_decides_as_the_rule_reads(seed: int) -> None:
    rng = random.Random(seed)
    acls = [
        acl(
            rng.choice(NAMES[:-1]) if (prefixed := rng.random() < 0.3) else rng.choice(NAMES),
            rng.choice(["User:u1", "User:u2", ANY_PRINCIPAL]),
            rng.choice(list(Operation)),
            rng.choice(list(Permission)),
            PatternType.PREFIXED if prefixed else PatternType.LITERAL,
            rng.choice(["h1", "h2", WILDCARD]),
            rng.choice([TOPIC, TOPIC, ResourceType.GROUP]),
        )
        for _ in range(rng.randrange(0, 12))
    ]
    index = AclIndex(acls)
    for principal in ("User:u1", "User:u2", "User:u3"):
        for host in ("h1", "h2"):
            for op in Operation:
                if op is Operation.ALL:
                    continue
                for name in NAMES[:-1]:
                    assert index.allows(principal, host, op, TOPIC, name) == _reference(
                        acls, principal, host, op, name
                    ), (acls, principal, host, op, name)
