"""The ``headwater`` command: serve a node, manage topics, produce, consume, benchmark.

Every client command takes ``--bootstrap HOST:PORT[,HOST:PORT...]`` (or the environment
variable HEADWATER_BOOTSTRAP), defaulting to the local default node. Read commands print
tables for humans and JSON with ``--json``. Errors print one line, ``error: CODE:
message``, on stderr and exit with status 1 (2 for usage errors); never a traceback.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn, TypeVar

import click

from headwater import __version__
from headwater.cli.lazy import LazyGroup
from headwater.cli.output import Table, echo, print_table
from headwater.node.config import load as load_config
from headwater.shared.errors import HeadwaterError
from headwater.shared.tls import CLIENT_ID_ENV

F = TypeVar("F", bound=Callable[..., Any])
EXTRA_OF_MODULE = {
    "pysyncobj": "server",
    "cryptography": "server",
    "grpc_reflection": "server",
    "pyspark": "spark",
}
"""Packages of the install extras (pyproject.toml): a command that needs a missing one
names the extra to install."""


def fail(message: str, status: int = 1) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(status)


class ErrorReportingGroup(LazyGroup):
    """Turns HeadwaterError (and anything unexpected) into one line on stderr. The
    ``bench`` commands are loaded only when asked for (they import pyspark). Client
    commands take the client settings after their name too (``accept_client_settings``)."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None and cmd_name not in COMMANDS_WITHOUT_CLIENT_SETTINGS:
            accept_client_settings(command)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except HeadwaterError as error:
            fail(str(error))
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except ModuleNotFoundError as missing:
            extra = EXTRA_OF_MODULE.get((missing.name or "").partition(".")[0])
            if extra is None:
                raise
            fail(
                f"this command needs the {extra} extra: pip install 'headwater[{extra}]' "
                f"(module {missing.name} is not installed)"
            )
        except KeyboardInterrupt:
            sys.exit(130)
        except BrokenPipeError:
            sys.stderr.close()
            sys.exit(0)
        except Exception as exc:
            if os.environ.get("HEADWATER_DEBUG"):
                raise
            fail(f"unexpected {type(exc).__name__}: {exc} (set HEADWATER_DEBUG=1 for details)")


def bootstrap_option(function: F) -> F:
    return click.option(
        "--bootstrap",
        envvar="HEADWATER_BOOTSTRAP",
        default=None,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="Nodes to contact first (env HEADWATER_BOOTSTRAP; default 127.0.0.1:7700).",
    )(function)


