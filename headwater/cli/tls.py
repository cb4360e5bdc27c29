"""``headwater tls init``: a throwaway CA and certificates for named nodes and clients,
for trying TLS (docs/security.md)."""

from __future__ import annotations

from pathlib import Path

import click

from headwater.cli.output import fail


@click.group()
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
    # Here, not at the top: certificates need cryptography, of the server extra, and
    # `headwater --help` loads this module.
    from headwater.tools.tls_certs import create_named_pki  # noqa: PLC0415

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
