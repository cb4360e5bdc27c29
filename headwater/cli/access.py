"""``headwater acls``, ``headwater users`` and ``headwater quotas``: ACLs, user credentials
and quotas, kept in the metadata quorum (docs/security.md).

    headwater acls add --principal User:alice --operation read --topic orders
    headwater acls add --principal User:etl --operation write --topic logs- --prefixed
    headwater acls list [--principal User:alice] [--topic orders] [--json]
    headwater acls remove --principal User:alice [--json]
    headwater users add alice              (asks for the password twice)
    headwater users add alice --password-stdin < secret.txt
    headwater users list [--json]
    headwater users delete alice
    headwater quotas set --user alice --producer-byte-rate 1048576
    headwater quotas set --default-user --consumer-byte-rate 10485760
    headwater quotas list [--json]
    headwater quotas remove --user alice [--key producer_byte_rate]
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from headwater.cli.options import bootstrap_option, json_and_bootstrap_options, option_stack
from headwater.cli.output import Table, echo, fail, print_table
from headwater.client import Admin
from headwater.shared.acls import CLUSTER_RESOURCE, Acl, parse_acl, parse_filter
from headwater.shared.credentials import ITERATIONS_DEFAULT, ITERATIONS_MAX, ITERATIONS_MIN
from headwater.shared.quotas import (
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    DEFAULT_NAME,
    KEYS,
    PRODUCER_BYTE_RATE,
    REQUEST_RATE,
    USER,
)

OPERATIONS = ("read", "write", "create", "delete", "alter", "describe", "all")


_resource_options = option_stack(
    click.option("--topic", metavar="NAME", help="A topic ('*': every topic)."),
    click.option("--group", metavar="NAME", help="A consumer group ('*': every group)."),
    click.option("--cluster", is_flag=True, help=f"The cluster ({CLUSTER_RESOURCE})."),
    click.option("--prefixed", is_flag=True, help="The name is a prefix: every name it starts."),
)


def _resource(topic: str | None, group: str | None, cluster: bool) -> tuple[str, str] | None:
    chosen = [
        (kind, name)
        for kind, name in (
            ("topic", topic),
            ("group", group),
            ("cluster", CLUSTER_RESOURCE if cluster else None),
        )
        if name is not None
    ]
    if len(chosen) > 1:
        fail("name one resource: --topic, --group or --cluster", status=2)
    return chosen[0] if chosen else None


def acl_json(acl: Acl) -> dict[str, str]:
    return {
        "resource_type": acl.resource_type.value,
        "pattern_type": acl.pattern_type.value,
        "resource_name": acl.resource_name,
        "principal": acl.principal,
        "host": acl.host,
        "operation": acl.operation.value,
        "permission": acl.permission.value,
    }


def _print_acls(acls: list[Acl], as_json: bool) -> None:
    rows = [acl_json(acl) for acl in acls]
    if as_json:
        print(json.dumps(rows))
        return
    table = Table("principal", "host", "permission", "operation", "resource", "pattern")
    for row in rows:
        table.add_row(
            row["principal"],
            row["host"],
            row["permission"],
            row["operation"],
            f"{row['resource_type']}:{row['resource_name']}",
            row["pattern_type"],
        )
    print_table(table)


@click.group()
def acls() -> None:
    """Access control lists: who may do what to which topic, group or the cluster."""


@acls.command("add")
@click.option("--principal", required=True, metavar="User:NAME", help="User:<name> or User:*.")
@click.option(
    "--operation",
    "operations",
    multiple=True,
    required=True,
    type=click.Choice(OPERATIONS, case_sensitive=False),
    help="Allowed (or denied) operation; repeat for several.",
)
@click.option("--host", default="*", show_default=True, help="Client IP address, or * for any.")
@click.option("--deny", is_flag=True, help="A deny ACL (deny wins over any allow).")
@_resource_options
@json_and_bootstrap_options
def acls_add(
    principal: str,
    operations: tuple[str, ...],
    host: str,
    deny: bool,
    topic: str | None,
    group: str | None,
    cluster: bool,
    prefixed: bool,
    as_json: bool,
    bootstrap: str | None,
) -> None:
    """Add ACLs: PRINCIPAL may (or, with --deny, may not) perform each OPERATION on the
    resource."""
    resource = _resource(topic, group, cluster)
    if resource is None:
        fail("name the resource: --topic NAME, --group NAME or --cluster", status=2)
    made = [
        parse_acl(
            resource[0],
            resource[1],
            principal,
            operation,
            "deny" if deny else "allow",
            "prefixed" if prefixed else "literal",
            host,
        )
        for operation in operations
    ]
    with Admin(bootstrap) as admin:
        admin.create_acls(made)
    if as_json:
        print(json.dumps([acl_json(acl) for acl in made]))
    else:
        echo(f"added {len(made)} ACL(s)")


def _filter_from(
    principal: str | None,
    operation: str | None,
    topic: str | None,
    group: str | None,
    cluster: bool,
    prefixed: bool,
) -> Any:
    resource = _resource(topic, group, cluster)
    return parse_filter(
        resource[0] if resource else "",
        resource[1] if resource else "",
        principal or "",
        operation or "",
        "",
        "prefixed" if prefixed else ("literal" if resource else ""),
        "",
    )


_filter_options = option_stack(
    click.option("--principal", metavar="User:NAME", help="Only this principal's."),
    click.option(
        "--operation", type=click.Choice(OPERATIONS, case_sensitive=False), help="Only this one."
    ),
    _resource_options,
)


@acls.command("list")
@_filter_options
@json_and_bootstrap_options
def acls_list(
    principal: str | None,
    operation: str | None,
    topic: str | None,
    group: str | None,
    cluster: bool,
    prefixed: bool,
    as_json: bool,
    bootstrap: str | None,
) -> None:
    """List the ACLs, or those matching the options (exact values: --topic orders lists
    the ACLs stored for "orders", not prefixed ones that cover it)."""
    wanted = _filter_from(principal, operation, topic, group, cluster, prefixed)
    with Admin(bootstrap) as admin:
        found = admin.describe_acls(wanted)
    _print_acls(found, as_json)


@acls.command("remove")
@_filter_options
@click.option("--all", "remove_all", is_flag=True, help="Remove every ACL of the cluster.")
@json_and_bootstrap_options
def acls_remove(
    principal: str | None,
    operation: str | None,
    topic: str | None,
    group: str | None,
    cluster: bool,
    prefixed: bool,
    remove_all: bool,
    as_json: bool,
    bootstrap: str | None,
) -> None:
    """Remove the ACLs matching the options; prints those removed."""
    if not (remove_all or principal or operation or topic or group or cluster):
        fail("name what to remove (--principal, --topic, ...), or --all for every ACL", 2)
    wanted = _filter_from(principal, operation, topic, group, cluster, prefixed)
    with Admin(bootstrap) as admin:
        removed = admin.delete_acls([wanted])
    if as_json:
        print(json.dumps([acl_json(acl) for acl in removed]))
    else:
        _print_acls(removed, False)
        echo(f"removed {len(removed)} ACL(s)")


@click.group()
def users() -> None:
    """Users that authenticate with a password (SCRAM-SHA-256 salted credentials)."""


@users.command("add")
@click.argument("name")
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin (first line).")
@click.option(
    "--iterations",
    type=click.IntRange(ITERATIONS_MIN, ITERATIONS_MAX),
    default=ITERATIONS_DEFAULT,
    show_default=True,
    help="PBKDF2 iterations of the salted credential.",
)
@bootstrap_option
def users_add(name: str, password_stdin: bool, iterations: int, bootstrap: str | None) -> None:
    """Create user NAME, or set a new password for it. The password is salted and hashed
    here; only the salted form is sent."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("password", hide_input=True, confirmation_prompt=True)
    if not password:
        fail("the password is empty")
    with Admin(bootstrap) as admin:
        admin.upsert_user(name, password, iterations)
    echo(f"user {name} set")


