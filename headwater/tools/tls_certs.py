"""Throwaway certificates for trying TLS: a CA, and certificates it signs for nodes and
clients (``headwater dev-cluster --tls``, ``headwater tls``, the compose TLS variant).

Every certificate is an ECDSA P-256 key and an X.509 v3 certificate in PEM. The CA is
``CN=<name>`` with basicConstraints CA:TRUE (path length 0) and keyCertSign. A leaf has:

- subject ``CN=<common name>``;
- subjectAltName: the DNS names and IP addresses given (a node's certificate needs the
  names and addresses clients and other nodes dial it by);
- extendedKeyUsage serverAuth and clientAuth, so one certificate serves a node both as
  a server and as a client of other nodes (mutual TLS between nodes);
- a validity of ``days`` from one minute ago (clock skew between machines).

These are for development and tests: the keys are written unencrypted, readable by their
owner only. Production certificates come from the organisation's own CA.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DAYS_DEFAULT: Final = 365
DAYS_MAX: Final = 3650
_BACKDATE: Final = datetime.timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes


def _name(common_name: str) -> x509.Name:
    if not 1 <= len(common_name) <= 64:
        raise ValueError(f"common name {common_name!r} must be 1..64 characters")
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _window(days: int) -> tuple[datetime.datetime, datetime.datetime]:
    """(not before, not after) for a certificate valid ``days`` from now; ``days`` may be
    negative for a certificate that has already expired (tests of expiry)."""
    if not -DAYS_MAX <= days <= DAYS_MAX or days == 0:
        raise ValueError(f"days is {days}; valid: 1..{DAYS_MAX} (negative: already expired)")
    start = datetime.datetime.now(datetime.UTC) - _BACKDATE
    if days > 0:
        return start, start + datetime.timedelta(days=days)
    end = start + datetime.timedelta(days=days)
    return end - datetime.timedelta(days=1), end


def create_ca(common_name: str, days: int = DAYS_DEFAULT) -> Issued:
    """A self-signed CA certificate and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    not_before, not_after = _window(days)
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(
    ca: Issued,
    common_name: str,
    dns_names: tuple[str, ...] = (),
    ip_addresses: tuple[str, ...] = (),
    days: int = DAYS_DEFAULT,
    uris: tuple[str, ...] = (),
) -> Issued:
    """A certificate for ``common_name`` signed by ``ca`` (see the module docstring)."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError("the CA key is not an ECDSA key made by create_ca")
    key = ec.generate_private_key(ec.SECP256R1())
    not_before, not_after = _window(days)
    alternative: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    alternative += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    alternative += [x509.UniformResourceIdentifier(uri) for uri in uris]
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    if alternative:
        builder = builder.add_extension(x509.SubjectAlternativeName(alternative), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Where one party's files were written: its certificate, its key, and the CA's
    certificate it trusts."""

    cert_file: Path
    key_file: Path
    ca_file: Path


def write(issued: Issued, folder: Path, stem: str, ca_file: Path) -> TlsFiles:
    """Write ``<stem>.crt`` and ``<stem>.key`` (mode 0600) under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = folder / f"{stem}.crt", folder / f"{stem}.key"
    cert_file.write_bytes(issued.cert_pem)
    # A new file, never through a link, owner-only from its first byte (an old key file
    # may have had a looser mode).
    key_file.unlink(missing_ok=True)
    descriptor = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(issued.key_pem)
    return TlsFiles(cert_file, key_file, ca_file)


@dataclass(frozen=True, slots=True)
class DevPki:
    """A CA, one certificate per node and one for a client, written under one folder."""

    folder: Path
    ca_file: Path
    nodes: dict[int, TlsFiles]
    client: TlsFiles


@dataclass(frozen=True, slots=True)
class NamedPki:
    """A CA and certificates for named nodes and clients, written under one folder
    (``headwater tls init``)."""

    folder: Path
    ca_file: Path
    nodes: dict[str, TlsFiles]
    clients: dict[str, TlsFiles]


def create_named_pki(
    folder: Path,
    nodes: tuple[str, ...],
    clients: tuple[str, ...],
    hosts: tuple[str, ...] = ("localhost",),
    addresses: tuple[str, ...] = ("127.0.0.1", "::1"),
    days: int = DAYS_DEFAULT,
) -> NamedPki:
    """``ca.crt``/``ca.key``; ``<node>.crt/.key`` for each node name (CN and a DNS
    subjectAltName of that name, plus ``hosts`` and ``addresses``); ``<client>.crt/.key``
    for each client name (CN of that name: its principal under the default mapping).
    Names are 1..64 characters of letters, digits, ``.``, ``-`` and ``_``, and distinct."""
    everything = (*nodes, *clients)
    for name in everything:
        if not 1 <= len(name) <= 64 or not all(c.isalnum() or c in ".-_" for c in name):
            raise ValueError(
                f"name {name!r}: valid names are 1..64 letters, digits, '.', '-' or '_'"
            )
    if len(set(everything)) != len(everything) or "ca" in everything:
        raise ValueError(f"names must be distinct and not 'ca': {', '.join(everything)}")
    ca = create_ca("Headwater CA", days)
    ca_file = folder / "ca.crt"
    write(ca, folder, "ca", ca_file)
    return NamedPki(
        folder,
        ca_file,
        {
            name: write(issue(ca, name, (name, *hosts), addresses, days), folder, name, ca_file)
            for name in nodes
        },
        {name: write(issue(ca, name, days=days), folder, name, ca_file) for name in clients},
    )


def create_dev_pki(
    folder: Path,
    node_ids: tuple[int, ...],
    client_name: str = "admin",
    hosts: tuple[str, ...] = ("localhost",),
    addresses: tuple[str, ...] = ("127.0.0.1", "::1"),
    days: int = DAYS_DEFAULT,
) -> DevPki:
    """``ca.crt``/``ca.key``, ``node-<id>.crt/.key`` for each node (CN ``node-<id>``,
    subjectAltName ``hosts``, ``node-<id>`` and ``addresses``) and ``<client_name>.crt/.key``
    (CN ``client_name``), all under ``folder``."""
    names = {node_id: f"node-{node_id}" for node_id in node_ids}
    made = create_named_pki(folder, tuple(names.values()), (client_name,), hosts, addresses, days)
    nodes = {node_id: made.nodes[name] for node_id, name in names.items()}
    return DevPki(folder, made.ca_file, nodes, made.clients[client_name])


def load_dev_pki(
    folder: Path, node_ids: tuple[int, ...], client_name: str = "admin", days_left: int = 1
) -> DevPki | None:
    """The PKI ``create_dev_pki`` wrote under ``folder``, when every file is there and
    every certificate stays valid for ``days_left`` more days; None otherwise."""
    ca_file = folder / "ca.crt"
    stems = [f"node-{i}" for i in node_ids] + [client_name]
    wanted = [ca_file, folder / "ca.key"]
    wanted += [folder / f"{stem}.{ext}" for stem in stems for ext in ("crt", "key")]
    if not all(path.is_file() for path in wanted):
        return None
    horizon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=days_left)
    for path in [ca_file, *(folder / f"{stem}.crt" for stem in stems)]:
        try:
            cert = x509.load_pem_x509_certificate(path.read_bytes())
        except ValueError:
            return None
        if cert.not_valid_after_utc < horizon:
            return None

    def files(stem: str) -> TlsFiles:
        return TlsFiles(folder / f"{stem}.crt", folder / f"{stem}.key", ca_file)

    return DevPki(folder, ca_file, {i: files(f"node-{i}") for i in node_ids}, files(client_name))
