"""ACLs and ACL filters as ``headwater.v1.AclBinding`` messages, both ways: the one
conversion the Admin client and the node's Admin service share.

In a filter an empty field matches any value; in an ACL an empty ``permission``,
``pattern_type`` or ``host`` means ``allow``, ``literal`` and ``*``.
"""

from __future__ import annotations

from headwater.shared.acls import Acl, AclFilter, parse_acl, parse_filter
from headwater.v1 import headwater_pb2 as pb


def acl_binding(acl: Acl) -> pb.AclBinding:
    return pb.AclBinding(
        resource_type=acl.resource_type.value,
        pattern_type=acl.pattern_type.value,
        resource_name=acl.resource_name,
        principal=acl.principal,
        host=acl.host,
        operation=acl.operation.value,
        permission=acl.permission.value,
    )


def acl_of(binding: pb.AclBinding) -> Acl:
    """The ACL a binding states, checked (INVALID_REQUEST naming a bad field)."""
    return parse_acl(
        binding.resource_type,
        binding.resource_name,
        binding.principal,
        binding.operation,
        binding.permission or "allow",
        binding.pattern_type or "literal",
        binding.host or "*",
    )


def filter_binding(acl_filter: AclFilter | None) -> pb.AclBinding:
    if acl_filter is None:
        return pb.AclBinding()
    return pb.AclBinding(
        resource_type=acl_filter.resource_type.value if acl_filter.resource_type else "",
        pattern_type=acl_filter.pattern_type.value if acl_filter.pattern_type else "",
        resource_name=acl_filter.resource_name or "",
        principal=acl_filter.principal or "",
        host=acl_filter.host or "",
        operation=acl_filter.operation.value if acl_filter.operation else "",
        permission=acl_filter.permission.value if acl_filter.permission else "",
    )


def filter_of(binding: pb.AclBinding) -> AclFilter:
    return parse_filter(
        binding.resource_type,
        binding.resource_name,
        binding.principal,
        binding.operation,
        binding.permission,
        binding.pattern_type,
        binding.host,
    )