@users.command("list")
@json_and_bootstrap_options
def users_list(as_json: bool, bootstrap: str | None) -> None:
    """List users (names, mechanism and iterations; never a key)."""
    with Admin(bootstrap) as admin:
        found = admin.list_users()
    rows: list[dict[str, Any]] = [
        {"name": u.name, "mechanism": u.mechanism, "iterations": u.iterations} for u in found
    ]
    if as_json:
        print(json.dumps(rows))
        return
    table = Table("user", "mechanism", "iterations")
    for row in rows:
        table.add_row(row["name"], row["mechanism"], str(row["iterations"]))
    print_table(table)


@users.command("delete")
@click.argument("name")
@bootstrap_option
def users_delete(name: str, bootstrap: str | None) -> None:
    """Delete user NAME (its ACLs stay until removed)."""
    with Admin(bootstrap) as admin:
        admin.delete_user(name)
    echo(f"deleted user {name}")


@click.group()
def quotas() -> None:
    """Produce and fetch byte rates and request rates per user or client id."""


_entity_options = option_stack(
    click.option("--user", metavar="NAME", help="A user (the principal User:NAME)."),
    click.option("--default-user", is_flag=True, help="Every user without its own."),
    click.option("--client-id", "client_id", metavar="ID", help="A client id."),
    click.option("--default-client-id", is_flag=True, help="Every client id without its own."),
)


