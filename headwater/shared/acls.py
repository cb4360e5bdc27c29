"""Access control lists: what an ACL is, how one is checked, and the decision rule (pure).

An ACL binds a **resource pattern** to an **entry**, as Kafka's do:

- resource type: ``topic``, ``group`` or ``cluster`` (the cluster's one resource is named
  ``headwater-cluster``);
- pattern: ``literal`` (the name itself, or ``*`` for every name) or ``prefixed`` (every
  name that starts with it);
- principal: ``User:<name>``, or ``User:*`` for every principal;
- host: the client's IP address (kept in canonical form, ``normalize_host``), or ``*``
  for any;
- operation: ``read``, ``write``, ``create``, ``delete``, ``alter``, ``describe`` or
  ``all``;
- permission: ``allow`` or ``deny``.

**The decision** (``AclIndex.allows``), for a principal at a host asking to perform an
operation on a named resource:

1. a matching ``deny`` ACL denies, whatever else matches;
2. otherwise a matching ``allow`` ACL allows;
3. otherwise it is denied (deny by default, once authorization is on).

An ACL matches when its resource type is the resource's, its pattern covers the name,
its principal is the caller's or ``User:*``, its host is the caller's or ``*``, and its
operation is the one asked or ``all``. As in Kafka, ``describe`` is also allowed by an
``allow`` of ``read``, ``write``, ``delete`` or ``alter`` on the same resource (whoever may
read a topic may see it); a ``deny`` of those does not deny ``describe``.

**Limits**, checked by ``check_acl`` before an ACL is stored: a principal of at most
``PRINCIPAL_CHARS_MAX`` characters in the form ``User:<name>``, a resource name of at
most ``RESOURCE_NAME_CHARS_MAX``, a host of at most ``HOST_CHARS_MAX``, and at most
``ACLS_MAX`` ACLs in a cluster.

``AclIndex`` answers in time independent of how many ACLs name other resources: ACLs are
grouped by resource type and literal name, and prefixed ones are kept per prefix, looked
up by the name's own prefixes (one dict lookup per prefix length that exists).
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, TypeVar

from headwater.shared.errors import ErrorCode, HeadwaterError

CLUSTER_RESOURCE: Final = "headwater-cluster"
WILDCARD: Final = "*"
ANY_PRINCIPAL: Final = "User:*"
PRINCIPAL_CHARS_MAX: Final = 256
RESOURCE_NAME_CHARS_MAX: Final = 255
HOST_CHARS_MAX: Final = 64
ACLS_MAX: Final = 100_000


class ResourceType(enum.StrEnum):
    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"


class PatternType(enum.StrEnum):
    LITERAL = "literal"
    PREFIXED = "prefixed"


class Operation(enum.StrEnum):
    READ = "read"
    WRITE = "write"
    CREATE = "create"
    DELETE = "delete"
    ALTER = "alter"
    DESCRIBE = "describe"
    ALL = "all"


class Permission(enum.StrEnum):
    ALLOW = "allow"
    DENY = "deny"


IMPLIES_DESCRIBE: Final = frozenset(
    {Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER, Operation.ALL}
)


@dataclass(frozen=True, slots=True, order=True)
class Acl:
    """One ACL (see the module docstring); ``check_acl`` validates it."""

    resource_type: ResourceType
    pattern_type: PatternType
    resource_name: str
    principal: str
    host: str
    operation: Operation
    permission: Permission


def _invalid(message: str) -> HeadwaterError:
    return HeadwaterError(ErrorCode.INVALID_REQUEST, message)


def check_principal(principal: str) -> str:
    """``principal`` if it is ``User:<name>`` within the limits; INVALID_REQUEST naming
    the problem otherwise."""
    kind, _, name = principal.partition(":")
    if kind != "User" or not name or len(principal) > PRINCIPAL_CHARS_MAX:
        raise _invalid(
            f"principal {principal[:80]!r} must be User:<name> (or User:*), at most "
            f"{PRINCIPAL_CHARS_MAX} characters"
        )
    if any(ord(c) < 32 for c in principal):
        raise _invalid("a principal may not hold control characters")
    return principal


def check_acl(acl: Acl) -> Acl:
    """``acl`` if it is well formed; INVALID_REQUEST naming the problem otherwise."""
    check_principal(acl.principal)
    name = acl.resource_name
    if not 1 <= len(name) <= RESOURCE_NAME_CHARS_MAX or any(ord(c) < 32 for c in name):
        raise _invalid(
            f"resource name {name[:80]!r}: 1..{RESOURCE_NAME_CHARS_MAX} characters, no "
            "control characters"
        )
    if acl.resource_type is ResourceType.CLUSTER and name != CLUSTER_RESOURCE:
        raise _invalid(f"the cluster resource is named {CLUSTER_RESOURCE!r}, not {name!r}")
    if acl.pattern_type is PatternType.PREFIXED and name == WILDCARD:
        raise _invalid("a prefixed pattern of '*' means nothing; use literal '*' for every name")
    host = normalize_host(acl.host)
    return acl if host == acl.host else dataclasses.replace(acl, host=host)


def normalize_host(host: str) -> str:
    """``*``, or the IP address ``host`` in its one canonical text (IPv6 compressed and in
    lower case, an IPv4-mapped IPv6 address as IPv4), which is how a node names a
    caller's host; INVALID_REQUEST for anything else."""
    if host == WILDCARD:
        return host
    try:
        address = ipaddress.ip_address(host[:HOST_CHARS_MAX].strip("[]"))
    except ValueError:
        raise _invalid(
            f"host {host[:80]!r}: an IP address (such as 10.0.0.5 or 2001:db8::1) or '*'"
        ) from None
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


