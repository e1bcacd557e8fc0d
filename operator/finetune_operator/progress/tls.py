"""The progress endpoint's TLS: the given cert/key files, or a self-signed pair made at startup.

A self-signed certificate is enough because the trainer pins it through FTJOB_PROGRESS_CA_FILE
when the chart mounts one; otherwise the channel is still encrypted, and authentication is the
bearer token, not the certificate. The key never leaves this process's temp directory.
"""

import datetime
import ipaddress
import ssl
import tempfile
from pathlib import Path

VALID_DAYS = 365


def self_signed(hosts: list[str], directory: Path) -> tuple[Path, Path]:
    """Write cert.pem and key.pem for `hosts` (DNS names or IPs) into `directory`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else "finetune-operator")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def server_context(cert: str | None, key: str | None) -> ssl.SSLContext:
    """An SSL context serving the given certificate files."""
    if not (cert and key):
        raise ValueError("the progress endpoint needs a certificate and a key (or let main make a pair)")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


def ensure_pair(cert: str | None, key: str | None, hosts: list[str]) -> tuple[str, str, bool]:
    """The given cert/key files, or a fresh self-signed pair in a temp dir; True when self-signed."""
    if cert and key:
        return cert, key, False
    cert_path, key_path = self_signed(hosts, Path(tempfile.mkdtemp(prefix="ftjob-progress-tls-")))
    return str(cert_path), str(key_path), True