def json_option(function: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")(function)


CLIENT_SETTING_OPTIONS: Final = (
    click.Option(
        ["--security-protocol"],
        type=click.Choice(
            ["PLAINTEXT", "SSL", "SASL_SSL", "SASL_PLAINTEXT", "TLS"], case_sensitive=False
        ),
        help="How clients connect (env HEADWATER_SECURITY_PROTOCOL): PLAINTEXT, SSL (TLS), or "
        "SASL_SSL / SASL_PLAINTEXT (the same with --username).",
    ),
    click.Option(
        ["--tls-ca-file"],
        metavar="PEM",
        help="CA certificates trusted to sign the nodes' certificates (env "
        "HEADWATER_TLS_CA_FILE; implies SSL).",
    ),
    click.Option(
        ["--tls-cert-file"],
        metavar="PEM",
        help="Client certificate, for nodes that require mutual TLS (env HEADWATER_TLS_CERT_FILE).",
    ),
    click.Option(
        ["--tls-key-file"], metavar="PEM", help="Its private key (env HEADWATER_TLS_KEY_FILE)."
    ),
    click.Option(
        ["--tls-server-name"],
        metavar="NAME",
        help="Name to check the nodes' certificates against instead of the host dialled (env "
        "HEADWATER_TLS_SERVER_NAME).",
    ),
    click.Option(
        ["--username"],
        metavar="NAME",
        help="Authenticate as this user (env HEADWATER_USERNAME); the password comes from env "
        "HEADWATER_PASSWORD or the client config file.",
    ),
    click.Option(
        ["--client-id"],
        metavar="ID",
        help="Name sent with every call, which quotas by client id apply to (env "
        "HEADWATER_CLIENT_ID).",
    ),
    click.Option(
        ["--client-config"],
        type=click.Path(path_type=Path, dir_okay=False),
        envvar="HEADWATER_CLIENT_CONFIG",
        help="TOML file of client settings: bootstrap, security_protocol, tls_ca_file, "
        "tls_cert_file, tls_key_file, tls_server_name, username, password, client_id (env and "
        "flags win over it).",
    ),
)
"""The client settings the ``headwater`` group takes before a command; every client
command takes them after its name too (``accept_client_settings``), hidden from its help."""
DEFAULT_CLIENT_ID: Final = "headwater-cli"
"""The client id of the command's calls when none is set (--client-id, env, file)."""
COMMANDS_WITHOUT_CLIENT_SETTINGS: Final = frozenset({"serve", "bench", "dev-cluster"})
"""Commands that are not a client of a running cluster, or start processes that take
the client settings from the environment (which the group's options set)."""


def client_settings_options(function: F) -> F:
    """Give a command the client settings as options of its own (the group's)."""
    params = getattr(function, "__click_params__", [])
    params.extend(reversed(copy.copy(CLIENT_SETTING_OPTIONS)))
    function.__click_params__ = params  # type: ignore[attr-defined]
    return function


def accept_client_settings(command: click.Command) -> None:
    """Let ``command`` (and every command under it) take the client settings after its
    name: hidden copies of the group's options, applied over the group's settings (flags
    win) before the command's own callback runs. Done once a command."""
    if getattr(command, "_client_settings_accepted", False):
        return
    command._client_settings_accepted = True  # type: ignore[attr-defined]
    if isinstance(command, click.Group):
        for child in command.commands.values():
            accept_client_settings(child)
        return
    if command.callback is None:
        return
    # A command's own option of the same name (quotas set --client-id: the entity) wins.
    own = {opt for param in command.params for opt in param.opts}
    added = [option for option in CLIENT_SETTING_OPTIONS if not own & set(option.opts)]
    for option in added:
        hidden = copy.copy(option)
        hidden.hidden = True
        hidden.envvar = None  # the group's copy reads the environment
        command.params.append(hidden)
    names = [str(option.name) for option in added]
    callback = command.callback

    @functools.wraps(callback)
    def with_client_settings(*args: Any, **kwargs: Any) -> Any:
        from headwater.cli.security import apply_client_settings

        given = {name: kwargs.pop(name) for name in names}
        client_config = given.pop("client_config", None)
        if client_config is not None or any(given.values()):
            apply_client_settings(given, client_config)
        return callback(*args, **kwargs)

    command.callback = with_client_settings


@click.group(
    cls=ErrorReportingGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    lazy_subcommands={
        "bench": "headwater.tools.benchmarks.perf:bench",
        "acls": "headwater.cli.access:acls",
        "users": "headwater.cli.access:users",
        "quotas": "headwater.cli.access:quotas",
    },
)
@click.version_option(__version__, prog_name="headwater")
@client_settings_options
@click.option(
    "--bootstrap",
    metavar="HOST:PORT[,HOST:PORT...]",
    help="Nodes to contact first, for every command (env HEADWATER_BOOTSTRAP).",
)
@click.pass_context
def main(
    context: click.Context,
    bootstrap: str | None,
    security_protocol: str | None,
    tls_ca_file: str | None,
    tls_cert_file: str | None,
    tls_key_file: str | None,
    tls_server_name: str | None,
    username: str | None,
    client_id: str | None,
    client_config: Path | None,
) -> None:
    """Headwater: a partitioned, replicated commit-log broker with a gRPC API.

    Client settings (--bootstrap, --security-protocol, --tls-*, --username,
    --client-id, --client-config) go before the command or after it: headwater
    --tls-ca-file ca.crt topics list, or headwater topics list --tls-ca-file ca.crt."""
    from headwater.cli.security import apply_client_settings

    flags = {
        "security_protocol": security_protocol,
        "tls_ca_file": tls_ca_file,
        "tls_cert_file": tls_cert_file,
        "tls_key_file": tls_key_file,
        "tls_server_name": tls_server_name,
        "username": username,
        "client_id": client_id,
    }
    if context.invoked_subcommand == "serve":
        flags["bootstrap"] = bootstrap
        # A node reads HEADWATER_TLS_* as its own settings (serve --help, the config file).
        if any(flags.values()):
            fail(
                "client settings (--bootstrap, --security-protocol, --tls-*, --username, "
                "--client-id) do not apply to serve"
            )
        if os.environ.get("HEADWATER_SECURITY_PROTOCOL"):
            fail(
                "HEADWATER_SECURITY_PROTOCOL is set: this shell holds client settings, and a "
                "node would take HEADWATER_TLS_* as its own certificate; unset them (or start "
                "the node from a shell without them)"
            )
        return
    if bootstrap:
        os.environ["HEADWATER_BOOTSTRAP"] = bootstrap
    apply_client_settings(flags, client_config)
    if context.invoked_subcommand not in COMMANDS_WITHOUT_CLIENT_SETTINGS:
        # Named, as Kafka's console tools are, so that groups describe shows who is who.
        os.environ.setdefault(CLIENT_ID_ENV, DEFAULT_CLIENT_ID)


# ---------------------------------------------------------------------- serve


@main.command()
@click.option("--config", "config_file", type=click.Path(path_type=Path), help="TOML config file.")
@click.option("--node-id", type=int, help="This node's id (default 1).")
@click.option("--data-dir", help="Folder for the node's data (default ./data).")
@click.option(
    "--listen", metavar="HOST:PORT", help="Address to serve gRPC on (default 127.0.0.1:7700)."
)
@click.option("--advertised-address", metavar="HOST:PORT", help="Address clients are told to use.")
@click.option(
    "--internal-listen",
    metavar="HOST:PORT",
    help="Inter-broker listener: Controller and Replica services, for nodes holding the "
    "cluster secret (default: the --listen host, a port the system picks).",
)
@click.option(
    "--kafka-listen",
    metavar="HOST:PORT",
    help="Serve the Kafka wire protocol there, for Kafka clients (default: off).",
)
@click.option(
    "--kafka-advertised-address",
    metavar="HOST:PORT",
    help="Address Kafka clients are told to use (default: --kafka-listen, a wildcard host "
    "replaced by the --advertised-address host); needs a --kafka-listen with a fixed port.",
)
@click.option(
    "--quorum",
    metavar="ID@HOST:PORT,...",
    help="Raft addresses of the controller voters by node id (default: this node alone, "
    "on a port the system picks).",
)
@click.option(
    "--roles",
    type=click.Choice(["controller,broker", "broker,controller", "controller", "broker"]),
    help="controller, broker, or both (default: both).",
)
@click.option(
    "--controller-addresses",
    metavar="HOST:PORT,...",
    help="Inter-broker addresses (--internal-listen) of controller nodes: broker-only nodes "
    "follow the metadata there.",
)
@click.option("--rack", help="Rack of this node (replicas are spread across racks).")
@click.option(
    "--metrics-listen",
    metavar="HOST:PORT",
    help="Serve Prometheus metrics over HTTP there (docs/metrics.md; default: off).",
)
def serve(
    config_file: Path | None,
    node_id: int | None,
    data_dir: str | None,
    listen: str | None,
    advertised_address: str | None,
    internal_listen: str | None,
    kafka_listen: str | None,
    kafka_advertised_address: str | None,
    quorum: str | None,
    roles: str | None,
    controller_addresses: str | None,
    rack: str | None,
    metrics_listen: str | None,
) -> None:
    """Run a node (Ctrl-C or SIGTERM stops it cleanly, moving its leadership away first).

    With no flags: a single local node on 127.0.0.1:7700 with data in ./data. In a cluster,
    give every node its --node-id, --listen, --data-dir and the same --quorum, and the same
    secret with HEADWATER_CLUSTER_SECRET (or cluster_secret in the config file).
    """
    flags = {
        "node_id": node_id,
        "data_dir": data_dir,
        "listen": listen,
        "advertised_address": advertised_address,
        "internal_listen": internal_listen,
        "kafka_listen": kafka_listen,
        "kafka_advertised_address": kafka_advertised_address,
        "quorum": quorum,
        "roles": roles,
        "controller_addresses": controller_addresses,
        "rack": rack,
        "metrics_listen": metrics_listen,
    }
    config = load_config(config_file, os.environ, flags)
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    metrics_endpoint = None
    if config.metrics_listen:
        # Bound before the server's modules load (over half a second): a restarted
        # node's metrics answer as early as the process can.
        from headwater.node.metrics_endpoint import MetricsEndpoint, MetricsListenError

        try:
            metrics_endpoint = MetricsEndpoint(config.metrics_listen, config.node_id, config.roles)
        except MetricsListenError as exc:
            fail(str(exc))
    from headwater.node.log_manager import DataDirError
    from headwater.node.server import ListenError
    from headwater.node.server import serve as run_node

    try:
        run_node(config, metrics_endpoint)
    except (DataDirError, ListenError) as exc:
        fail(str(exc))


# ---------------------------------------------------------------------- topics


@main.group()
def topics() -> None:
    """Create, list, describe and delete topics."""


def _parse_configs(pairs: Sequence[str]) -> dict[str, str]:
    configs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--config")
        configs[key.strip()] = value.strip()
    return configs


@topics.command("create")
@click.argument("name")
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=None,
    help="Number of partitions, at least 1 (default: the node's default_partitions).",
)
@click.option(
    "--replication-factor",
    type=click.IntRange(min=1),
    default=None,
    help="Replicas per partition, at least 1 (default: the node's).",
)
@click.option(
    "--config",
    "configs",
    multiple=True,
    metavar="KEY=VALUE",
    help="Topic config override (repeatable).",
)
@bootstrap_option
def topics_create(
    name: str,
    partitions: int | None,
    replication_factor: int | None,
    configs: tuple[str, ...],
    bootstrap: str | None,
) -> None:
    """Create topic NAME."""
    from headwater.client import Admin

    with Admin(bootstrap) as admin:
        topic_id = admin.create_topic(name, partitions, replication_factor, _parse_configs(configs))
    echo(f"created topic {name} (id {topic_id})")