_E = TypeVar("_E", bound=enum.StrEnum)


def _choose(kind: type[_E], text: str, what: str) -> _E:
    """The member of ``kind`` named ``text`` (any case); INVALID_REQUEST listing the valid
    names otherwise."""
    lowered = text.strip().lower()
    for member in kind:
        if member.value == lowered:
            return member
    valid = ", ".join(member.value for member in kind)
    raise _invalid(f"{what} {text[:80]!r}; valid: {valid}")


def parse_acl(
    resource_type: str,
    resource_name: str,
    principal: str,
    operation: str,
    permission: str = "allow",
    pattern_type: str = "literal",
    host: str = WILDCARD,
) -> Acl:
    """An ``Acl`` from text (the CLI's and the API's), checked; INVALID_REQUEST listing
    the valid values of a field that has none of them."""
    return check_acl(
        Acl(
            _choose(ResourceType, resource_type, "resource type"),
            _choose(PatternType, pattern_type, "pattern type"),
            resource_name,
            principal,
            host,
            _choose(Operation, operation, "operation"),
            _choose(Permission, permission, "permission"),
        )
    )


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Which ACLs to list or remove: each field that is not None must equal the ACL's
    (no pattern matching: ``resource_name`` "orders" matches the ACLs stored for
    "orders", not a prefixed ACL that covers it)."""

    resource_type: ResourceType | None = None
    pattern_type: PatternType | None = None
    resource_name: str | None = None
    principal: str | None = None
    host: str | None = None
    operation: Operation | None = None
    permission: Permission | None = None

    def matches(self, acl: Acl) -> bool:
        return (
            (self.resource_type is None or self.resource_type is acl.resource_type)
            and (self.pattern_type is None or self.pattern_type is acl.pattern_type)
            and (self.resource_name is None or self.resource_name == acl.resource_name)
            and (self.principal is None or self.principal == acl.principal)
            and (self.host is None or self.host == acl.host)
            and (self.operation is None or self.operation is acl.operation)
            and (self.permission is None or self.permission is acl.permission)
        )


def parse_filter(
    resource_type: str = "",
    resource_name: str = "",
    principal: str = "",
    operation: str = "",
    permission: str = "",
    pattern_type: str = "",
    host: str = "",
) -> AclFilter:
    """An ``AclFilter`` from text, an empty field matching any value; INVALID_REQUEST for a
    value no ACL can have."""
    if principal:
        check_principal(principal)
    if len(resource_name) > RESOURCE_NAME_CHARS_MAX:
        raise _invalid(f"resource name filter longer than {RESOURCE_NAME_CHARS_MAX} characters")
    host = normalize_host(host) if host else host
    return AclFilter(
        _choose(ResourceType, resource_type, "resource type") if resource_type else None,
        _choose(PatternType, pattern_type, "pattern type") if pattern_type else None,
        resource_name or None,
        principal or None,
        host or None,
        _choose(Operation, operation, "operation") if operation else None,
        _choose(Permission, permission, "permission") if permission else None,
    )


_Key = tuple[ResourceType, str]


class AclIndex:
    """The ACLs of a cluster, arranged for ``allows`` (see the module docstring)."""

    def __init__(self, acls: Iterable[Acl] = ()) -> None:
        self.acls: frozenset[Acl] = frozenset(acls)
        self._literal: dict[_Key, list[Acl]] = {}
        self._prefixed: dict[_Key, list[Acl]] = {}
        self._prefix_lengths: dict[ResourceType, list[int]] = {}
        for acl in self.acls:
            key = (acl.resource_type, acl.resource_name)
            if acl.pattern_type is PatternType.LITERAL:
                self._literal.setdefault(key, []).append(acl)
            else:
                self._prefixed.setdefault(key, []).append(acl)
        lengths: dict[ResourceType, set[int]] = {}
        for resource_type, name in self._prefixed:
            lengths.setdefault(resource_type, set()).add(len(name))
        self._prefix_lengths = {t: sorted(found) for t, found in lengths.items()}

    def __len__(self) -> int:
        return len(self.acls)

    def matching(self, resource_type: ResourceType, name: str) -> Iterable[Acl]:
        """Every ACL whose resource pattern covers ``name``."""
        yield from self._literal.get((resource_type, name), ())
        if name != WILDCARD:
            yield from self._literal.get((resource_type, WILDCARD), ())
        for length in self._prefix_lengths.get(resource_type, ()):
            if length > len(name):
                break
            yield from self._prefixed.get((resource_type, name[:length]), ())

    def allows(
        self,
        principal: str,
        host: str,
        operation: Operation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        """The decision for one request (see the module docstring)."""
        allowed = False
        for acl in self.matching(resource_type, name):
            if acl.principal not in (principal, ANY_PRINCIPAL):
                continue
            if acl.host not in (host, WILDCARD):
                continue
            exact = acl.operation is operation or acl.operation is Operation.ALL
            if acl.permission is Permission.DENY:
                if exact:
                    return False
            elif exact or (operation is Operation.DESCRIBE and acl.operation in IMPLIES_DESCRIBE):
                allowed = True
        return allowed
