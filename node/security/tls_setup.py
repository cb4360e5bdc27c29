"""A node's TLS material, loaded and checked once at start (``tls_*`` settings).

``load_node_tls`` reads the certificate, key and CA files (size-checked before parsing),
and refuses to start, with INVALID_CONFIG naming the file and the problem, when:

- a file cannot be read, is larger than ``PEM_BYTES_MAX``, or holds no PEM certificate;
- the node's certificate has expired or is not valid yet (a node that started with one
  would have every handshake refused, which clients see only as closed connections);
- the key is not the certificate's key.

The result builds the credentials of both listeners and of the node's own calls to
other nodes:

- client listener: the node's certificate; client certificates required and verified
  against ``tls_ca_file`` when ``tls_client_auth`` is ``required``;
- inter-broker listener: the node's certificate, and the calling node's certificate
  required and verified against ``tls_ca_file`` whenever one is set (mutual TLS between
  nodes, beside the cluster secret's signatures);
- calls to other nodes: the node's certificate as the client certificate, their
  certificates verified against ``tls_ca_file``.
"""

from __future__ import annotations

import datetime
import ssl
from dataclasses import dataclass
from typing import Final

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from headwater.node.config import NodeConfig
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.tls import read_pem


def _invalid(message: str) -> HeadwaterError:
    return HeadwaterError(ErrorCode.INVALID_CONFIG, message)


@dataclass(frozen=True, slots=True)
class NodeTls:
    """The node's PEM material, checked (see the module docstring)."""

    cert_chain: bytes
    private_key: bytes
    trusted_cas: bytes | None
    client_auth_required: bool

    def client_listener_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.private_key, self.cert_chain)],
            root_certificates=self.trusted_cas,
            require_client_auth=self.client_auth_required,
        )

    def internal_listener_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.private_key, self.cert_chain)],
            root_certificates=self.trusted_cas,
            require_client_auth=self.trusted_cas is not None,
        )

    def peer_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.trusted_cas, self.private_key, self.cert_chain)

    def server_context(self, cert_file: str, key_file: str, ca_file: str) -> ssl.SSLContext:
        """An ``ssl`` server context with the same certificate and client rule as the
        gRPC listeners (for the Kafka listener): TLS 1.2 or later; client certificates
        from the CA required when ``client_auth_required``."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(cert_file, key_file)
        if self.client_auth_required:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(ca_file)
        return context


_SAN_KINDS: Final[
    dict[str, type[x509.DNSName] | type[x509.UniformResourceIdentifier] | type[x509.RFC822Name]]
] = {
    "san_dns": x509.DNSName,
    "san_uri": x509.UniformResourceIdentifier,
    "san_email": x509.RFC822Name,
}


def principal_of_certificate(der: bytes, mapping: str) -> str:
    """``User:<name>`` of a verified client certificate (DER) by ``tls_principal_mapping``,
    as the gRPC listener names it; SASL_AUTHENTICATION_FAILED when the certificate lacks
    the part the mapping names."""
    certificate = x509.load_der_x509_certificate(der)
    names: list[str] = []
    if mapping == "cn":
        names = [
            str(a.value) for a in certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        ]
    elif mapping == "subject":
        names = [certificate.subject.rfc4514_string()]
    else:
        try:
            extension = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
            names = [str(v) for v in extension.value.get_values_for_type(_SAN_KINDS[mapping])]
        except x509.ExtensionNotFound:
            names = []
    if not names or not names[0]:
        raise HeadwaterError(
            ErrorCode.SASL_AUTHENTICATION_FAILED,
            f"the client certificate has no {mapping} to name its principal "
            "(tls_principal_mapping)",
        )
    return "User:" + names[0]


def _certificates(pem: bytes, what: str, path: str) -> list[x509.Certificate]:
    try:
        found = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise _invalid(f"{what} {path} holds no valid PEM certificate: {exc}") from exc
    return found


def check_validity(cert: x509.Certificate, path: str, now: datetime.datetime) -> None:
    """INVALID_CONFIG when ``cert`` is not valid at ``now``."""
    if now < cert.not_valid_before_utc:
        raise _invalid(
            f"tls_cert_file {path} is not valid before "
            f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M:%S} UTC (check this machine's clock)"
        )
    if now > cert.not_valid_after_utc:
        raise _invalid(
            f"tls_cert_file {path} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M:%S} "
            "UTC: renew it"
        )


def load_node_tls(config: NodeConfig, now: datetime.datetime | None = None) -> NodeTls | None:
    """The node's TLS material, or None when its listeners are plaintext."""
    if not config.tls:
        return None
    chain = read_pem(config.tls_cert_file, "tls_cert_file")
    key_pem = read_pem(config.tls_key_file, "tls_key_file")
    leaf = _certificates(chain, "tls_cert_file", config.tls_cert_file)[0]
    check_validity(leaf, config.tls_cert_file, now or datetime.datetime.now(datetime.UTC))
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise _invalid(
            f"tls_key_file {config.tls_key_file} is not an unencrypted PEM private key: {exc}"
        ) from exc
    ours = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    theirs = leaf.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    if ours != theirs:
        raise _invalid(
            f"tls_key_file {config.tls_key_file} is not the key of tls_cert_file "
            f"{config.tls_cert_file}"
        )
    trusted = None
    if config.tls_ca_file:
        trusted = read_pem(config.tls_ca_file, "tls_ca_file")
        _certificates(trusted, "tls_ca_file", config.tls_ca_file)
    return NodeTls(
        cert_chain=chain,
        private_key=key_pem,
        trusted_cas=trusted,
        client_auth_required=config.tls_client_auth == "required",
    )
