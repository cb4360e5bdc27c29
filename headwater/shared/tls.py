"""TLS settings of a gRPC client, and what both sides need to know about certificates.

Every client (the threaded and asyncio clients, the command line, the Spark connector,
the health probe) and every node calling another node builds its channels from one
``ClientSecurity``:

- ``protocol``: ``plaintext``, ``tls`` or ``sasl_plaintext``. Kafka's names are accepted:
  ``PLAINTEXT``, ``SSL``, ``SASL_SSL`` (``tls`` with credentials) and ``SASL_PLAINTEXT``
  (credentials in the clear: the one protocol that sends a password without TLS, and
  only when named; a username without TLS is otherwise refused).
- ``ca_file``: PEM certificates of the CAs trusted to sign the nodes' certificates;
  empty: the system's trusted roots.
- ``cert_file``/``key_file``: this client's certificate chain and private key (PEM), for
  listeners that require mutual TLS; both or neither.
- ``server_name``: the name the nodes' certificates are checked against instead of the
  host dialled (for certificates that name a host other than the address used).
- ``username``/``password``: a user made with ``headwater users add``. How they are
  presented is ``sasl_mechanism``: ``SCRAM-SHA-256`` (the default) logs in on each node
  with a SCRAM exchange and presents the session token it yields (the password never
  travels; ``headwater.client.sessions``); ``PLAIN`` sends them with every call
  (``headwater.shared.credentials``: ``authorization: Basic``). Either way over TLS, since a
  password or a token on the network can be replayed.
- ``client_id``: a name sent with every call (the ``client-id`` metadata), which quotas
  by client id apply to (``headwater.shared.quotas``).

Unset fields come from the environment, ``HEADWATER_SECURITY_PROTOCOL``,
``HEADWATER_TLS_CA_FILE``, ``HEADWATER_TLS_CERT_FILE``, ``HEADWATER_TLS_KEY_FILE``,
``HEADWATER_TLS_SERVER_NAME``, ``HEADWATER_USERNAME``, ``HEADWATER_PASSWORD``,
``HEADWATER_SASL_MECHANISM``, ``HEADWATER_CLIENT_ID`` (``ClientSecurity.from_env``); any
TLS file set there implies ``tls``. A node reads its own ``tls_*`` settings under the
same variable names, so a client run inside a node's container (the health probe) speaks
as the node does.

``handshake_failure`` turns the transport's description of a failed TLS handshake into a
sentence that says what to fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import grpc

from headwater.shared.credentials import AUTHORIZATION_KEY, authorization_value, check_user_name
from headwater.shared.errors import ErrorCode, HeadwaterError

PROTOCOL_ENV: Final = "HEADWATER_SECURITY_PROTOCOL"
CA_FILE_ENV: Final = "HEADWATER_TLS_CA_FILE"
CERT_FILE_ENV: Final = "HEADWATER_TLS_CERT_FILE"
KEY_FILE_ENV: Final = "HEADWATER_TLS_KEY_FILE"
SERVER_NAME_ENV: Final = "HEADWATER_TLS_SERVER_NAME"
USERNAME_ENV: Final = "HEADWATER_USERNAME"
CLIENT_ID_ENV: Final = "HEADWATER_CLIENT_ID"
CLIENT_ID_CHARS_MAX: Final = 255
PASSWORD_ENV: Final = "HEADWATER_PASSWORD"  # noqa: S105 (the variable's name)
SASL_MECHANISM_ENV: Final = "HEADWATER_SASL_MECHANISM"
SCRAM_SHA_256: Final = "SCRAM-SHA-256"
PLAIN: Final = "PLAIN"
SASL_MECHANISMS: Final = (SCRAM_SHA_256, PLAIN)

# gRPC's default reconnect backoff grows to 120 s: a node that restarts would stay
# unreachable for minutes. Retry a lost connection within a second instead (Kafka's
# reconnect.backoff.max.ms is 1 s too).
RECONNECT_OPTIONS: Final = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

PLAINTEXT: Final = "plaintext"
SASL_PLAINTEXT: Final = "sasl_plaintext"
TLS: Final = "tls"
_PROTOCOL_NAMES: Final = {
    "plaintext": PLAINTEXT,
    "tls": TLS,
    "ssl": TLS,  # Kafka's security.protocol=SSL
    "sasl_ssl": TLS,  # with credentials
    "sasl_plaintext": SASL_PLAINTEXT,  # credentials without TLS, asked for by name
}
_WITH_CREDENTIALS: Final = ("sasl_plaintext", "sasl_ssl")
_VALID_PROTOCOLS: Final = "PLAINTEXT, SSL, SASL_SSL, SASL_PLAINTEXT (or plaintext, tls)"
PEM_BYTES_MAX: Final = 1 << 20
"""A certificate bundle or key file larger than this is refused before it is parsed."""


def _invalid(message: str) -> HeadwaterError:
    return HeadwaterError(ErrorCode.INVALID_CONFIG, message)


def parse_protocol(text: str, source: str) -> str:
    """``plaintext`` or ``tls`` from any accepted spelling; INVALID_CONFIG otherwise."""
    name = text.strip().lower()
    if name not in _PROTOCOL_NAMES:
        raise _invalid(
            f"security protocol {text!r} from {source} is unknown; valid: {_VALID_PROTOCOLS}"
        )
    return _PROTOCOL_NAMES[name]


def needs_credentials(text: str) -> bool:
    """Is ``text`` a protocol name that promises credentials (SASL_SSL, SASL_PLAINTEXT)?"""
    return text.strip().lower() in _WITH_CREDENTIALS


def read_pem(path: str, what: str) -> bytes:
    """The bytes of a PEM file, checked for size and for a PEM block; INVALID_CONFIG
    naming the file and the problem otherwise."""
    try:
        size = Path(path).stat().st_size
        if size > PEM_BYTES_MAX:
            raise _invalid(f"{what} {path} is {size} bytes; valid: up to {PEM_BYTES_MAX}")
        data = Path(path).read_bytes()
    except OSError as exc:
        raise _invalid(f"{what} {path} cannot be read: {exc.strerror or exc}") from exc
    if b"-----BEGIN " not in data:
        raise _invalid(f"{what} {path} holds no PEM block (-----BEGIN ...-----)")
    return data


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """How a client secures its channels (see the module docstring)."""

    protocol: str = PLAINTEXT
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""
    username: str = ""
    password: str = field(default="", repr=False)
    client_id: str = ""
    sasl_mechanism: str = ""
    """SCRAM-SHA-256 or PLAIN; empty: SCRAM-SHA-256."""

    def __post_init__(self) -> None:
        mechanism = self.sasl_mechanism.upper() or SCRAM_SHA_256
        if mechanism not in SASL_MECHANISMS:
            raise _invalid(
                f"sasl mechanism {self.sasl_mechanism[:40]!r}: valid are "
                f"{', '.join(SASL_MECHANISMS)} ({SASL_MECHANISM_ENV})"
            )
        object.__setattr__(self, "sasl_mechanism", mechanism)
        if needs_credentials(self.protocol) and not self.username:
            raise _invalid(
                f"security protocol {self.protocol} needs credentials: set a username and "
                f"password ({USERNAME_ENV} and {PASSWORD_ENV}, or --username and the client "
                "config file's password)"
            )
        if self.password and not self.username:
            raise _invalid("a password is set without a username")
        if len(self.client_id) > CLIENT_ID_CHARS_MAX or not self.client_id.isprintable():
            raise _invalid(
                f"client id {self.client_id[:80]!r}: at most {CLIENT_ID_CHARS_MAX} printable "
                "characters"
            )
        if self.username:
            try:
                check_user_name(self.username)
            except HeadwaterError as exc:
                raise _invalid(exc.message) from None
        object.__setattr__(self, "protocol", parse_protocol(self.protocol, "the client"))
        if self.username and self.protocol == PLAINTEXT:
            raise _invalid(
                "a username is set but the connection is plaintext: the password would cross "
                "the network in the clear. Use TLS (SASL_SSL, or any TLS file), or name "
                "SASL_PLAINTEXT to send it in the clear on purpose"
            )
        if bool(self.cert_file) != bool(self.key_file):
            raise _invalid(
                "tls_cert_file and tls_key_file go together: a client certificate needs its "
                f"key (given: cert {self.cert_file!r}, key {self.key_file!r})"
            )
        if not self.tls and (self.ca_file or self.cert_file or self.server_name):
            raise _invalid(
                "TLS files or a server name are set but the security protocol is plaintext; "
                "set it to tls (SSL), or remove them"
            )

    @property
    def tls(self) -> bool:
        return self.protocol == TLS

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientSecurity:
        """The settings in ``HEADWATER_SECURITY_PROTOCOL`` and ``HEADWATER_TLS_*``; a TLS
        file or server name without a protocol implies tls."""
        env = os.environ if environ is None else environ
        files = {
            "ca_file": env.get(CA_FILE_ENV, ""),
            "cert_file": env.get(CERT_FILE_ENV, ""),
            "key_file": env.get(KEY_FILE_ENV, ""),
            "server_name": env.get(SERVER_NAME_ENV, ""),
        }
        protocol_text = env.get(PROTOCOL_ENV, "")
        if protocol_text:
            parse_protocol(protocol_text, PROTOCOL_ENV)
            protocol = protocol_text
        else:
            protocol = TLS if any(files.values()) else PLAINTEXT
        return cls(
            protocol,
            **files,
            username=env.get(USERNAME_ENV, ""),
            password=env.get(PASSWORD_ENV, ""),
            client_id=env.get(CLIENT_ID_ENV, ""),
            sasl_mechanism=env.get(SASL_MECHANISM_ENV, ""),
        )

    @classmethod
    def resolve(cls, given: ClientSecurity | None) -> ClientSecurity:
        """``given``, or the environment's settings when None."""
        return given if given is not None else cls.from_env()

    def with_overrides(self, **fields: str) -> ClientSecurity:
        """These settings with the non-empty ``fields`` replaced (command-line flags over
        the environment), by ``layered``."""
        return ClientSecurity(**layered(self.fields(), fields))

    def fields(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in dataclass_fields(self)}

    def check_files(self) -> None:
        """Read every file now (INVALID_CONFIG naming one that cannot be used), so that a
        bad path fails where the settings are given rather than at the first call."""
        self.credentials()

    def credentials(self) -> grpc.ChannelCredentials | None:
        """gRPC channel credentials from the files (read now); None for plaintext."""
        if not self.tls:
            return None
        root = read_pem(self.ca_file, "tls_ca_file") if self.ca_file else None
        chain = read_pem(self.cert_file, "tls_cert_file") if self.cert_file else None
        key = read_pem(self.key_file, "tls_key_file") if self.key_file else None
        import grpc  # noqa: PLC0415 (settings are read where no channel is opened)

        return grpc.ssl_channel_credentials(root, key, chain)

    @property
    def uses_sessions(self) -> bool:
        """Do calls present a session token from a SCRAM login (rather than nothing, or
        the password with every call)?"""
        return bool(self.username) and self.sasl_mechanism == SCRAM_SHA_256

    def call_metadata(self) -> tuple[tuple[str, str], ...]:
        """Fixed metadata every call carries: the credentials when a username is set and
        the mechanism is PLAIN, and the client id when one is. (A SCRAM session's token
        is added per call by ``headwater.client.sessions``.)"""
        metadata: list[tuple[str, str]] = []
        if self.username and self.sasl_mechanism == PLAIN:
            metadata.append((AUTHORIZATION_KEY, authorization_value(self.username, self.password)))
        if self.client_id:
            metadata.append(("client-id", self.client_id))
        return tuple(metadata)

    def channel_options(self) -> list[tuple[str, str]]:
        """Channel options these settings add (the server name override)."""
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


