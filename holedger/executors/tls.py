"""The certificate of the server's trial front, made by the server and pinned in plans.

The server makes a fresh key and self-signed certificate each time it starts a front (an
ECDSA P-256 key that never leaves its memory and the certificate, valid for a day). Each
trial's plan carries the certificate itself; a node's relay trusts that one certificate
and nothing else (no certificate authority, no name check: the pin is the identity), and
checks the SHA-256 of the certificate the front presents against it once more.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class FrontIdentity:
    cert_pem: bytes
    key_pem: bytes

    @property
    def fingerprint(self) -> str:
        der = x509.load_pem_x509_certificate(self.cert_pem).public_bytes(serialization.Encoding.DER)
        return hashlib.sha256(der).hexdigest()


def make_identity(host: str) -> FrontIdentity:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "holedger trial front")])
    now = datetime.datetime.now(datetime.UTC)
    try:
        alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        alt = x509.DNSName(host)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    return FrontIdentity(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def server_context(identity: FrontIdentity) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    # The ssl module loads a key from a file only: a private file, removed at once.
    with tempfile.TemporaryDirectory(prefix="holedger-front-") as tmp:
        path = Path(tmp) / "front.pem"
        path.touch(mode=0o600)
        path.write_bytes(identity.key_pem + identity.cert_pem)
        context.load_cert_chain(path)
    return context


def pinned_context(cert_pem: bytes) -> ssl.SSLContext:
    """A client context that trusts exactly ``cert_pem``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False  # the pinned certificate is the identity
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=cert_pem.decode("ascii"))
    return context


def presented_fingerprint(sock: ssl.SSLObject | ssl.SSLSocket) -> str | None:
    der = sock.getpeercert(binary_form=True)
    return None if der is None else hashlib.sha256(der).hexdigest()
