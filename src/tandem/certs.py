"""`tandem certs dev`: a throwaway CA with a server and a client certificate, for trying TLS locally.

Not for production: the CA's key sits next to the certificates it signed, unprotected, and the
server certificate names only 127.0.0.1, ::1 and localhost (docs/security.md, "TLS").
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEV_DAYS = 30  # short on purpose: these are for trials


@dataclass(frozen=True)
class DevCerts:
    """Where `write_dev_certs` put each file."""

    ca: Path
    ca_key: Path
    server: Path
    server_key: Path
    client: Path
    client_key: Path


def _name(cn: str, org: str = "Tandem dev") -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, org), x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _signed(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
    usage: list[x509.ObjectIdentifier],
    names: list[x509.GeneralName],
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    b = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=DEV_DAYS))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if ca:
        b = b.add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
    else:
        b = b.add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
        b = b.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        b = b.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    if names:
        b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def write_dev_certs(
    out: str | Path,
    client_cn: str = "tandem-client",
    ca_cn: str = "Tandem dev CA",
    server_names: tuple[str, ...] = ("localhost", "127.0.0.1", "::1"),
) -> DevCerts:
    """Write ca.pem (+ ca-key.pem), server.pem/server-key.pem (for `server_names`: host names or
    IP addresses) and client.pem/client-key.pem (CN `client_cn`) into `out`, replacing files of
    those names."""
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    ca_key, server_key, client_key = _key(), _key(), _key()
    ca_name = _name(ca_cn)
    ca = _signed(ca_name, ca_key, ca_name, ca_key, ca=True, usage=[], names=[])
    server = _signed(
        _name("localhost"),
        server_key,
        ca_name,
        ca_key,
        ca=False,
        usage=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],  # client too: server links
        names=[_general_name(n) for n in server_names],
    )
    client = _signed(
        _name(client_cn), client_key, ca_name, ca_key, ca=False, usage=[ExtendedKeyUsageOID.CLIENT_AUTH], names=[]
    )
    files = DevCerts(
        d / "ca.pem", d / "ca-key.pem", d / "server.pem", d / "server-key.pem", d / "client.pem", d / "client-key.pem"
    )
    pem = serialization.Encoding.PEM
    _write(files.ca, ca.public_bytes(pem))
    _write(files.ca_key, _pem_key(ca_key), private=True)
    _write(files.server, server.public_bytes(pem))
    _write(files.server_key, _pem_key(server_key), private=True)
    _write(files.client, client.public_bytes(pem))
    _write(files.client_key, _pem_key(client_key), private=True)
    return files
