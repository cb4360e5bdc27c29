"""The ``headwater`` command: serve a node, manage topics, produce, consume, benchmark.

This module builds the root group: its client settings, its error reporting, and the
table of its commands (COMMAND_MODULES), each defined with its subcommands in a module
of its own and imported only when it is asked for, so that ``headwater serve`` loads
no client command and ``headwater produce`` no server code.

Every client command takes ``--bootstrap HOST:PORT[,HOST:PORT...]`` (or the environment
variable HEADWATER_BOOTSTRAP), defaulting to the local default node. Read commands print
tables for humans and JSON with ``--json``. Errors print one line, ``error: CODE:
message``, on stderr and exit with status 1 (2 for usage errors); never a traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Final

import click

from headwater import __version__
from headwater.cli.lazy import LazyGroup
from headwater.cli.options import accept_client_settings, client_settings_options
from headwater.cli.output import fail
from headwater.cli.security import apply_client_settings
from headwater.shared.errors import HeadwaterError
from headwater.shared.tls import CLIENT_ID_ENV

COMMAND_MODULES: Final = {
    "acls": "headwater.cli.access:acls",
    "bench": "headwater.tools.benchmarks.perf:bench",
    "cluster": "headwater.cli.cluster:cluster",
    "consume": "headwater.cli.consume:consume",
    "debug": "headwater.cli.debug:debug",
    "dev-cluster": "headwater.cli.dev_cluster:dev_cluster",
    "groups": "headwater.cli.groups:groups",
    "produce": "headwater.cli.produce:produce",
    "quotas": "headwater.cli.access:quotas",
    "serve": "headwater.cli.serve:serve",
    "tls": "headwater.cli.tls:tls",
    "topics": "headwater.cli.topics:topics",
    "users": "headwater.cli.access:users",
}
"""Each command of the ``headwater`` group, by name: the module defining it and its
subcommands, and the command's name there."""
EXTRA_OF_MODULE: Final = {
    "pysyncobj": "server",
    "cryptography": "server",
    "grpc_reflection": "server",
    "pyspark": "spark",
}
"""Packages of the install extras (pyproject.toml): a command that needs a missing one
names the extra to install."""
DEFAULT_CLIENT_ID: Final = "headwater-cli"
"""The client id of the command's calls when none is set (--client-id, env, file)."""
COMMANDS_WITHOUT_CLIENT_SETTINGS: Final = frozenset({"serve", "bench", "dev-cluster"})
"""Commands that are not a client of a running cluster, or start processes that take
the client settings from the environment (which the group's options set)."""


class ErrorReportingGroup(LazyGroup):
    """Turns HeadwaterError (and anything unexpected) into one line on stderr. Each
    command is loaded only when asked for (COMMAND_MODULES). Client commands take the
    client settings after their name too (``accept_client_settings``)."""

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


@click.group(
    cls=ErrorReportingGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    lazy_subcommands=COMMAND_MODULES,
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


if __name__ == "__main__":
    main()