@topics.command("list")
@click.option("--internal", is_flag=True, help="Include internal topics.")
@json_option
@bootstrap_option
def topics_list(internal: bool, as_json: bool, bootstrap: str | None) -> None:
    """List topics."""
    from headwater.client import Admin

    with Admin(bootstrap) as admin:
        listed = admin.list_topics(include_internal=internal)
    rows: list[dict[str, Any]] = [
        {
            "name": t.name,
            "topic_id": t.topic_id,
            "partitions": t.partitions,
            "replication_factor": t.replication_factor,
        }
        for t in listed
    ]
    if as_json:
        print(json.dumps(rows))
        return
    table = Table("topic", "partitions", "replication", "id")
    for row in rows:
        table.add_row(
            row["name"], str(row["partitions"]), str(row["replication_factor"]), row["topic_id"]
        )
    print_table(table)


def describe_json(description: Any) -> dict[str, Any]:
    return {
        "name": description.name,
        "topic_id": description.topic_id,
        "configs": dict(sorted(description.configs.items())),
        "config_overrides": list(description.config_overrides),
        "partitions": [
            {
                "partition": p.partition,
                "leader": p.leader,
                "replicas": list(p.replicas),
                "isr": list(p.isr),
                "leader_epoch": p.leader_epoch,
                "partition_epoch": p.partition_epoch,
                "adding_replicas": list(p.adding_replicas),
                "removing_replicas": list(p.removing_replicas),
                "log_start_offset": p.log_start_offset,
                "log_end_offset": p.log_end_offset,
                "high_watermark": p.high_watermark,
                "size_bytes": p.size_bytes,
                "segment_count": p.segment_count,
                "followers": [
                    {
                        "node_id": f.node_id,
                        "log_end_offset": f.log_end_offset,
                        "lag_records": f.lag_records,
                        "caught_up_ms_ago": f.caught_up_ms_ago,
                    }
                    for f in p.followers
                ],
                "damaged_replicas": [
                    {"node_id": d.node_id, "damage": d.damage} for d in p.damaged_replicas
                ],
                "cleanable_ratio": round(p.cleanable_ratio, 4),
                "cleaned_offset": p.cleaned_offset,
                "producers": [
                    {
                        "producer_id": q.producer_id,
                        "producer_epoch": q.producer_epoch,
                        "next_sequence": q.next_sequence,
                        "last_offset": q.last_offset,
                        "last_timestamp_ms": q.last_timestamp_ms,
                    }
                    for q in p.producers
                ],
            }
            for p in description.partitions
        ],
    }


