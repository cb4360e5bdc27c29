"""The command line's client settings: connection and TLS settings from flags, the
environment and a client config file, in that order of precedence.

The ``headwater`` group takes ``--security-protocol``, ``--tls-ca-file``,
``--tls-cert-file``, ``--tls-key-file``, ``--tls-server-name``, ``--username`` and
``--client-config FILE`` (or ``HEADWATER_CLIENT_CONFIG``) before the command. The client
config file is TOML with these keys only::

    bootstrap = "127.0.0.1:7700,127.0.0.1:7702"
    security_protocol = "SSL"          # PLAINTEXT, SSL, SASL_SSL, SASL_PLAINTEXT
    tls_ca_file = "/etc/headwater/ca.crt"
    tls_cert_file = "/etc/headwater/alice.crt"
    tls_key_file = "/etc/headwater/alice.key"
    tls_server_name = ""
    username = "alice"                 # credentials (headwater users add)
    password = "..."                   # keep the file private (chmod 600)
    client_id = "billing-etl"          # quotas by client id apply to it
    sasl_mechanism = "SCRAM-SHA-256"   # or PLAIN: the password with every call

The settings are layered whole, as ``ClientSecurity.with_overrides`` does: the file's,
then the environment's over them, then the flags' over both. A TLS file given in a
later layer implies SSL; a later ``PLAINTEXT`` drops the TLS files of earlier layers.
The result is placed in this process's environment (``HEADWATER_BOOTSTRAP``,
``HEADWATER_SECURITY_PROTOCOL``, ``HEADWATER_TLS_*``), where every client the command
builds reads it (``headwater.shared.tls.ClientSecurity.from_env``), as do the processes it
starts (benchmarks).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import MutableMapping
from pathlib import Path
from typing import Final

from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.tls import (
    CA_FILE_ENV,
    CERT_FILE_ENV,
    CLIENT_ID_ENV,
    KEY_FILE_ENV,
    PASSWORD_ENV,
    PROTOCOL_ENV,
    SASL_MECHANISM_ENV,
    SERVER_NAME_ENV,
    USERNAME_ENV,
    ClientSecurity,
    layered,
)

CLIENT_CONFIG_ENV: Final = "HEADWATER_CLIENT_CONFIG"
CLIENT_CONFIG_BYTES_MAX: Final = 64 << 10
ENV_OF_KEY: Final = {
    "bootstrap": "HEADWATER_BOOTSTRAP",
    "security_protocol": PROTOCOL_ENV,
    "tls_ca_file": CA_FILE_ENV,
    "tls_cert_file": CERT_FILE_ENV,
    "tls_key_file": KEY_FILE_ENV,
    "tls_server_name": SERVER_NAME_ENV,
    "username": USERNAME_ENV,
    "password": PASSWORD_ENV,
    "client_id": CLIENT_ID_ENV,
    "sasl_mechanism": SASL_MECHANISM_ENV,
}


FIELD_OF_KEY: Final = {
    "security_protocol": "protocol",
    "tls_ca_file": "ca_file",
    "tls_cert_file": "cert_file",
    "tls_key_file": "key_file",
    "tls_server_name": "server_name",
    "username": "username",
    "password": "password",
    "client_id": "client_id",
    "sasl_mechanism": "sasl_mechanism",
}
"""The config keys of the TLS settings, and the ``ClientSecurity`` field of each."""
SECURITY_KEYS: Final = tuple(FIELD_OF_KEY)


def _invalid(message: str) -> HeadwaterError:
    return HeadwaterError(ErrorCode.INVALID_CONFIG, message)


def read_client_config(path: Path) -> dict[str, str]:
    """The settings of a client config file (see the module docstring), checked."""
    try:
        size = path.stat().st_size
        if size > CLIENT_CONFIG_BYTES_MAX:
            raise _invalid(
                f"client config {path} is {size} bytes; valid: up to {CLIENT_CONFIG_BYTES_MAX}"
            )
        parsed = tomllib.loads(path.read_text())
    except OSError as exc:
        raise _invalid(f"client config {path} cannot be read: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise _invalid(f"client config {path} is not valid TOML: {exc}") from exc
    unknown = sorted(set(parsed) - set(ENV_OF_KEY))
    if unknown:
        raise _invalid(
            f"client config {path} has unknown keys {', '.join(unknown)}; valid: "
            f"{', '.join(ENV_OF_KEY)}"
        )
    settings: dict[str, str] = {}
    for key, value in parsed.items():
        if not isinstance(value, str):
            raise _invalid(f"client config {path}: {key} must be a string, got {value!r}")
        settings[key] = value
    return settings


def apply_client_settings(
    flags: dict[str, str | None],
    config_file: Path | None,
    environ: MutableMapping[str, str] | None = None,
) -> ClientSecurity:
    """Place the file's settings (under what the environment already has) and then the
    flags' (over it) in ``environ``; return the TLS settings that result, so that a bad
    combination fails before the command runs."""
    env = os.environ if environ is None else environ
    from_file = read_client_config(config_file) if config_file is not None else {}
    if "bootstrap" in from_file:
        env.setdefault(ENV_OF_KEY["bootstrap"], from_file["bootstrap"])
    fields = ClientSecurity().fields()
    for layer in (
        {key: from_file.get(key, "") for key in SECURITY_KEYS},
        {key: env.get(ENV_OF_KEY[key], "") for key in SECURITY_KEYS},
        {key: flags.get(key) or "" for key in SECURITY_KEYS},
    ):
        fields = layered(fields, {FIELD_OF_KEY[key]: value for key, value in layer.items()})
    security = ClientSecurity(**fields)
    for key in SECURITY_KEYS:
        value = getattr(security, FIELD_OF_KEY[key])
        if value and value != "plaintext":
            env[ENV_OF_KEY[key]] = value
        else:
            env.pop(ENV_OF_KEY[key], None)
    return security