TLS_FIELDS: Final = ("ca_file", "cert_file", "key_file", "server_name")


def layered(below: Mapping[str, str], above: Mapping[str, str]) -> dict[str, str]:
    """ClientSecurity fields: ``above``'s non-empty ones over ``below`` (a later layer of
    settings over an earlier one; nothing is checked until a ClientSecurity is made of
    the last layer). The certificate and its key are one setting: giving either replaces
    both, so a certificate is never paired with another layer's key. A TLS file implies
    tls unless the same layer names a protocol; a layer that names a protocol other than
    tls drops the TLS files below it (the credentials and client id stay)."""
    chosen = {name: value for name, value in above.items() if value}
    if "cert_file" in chosen or "key_file" in chosen:
        chosen.setdefault("cert_file", "")
        chosen.setdefault("key_file", "")
    if "protocol" not in chosen and any(chosen.get(name) for name in TLS_FIELDS):
        chosen["protocol"] = TLS
    result = dict(below)
    if "protocol" in chosen and parse_protocol(chosen["protocol"], "settings") != TLS:
        for name in TLS_FIELDS:
            result[name] = ""
    result.update(chosen)
    return result


_HANDSHAKE_CAUSES: Final = (
    (
        "certificate has expired",
        "the node's certificate has expired (or is not valid yet): renew it",
    ),
    (
        "unable to get local issuer certificate",
        "the node's certificate is not signed by a CA this client trusts: point "
        "tls_ca_file (HEADWATER_TLS_CA_FILE) at the CA that signed it",
    ),
    (
        "self signed certificate",  # BoringSSL's spelling
        "the node's certificate is self-signed and not in this client's tls_ca_file",
    ),
    (
        "self-signed certificate",  # OpenSSL 3's spelling
        "the node's certificate is self-signed and not in this client's tls_ca_file",
    ),
    (
        "certificate is not yet valid",
        "the node's certificate is not valid yet: check the clocks of both machines",
    ),
    (
        "Hostname Verification Check failed",
        "the node's certificate does not name the host dialled: use an address its "
        "subjectAltName lists, or set tls_server_name (HEADWATER_TLS_SERVER_NAME)",
    ),
    (
        "WRONG_VERSION_NUMBER",
        "the node does not speak TLS on this port (its listener is plaintext): connect "
        "with the plaintext protocol, or configure the node's tls_cert_file",
    ),
)


def handshake_failure(details: str) -> str | None:
    """What to fix, when ``details`` (a failed call's description) reports a TLS
    handshake this client refused; None for any other failure."""
    for marker, advice in _HANDSHAKE_CAUSES:
        if marker in details:
            return f"TLS handshake failed: {advice}"
    if "SSL_ERROR_SSL" in details and (
        "Tls handshake failed" in details or "Handshake failed" in details
    ):  # a protocol or verification failure, not a connection lost during the handshake
        return "TLS handshake failed (see the details)"
    return None


SOCKET_CLOSED_HINT: Final = (
    "if every attempt ends this way, the node may require TLS where this client speaks "
    "plaintext, or refuse this client's certificate (untrusted, expired, or none given "
    "where the node requires one; the node's log names the cause; docs/security.md)"
)