@topics.command("describe")
@click.argument("name")
@click.option(
    "--all-configs", is_flag=True, help="List every config with its source, defaults included."
)
@json_option
@bootstrap_option
def topics_describe(name: str, all_configs: bool, as_json: bool, bootstrap: str | None) -> None:
    """Show NAME's partitions (leader, replicas, ISR, offsets, size, a compacted topic's
    dirty ratio, replicas a node set aside damage from) and the configs set on it (as
    kafka-configs --describe does; --all-configs adds the defaults); --json adds every
    config, each follower's lag, the idempotent producers tracked and the cleaned offset."""
    from headwater.client import Admin

    with Admin(bootstrap) as admin:
        (description,) = admin.describe_topics([name])
    data = describe_json(description)
    if as_json:
        print(json.dumps(data))
        return
    echo(f"topic {data['name']}  id {data['topic_id']}")
    table = Table(
        "partition",
        "leader",
        "replicas",
        "isr",
        "epoch",
        "start",
        "end",
        "high watermark",
        "bytes",
        "segments",
    )
    compacted = any(p["cleanable_ratio"] >= 0 for p in data["partitions"])
    if compacted:
        table.add_column("dirty")
    damaged = any(p["damaged_replicas"] for p in data["partitions"])
    if damaged:
        table.add_column("damaged")
    for p in data["partitions"]:
        table.add_row(
            p["partition"],
            p["leader"],
            ",".join(map(str, p["replicas"])),
            ",".join(map(str, p["isr"])),
            p["leader_epoch"],
            p["log_start_offset"],
            p["log_end_offset"],
            p["high_watermark"],
            p["size_bytes"],
            p["segment_count"],
            *([f"{max(p['cleanable_ratio'], 0):.2f}"] if compacted else []),
            *([",".join(str(d["node_id"]) for d in p["damaged_replicas"])] if damaged else []),
        )
    print_table(table)
    for p in data["partitions"]:
        for d in p["damaged_replicas"]:
            echo(f"partition {p['partition']}, node {d['node_id']}: {d['damage']}")
    echo("")
    overrides = set(data["config_overrides"])
    shown = {k: v for k, v in data["configs"].items() if all_configs or k in overrides}
    if not shown:
        echo("configs: the node's defaults (--all-configs lists them)")
        return
    configs = Table("config", "value", *(["source"] if all_configs else []))
    for key, value in shown.items():
        source = ["override" if key in overrides else "default"] if all_configs else []
        configs.add_row(key, value, *source)
    print_table(configs)


@topics.command("delete")
@click.argument("name")
@bootstrap_option
def topics_delete(name: str, bootstrap: str | None) -> None:
    """Delete topic NAME and all its data."""
    from headwater.client import Admin

    with Admin(bootstrap) as admin:
        admin.delete_topic(name)
    echo(f"deleted topic {name}")