def _entity(
    user: str | None, default_user: bool, client_id: str | None, default_client_id: bool
) -> tuple[str, str]:
    chosen = [
        entity
        for entity, given in (
            ((USER, user or ""), user is not None),
            ((USER, DEFAULT_NAME), default_user),
            ((CLIENT_ID, client_id or ""), client_id is not None),
            ((CLIENT_ID, DEFAULT_NAME), default_client_id),
        )
        if given
    ]
    if len(chosen) != 1:
        fail(
            "name one entity: --user NAME, --default-user, --client-id ID or --default-client-id",
            status=2,
        )
    return chosen[0]


def _entity_text(entity: tuple[str, str]) -> str:
    return f"{entity[0]} {entity[1]}" if entity[1] else f"the default {entity[0]}"


@quotas.command("set")
@_entity_options
@click.option("--producer-byte-rate", type=float, help="Produced bytes a second, per node.")
@click.option("--consumer-byte-rate", type=float, help="Fetched bytes a second, per node.")
@click.option("--request-rate", type=float, help="Requests a second, per node.")
@bootstrap_option
def quotas_set(
    user: str | None,
    default_user: bool,
    client_id: str | None,
    default_client_id: bool,
    producer_byte_rate: float | None,
    consumer_byte_rate: float | None,
    request_rate: float | None,
    bootstrap: str | None,
) -> None:
    """Set quotas of one user or client id (or a default). Over a quota, a node holds
    its answers back (throttle_time_ms); it never drops data."""
    entity = _entity(user, default_user, client_id, default_client_id)
    rates = {
        key: value
        for key, value in (
            (PRODUCER_BYTE_RATE, producer_byte_rate),
            (CONSUMER_BYTE_RATE, consumer_byte_rate),
            (REQUEST_RATE, request_rate),
        )
        if value is not None
    }
    if not rates:
        fail("give a rate: --producer-byte-rate, --consumer-byte-rate or --request-rate", 2)
    with Admin(bootstrap) as admin:
        admin.alter_quotas(entity[0], entity[1], rates)
    echo(f"set {', '.join(rates)} of {_entity_text(entity)}")


@quotas.command("remove")
@_entity_options
@click.option(
    "--key",
    "keys",
    multiple=True,
    type=click.Choice(KEYS),
    help="Only this quota (repeat for several); all of the entity's by default.",
)
@bootstrap_option
def quotas_remove(
    user: str | None,
    default_user: bool,
    client_id: str | None,
    default_client_id: bool,
    keys: tuple[str, ...],
    bootstrap: str | None,
) -> None:
    """Remove quotas of one user or client id (or a default)."""
    entity = _entity(user, default_user, client_id, default_client_id)
    with Admin(bootstrap) as admin:
        admin.alter_quotas(entity[0], entity[1], remove=keys or KEYS)
    echo(f"removed {', '.join(keys or KEYS)} of {_entity_text(entity)}")


@quotas.command("list")
@json_and_bootstrap_options
def quotas_list(as_json: bool, bootstrap: str | None) -> None:
    """List every quota (an empty name: the type's default)."""
    with Admin(bootstrap) as admin:
        found = admin.describe_quotas()
    rows: list[dict[str, Any]] = [
        {"entity_type": t, "entity_name": n, "key": k, "value": v} for t, n, k, v in found
    ]
    if as_json:
        print(json.dumps(rows))
        return
    table = Table("entity", "quota", "rate")
    for row in rows:
        table.add_row(
            _entity_text((row["entity_type"], row["entity_name"])),
            row["key"],
            f"{row['value']:g}",
        )
    print_table(table)
