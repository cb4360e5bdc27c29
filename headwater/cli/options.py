"""The options more than one command takes, each defined here once.

- ``bootstrap_option``: ``--bootstrap HOST:PORT[,HOST:PORT...]`` (env
  HEADWATER_BOOTSTRAP), the nodes a client command contacts first;
- ``json_option``: ``--json`` (the parameter ``as_json``), JSON for scripts instead of a
  table; ``json_flag(help)`` is the same flag with a command's own help;
- ``json_and_bootstrap_options``: both, the stack of every command that asks the cluster
  and prints what it found;
- ``CLIENT_SETTING_OPTIONS``: the client settings (``--security-protocol``, ``--tls-*``,
  ``--username``, ``--client-id``, ``--client-config``), which the ``headwater`` group
  takes before a command (``client_settings_options``) and every client command takes
  after its name, hidden from its help (``accept_client_settings``).

A stack (``option_stack``) lists its options top to bottom as a command's decorators
would, and they appear in that order in the command's help.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import click

from headwater.cli.security import apply_client_settings

F = TypeVar("F", bound=Callable[..., Any])


def option_stack(*decorators: Callable[[Any], Any]) -> Callable[[F], F]:
    """One decorator that applies ``decorators`` as if written one above the other, in
    the order given."""

    def apply(function: F) -> F:
        for decorator in reversed(decorators):
            function = decorator(function)
        return function

    return apply


def bootstrap_option(function: F) -> F:
    return click.option(
        "--bootstrap",
        envvar="HEADWATER_BOOTSTRAP",
        default=None,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="Nodes to contact first (env HEADWATER_BOOTSTRAP; default 127.0.0.1:7700).",
    )(function)


def json_flag(help_text: str) -> Callable[[F], F]:
    """``--json``, a flag passed as ``as_json``, with ``help_text`` as its help."""
    return click.option("--json", "as_json", is_flag=True, help=help_text)


json_option: Final = json_flag("Print JSON for scripts.")
json_and_bootstrap_options: Final = option_stack(json_option, bootstrap_option)


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
        given = {name: kwargs.pop(name) for name in names}
        client_config = given.pop("client_config", None)
        if client_config is not None or any(given.values()):
            apply_client_settings(given, client_config)
        return callback(*args, **kwargs)

    command.callback = with_client_settings