@topics.command("alter")
@click.argument("name")
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=None,
    help="New partition count (more than now; partitions never shrink).",
)
@click.option(
    "--config",
    "configs",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set a config override, by the node's name or Kafka's: retention_ms=3600000 or "
    "retention.ms=3600000 (repeatable).",
)
@click.option(
    "--delete-config",
    "deleted",
    multiple=True,
    metavar="KEY",
    help="Remove a config override: the node's default applies again (repeatable).",
)
@bootstrap_option
def topics_alter(
    name: str,
    partitions: int | None,
    configs: tuple[str, ...],
    deleted: tuple[str, ...],
    bootstrap: str | None,
) -> None:
    """Add partitions to topic NAME or change its configs."""
    from headwater.client import Admin

    if partitions is None and not configs and not deleted:
        raise click.UsageError("give --partitions, --config or --delete-config")
    with Admin(bootstrap) as admin:
        if configs or deleted:
            overrides = admin.alter_topic_configs(name, _parse_configs(configs), deleted)
            shown = ", ".join(f"{k}={v}" for k, v in sorted(overrides.items())) or "none"
            echo(f"topic {name} config overrides: {shown}")
        if partitions is not None:
            admin.create_partitions(name, partitions)
            echo(f"topic {name} now has {partitions} partitions")


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a comma-separated list of node ids", param_hint="--replicas"
        ) from None


@topics.command("reassign")
@click.argument("name")
@click.option("--partition", type=click.IntRange(min=0), required=True, help="Partition to move.")
@click.option(
    "--replicas",
    required=True,
    metavar="ID,ID,...",
    help="Target replicas; the first becomes the preferred leader.",
)
@bootstrap_option
def topics_reassign(name: str, partition: int, replicas: str, bootstrap: str | None) -> None:
    """Move a partition of NAME to other brokers (new replicas copy the log, then old ones
    are dropped)."""
    from headwater.client import Admin

    target = _parse_ids(replicas)
    with Admin(bootstrap) as admin:
        admin.reassign_partition(name, partition, target)
    echo(
        f"reassigning partition {partition} of {name} to {','.join(map(str, target))}",
    )


# ---------------------------------------------------------------------- cluster


@main.group()
def cluster() -> None:
    """Cluster state."""


@cluster.command("status")
@json_option
@bootstrap_option
def cluster_status(as_json: bool, bootstrap: str | None) -> None:
    """The active controller, the Raft term, and every broker's state."""
    from headwater.cli.cluster import print_json, print_status, status_json
    from headwater.client import Admin

    with Admin(bootstrap) as admin:
        data = status_json(admin.metadata())
    if as_json:
        print_json(data)
    else:
        print_status(data)


@cluster.command("health")
@click.option(
    "--address",
    metavar="HOST:PORT",
    default=None,
    help="The node's client listener (default: the first address of HEADWATER_BOOTSTRAP, "
    "else 127.0.0.1:7700).",
)
@click.option("--timeout-ms", type=click.IntRange(1, 600_000), default=2000, show_default=True)
def cluster_health(address: str | None, timeout_ms: int) -> None:
    """Exit 0 when the node at ADDRESS answers the gRPC health check with SERVING, 1
    otherwise (a container HEALTHCHECK or a readiness probe). One node, not the cluster:
    --address, not --bootstrap."""
    from headwater.healthcheck import node_serving

    if address is None:
        bootstrap = os.environ.get("HEADWATER_BOOTSTRAP", "").split(",")[0].strip()
        address = bootstrap or "127.0.0.1:7700"

    if not node_serving(address, timeout_ms / 1000):
        fail(f"node at {address} is not serving (or did not answer in {timeout_ms} ms)")
    click.echo(f"node at {address} is serving")


@main.group()
def tls() -> None:
    """Certificates for trying TLS (docs/security.md)."""


@tls.command("init")
@click.argument("folder", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--node",
    "nodes",
    multiple=True,
    metavar="NAME",
    help="A node certificate: CN and DNS name NAME, plus localhost, 127.0.0.1 and ::1 "
    "(and every --host). Repeat per node.",
)
@click.option(
    "--client",
    "clients",
    multiple=True,
    metavar="NAME",
    help="A client certificate with CN NAME. Repeat per client.",
)
@click.option("--host", "hosts", multiple=True, metavar="NAME", help="Another DNS name nodes have.")
@click.option("--days", type=click.IntRange(1, 3650), default=365, show_default=True)
def tls_init(
    folder: Path,
    nodes: tuple[str, ...],
    clients: tuple[str, ...],
    hosts: tuple[str, ...],
    days: int,
) -> None:
    """Make a throwaway CA and certificates in FOLDER (ca.crt, NAME.crt, NAME.key; keys
    readable by their owner only). For trying TLS: production certificates come from your
    own CA."""
    from headwater.tools.tls_certs import create_named_pki

    if not nodes and not clients:
        fail("give at least one --node or --client")
    if (folder / "ca.crt").exists():
        fail(f"{folder / 'ca.crt'} exists: remove the folder's files to make new ones")
    try:
        pki = create_named_pki(folder, nodes, clients, ("localhost", *hosts), days=days)
    except ValueError as exc:
        fail(str(exc))
    click.echo(f"CA: {pki.ca_file}")
    for name, files in {**pki.nodes, **pki.clients}.items():
        click.echo(f"{name}: {files.cert_file} {files.key_file}")


@main.command("dev-cluster")
@click.option("--nodes", type=click.IntRange(1, 9), default=3, show_default=True)
@click.option(
    "--base-port",
    type=click.IntRange(1024, 65000),
    default=7700,
    show_default=True,
    help="Node i serves gRPC on BASE + 2(i-1) and Raft on the port after.",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=Path("./data/dev-cluster"),
    show_default=True,
)
@click.option(
    "--metrics-base-port",
    type=click.IntRange(0, 65000),
    default=9100,
    show_default=True,
    help="Node i serves Prometheus metrics on 127.0.0.1:(BASE + i); 0 turns metrics off.",
)
@click.option(
    "--kafka-base-port",
    type=click.IntRange(0, 65000),
    default=9092,
    show_default=True,
    help="Node i serves Kafka's wire protocol on 127.0.0.1:(BASE + i - 1), with --tls over "
    "mutual TLS (security.protocol=SSL); 0 turns it off.",
)
@click.option(
    "--tls",
    is_flag=True,
    help="Mutual TLS on every listener, with a throwaway CA and certificates for the nodes "
    "and a client (admin) made under DATA_DIR/tls on first use; prints the client settings.",
)
@click.option(
    "--restart",
    is_flag=True,
    help="Start a node that exits again after 1 s (unless it exited 5 times within 60 s).",
)
def dev_cluster(
    nodes: int,
    base_port: int,
    data_dir: Path,
    metrics_base_port: int,
    kafka_base_port: int,
    tls: bool,
    restart: bool,
) -> None:
    """Run NODES combined nodes on loopback until Ctrl-C. The Raft secret is
    HEADWATER_CLUSTER_SECRET, else kept in DATA_DIR/cluster-secret; a command to restart
    each node by hand is printed."""
    from headwater.cli.cluster import run_dev_cluster

    run_dev_cluster(nodes, base_port, data_dir, metrics_base_port, tls, restart, kafka_base_port)


# ---------------------------------------------------------------------- produce / consume


@main.command()
@click.argument("topic")
@click.option(
    "--key-separator", metavar="SEP", help="Split each line at the first SEP into key and value."
)
@click.option("--acks", type=click.Choice(["0", "1", "all"]), default="all", show_default=True)
@click.option("--partition", type=int, default=None, help="Send every record to this partition.")
@click.option(
    "--compression", type=click.Choice(["none", "lz4", "zstd"]), default="none", show_default=True
)
@click.option("--linger-ms", type=click.IntRange(0, 60_000), default=5, show_default=True)
@bootstrap_option
def produce(
    topic: str,
    key_separator: str | None,
    acks: str,
    partition: int | None,
    compression: str,
    linger_ms: int,
    bootstrap: str | None,
) -> None:
    """Send one record per line of standard input to TOPIC.

    Exits with status 1 if any record was not acknowledged.
    """
    from headwater.cli.produce import produce_lines

    separator = key_separator.encode() if key_separator is not None else None
    sent, failed, first_error = produce_lines(
        sys.stdin.buffer, topic, separator, acks, partition, compression, linger_ms, bootstrap
    )
    if failed:
        fail(f"{failed} of {sent + failed} records not acknowledged; first error: {first_error}")


@main.command()
@click.argument("topic")
@click.option(
    "--from-beginning", is_flag=True, help="Start at the earliest offset (default: the end)."
)
@click.option(
    "--partition", type=click.IntRange(min=0), default=None, help="Read only this partition."
)
@click.option(
    "--offset", type=click.IntRange(min=0), default=None, help="Start offset (needs --partition)."
)
@click.option(
    "--max-messages", type=click.IntRange(min=1), default=None, help="Exit after this many records."
)
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=0),
    default=None,
    help="Exit when no record arrives for this long.",
)
@click.option("--print-key", is_flag=True, help="Print KEY<TAB>VALUE.")
@click.option(
    "--format",
    "record_format",
    default=None,
    metavar="FMT",
    help="Print each record in FMT, kcat's -f placeholders: %t topic, %p partition, "
    "%o offset, %k key, %s (or %v) value, %T timestamp (ms), %h headers (k=v,...), "
    "%K and %S key and value lengths; escapes \\n \\t; no newline is added.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print each record as one JSON object a line."
)
@click.option(
    "--group",
    default=None,
    metavar="GROUP",
    help="Read as a member of consumer group GROUP: its share of the partitions, from the "
    "group's committed offsets (else per --from-beginning); commits what it printed, and on "
    "exit (Ctrl-C too) commits and leaves.",
)
@bootstrap_option
def consume(
    topic: str,
    from_beginning: bool,
    partition: int | None,
    offset: int | None,
    max_messages: int | None,
    timeout_ms: int | None,
    print_key: bool,
    record_format: str | None,
    as_json: bool,
    group: str | None,
    bootstrap: str | None,
) -> None:
    """Print TOPIC's records, one value per line (or as --print-key, --format or --json
    say)."""
    from headwater.cli.consume import consume_lines, renderer

    if sum((print_key, record_format is not None, as_json)) > 1:
        fail("--print-key, --format and --json do not mix: pick one", status=2)
    try:
        render = renderer(print_key, record_format, as_json)
    except ValueError as error:
        fail(str(error), status=2)
    if offset is not None and partition is None:
        fail("--offset needs --partition", status=2)
    if group is not None and partition is not None:
        fail("--group and --partition do not mix: the group assigns the partitions", status=2)
    consume_lines(
        sys.stdout.buffer,
        topic,
        from_beginning,
        partition,
        offset,
        max_messages,
        timeout_ms,
        print_key,
        bootstrap,
        group,
        render,
    )


# ---------------------------------------------------------------------- groups


@main.group()
def groups() -> None:
    """Consumer groups: list, describe (with lag), reset offsets, delete."""


@groups.command("list")
@json_option
@bootstrap_option
def groups_list(as_json: bool, bootstrap: str | None) -> None:
    """List the cluster's consumer groups."""
    from headwater.cli.groups import list_rows
    from headwater.client import Admin

    with Admin(bootstrap) as admin:
        response = admin.list_groups()
    rows = list_rows(response)
    if as_json:
        print(json.dumps({"groups": rows, "unreachable_nodes": list(response.unreachable_nodes)}))
        return
    table = Table("group", "state", "members", "coordinator")
    for row in rows:
        table.add_row(
            row["group_id"], row["state"], str(row["members"]), str(row["coordinator_id"])
        )
    print_table(table)
    if response.unreachable_nodes:
        click.echo(
            f"warning: nodes {list(response.unreachable_nodes)} did not answer; their groups "
            "are missing",
            err=True,
        )


@groups.command("describe")
@click.argument("group")
@json_option
@bootstrap_option
def groups_describe(group: str, as_json: bool, bootstrap: str | None) -> None:
    """A group's state, members, assignments, and per partition its committed offset,
    log end and lag."""
    from headwater.cli.groups import describe_json
    from headwater.client import Admin

    with Admin(bootstrap) as admin:
        described = describe_json(admin, group)
    if as_json:
        print(json.dumps(described))
        return
    epoch = "generation" if described["protocol"] == "classic" else "epoch"
    echo(
        f"group {described['group_id']} ({described['protocol']} protocol): "
        f"{described['state']}, {epoch} {described['group_epoch']}, "
        f"{len(described['members'])} member(s), assignor {described['assignor']}, "
        f"coordinator node {described['coordinator_id']}, total lag {described['total_lag']}",
    )
    if described["members"]:
        members = Table("member", "client id", "host", "assigned")
        for member in described["members"]:
            assigned = ", ".join(
                f"{item['topic']}-{','.join(map(str, item['partitions']))}"
                for item in member["assigned"]
            )
            members.add_row(
                member["member_id"],
                member["client_id"] or "-",
                member["host"] or "-",
                assigned or "-",
            )
        print_table(members)
    table = Table("topic", "partition", "committed", "log end", "lag", "member")
    for row in described["partitions"]:
        table.add_row(
            row["topic"],
            str(row["partition"]),
            "-" if row["committed"] is None else str(row["committed"]),
            str(row["log_end"]),
            "-" if row["lag"] is None else str(row["lag"]),
            row["member_id"] or "-",
        )
    print_table(table)


@groups.command("reset-offsets")
@click.argument("group")
@click.option("--topic", required=True, help="The topic whose offsets to reset (all partitions).")
@click.option("--to-earliest", is_flag=True, help="To the log start.")
@click.option("--to-latest", is_flag=True, help="To the high watermark.")
@click.option("--to-offset", type=click.IntRange(min=0), default=None, help="To offset N.")
@click.option(
    "--to-datetime", default=None, metavar="ISO", help="To the first record at or after ISO."
)
@click.option("--shift-by", type=int, default=None, help="Move the committed offsets by N.")
@click.option("--execute", is_flag=True, help="Apply the plan (without it: a dry run).")
@json_option
@bootstrap_option
def groups_reset_offsets(
    group: str,
    topic: str,
    to_earliest: bool,
    to_latest: bool,
    to_offset: int | None,
    to_datetime: str | None,
    shift_by: int | None,
    execute: bool,
    as_json: bool,
    bootstrap: str | None,
) -> None:
    """Reset GROUP's committed offsets of TOPIC (the group must have no members to
    --execute). Prints the plan; changes nothing without --execute."""
    from headwater.cli.groups import clamp_warnings, execute_plan, reset_plan
    from headwater.client import Admin

    chosen: list[tuple[str, int | str | None]] = [
        (name, value)
        for name, value, given in (
            ("earliest", None, to_earliest),
            ("latest", None, to_latest),
            ("offset", to_offset, to_offset is not None),
            ("datetime", to_datetime, to_datetime is not None),
            ("shift", shift_by, shift_by is not None),
        )
        if given
    ]
    if len(chosen) != 1:
        fail(
            "choose exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime, "
            "--shift-by",
            status=2,
        )
    to, value = chosen[0]
    with Admin(bootstrap) as admin:
        plan = reset_plan(admin, group, topic, to, value)
        if execute:
            execute_plan(admin, group, plan)
    for warning in clamp_warnings(plan):
        click.echo(warning, err=True)
    if as_json:
        print(json.dumps({"executed": execute, "partitions": plan}))
        return
    table = Table("topic", "partition", "current", "new")
    for row in plan:
        current = "-" if row["current"] is None else str(row["current"])
        table.add_row(row["topic"], str(row["partition"]), current, str(row["new"]))
    print_table(table)
    if not execute:
        click.echo("dry run: nothing changed; add --execute to apply", err=True)


@groups.command("delete")
@click.argument("group")
@bootstrap_option
def groups_delete(group: str, bootstrap: str | None) -> None:
    """Delete an empty group and its committed offsets."""
    from headwater.client import Admin

    with Admin(bootstrap) as admin:
        admin.delete_group(group)
    echo(f"deleted group {group}")


# ---------------------------------------------------------------------- debug


@main.group()
def debug() -> None:
    """Checks for operators and tests (replica and metadata consistency)."""


@debug.command("compare-replicas")
@click.argument("topic")
@json_option
@bootstrap_option
def debug_compare_replicas(topic: str, as_json: bool, bootstrap: str | None) -> None:
    """Compare every replica of TOPIC byte for byte below the high watermark.

    For each partition, each replica's node hashes its stored batches in [the largest
    log start, the smallest high watermark) over the replicas. Exits 1 when replicas
    differ or a replica cannot be asked.
    """
    from headwater.client import Admin
    from headwater.tools.chaos.replicas import compare_replicas, comparison_json

    with Admin(bootstrap) as admin:
        comparisons = compare_replicas(admin, topic)
    identical = all(c.identical for c in comparisons)
    if as_json:
        print(
            json.dumps(
                {
                    "topic": topic,
                    "identical": identical,
                    "partitions": [comparison_json(c) for c in comparisons],
                }
            )
        )
    else:
        table = Table("partition", "range", "replica", "hw", "end", "batches", "bytes", "sha256")
        for c in comparisons:
            for view in c.views:
                table.add_row(
                    str(c.partition),
                    f"[{c.start_offset}, {c.end_offset})",
                    f"{view.node_id}{' (leader)' if view.is_leader else ''}",
                    str(view.high_watermark),
                    str(view.log_end_offset),
                    str(view.batch_count),
                    str(view.size_bytes),
                    view.sha256[:16],
                )
        print_table(table)
        for c in comparisons:
            for view in c.views:
                if view.damage:
                    echo(
                        f"partition {c.partition}: node {view.node_id} set aside: {view.damage}",
                    )
            for node_id, error in c.errors:
                echo(f"partition {c.partition}: node {node_id}: {error}")
            if c.differences:
                echo(f"partition {c.partition}: replicas differ:")
                for line in c.differences:
                    echo(f"  {line}")
        differing = sum(1 for c in comparisons if not c.identical)
        echo(
            f"{len(comparisons)} partition(s): "
            + ("replicas identical" if identical else f"{differing} with differences"),
        )
    if not identical:
        sys.exit(1)


@debug.command("compare-metadata")
@click.option(
    "--wait",
    type=click.FloatRange(0, 600),
    default=10.0,
    show_default=True,
    help="Seconds to wait for every node to reach one metadata offset.",
)
@json_option
@bootstrap_option
def debug_compare_metadata(wait: float, as_json: bool, bootstrap: str | None) -> None:
    """Compare every node's metadata image (offset and SHA-256).

    Nodes at one offset must hold the same image. Waits up to --wait seconds for a change
    in flight to reach every node. Exits 1 when images differ or a node cannot be asked.
    """
    from headwater.client import Admin
    from headwater.tools.chaos.replicas import compare_metadata, metadata_comparison_json

    with Admin(bootstrap) as admin:
        addresses = {b.node_id: b.address for b in admin.metadata().brokers}
        comparison = compare_metadata(admin, addresses, deadline_s=wait)
    if as_json:
        print(json.dumps(metadata_comparison_json(comparison)))
    else:
        table = Table("node", "metadata offset", "sha256")
        for view in comparison.views:
            table.add_row(str(view.node_id), str(view.offset), view.digest)
        print_table(table)
        for node_id, error in comparison.errors:
            echo(f"node {node_id}: {error}")
        for line in comparison.differences:
            echo(line)
        echo(
            "metadata images identical" if comparison.identical else "metadata images differ",
        )
    if not comparison.identical:
        sys.exit(1)


if __name__ == "__main__":
    main()
