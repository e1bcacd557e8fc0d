"""The progress endpoint's TLS: the given cert/key files, or a self-signed pair made at startup.

A self-signed certificate is enough because the trainer pins it through FTJOB_PROGRESS_CA_FILE
when the chart mounts one; otherwise the channel is still encrypted, and authentication is the
bearer token, not the certificate. A self-signed pair is never a file on any filesystem: it lives in memory
files (`memfd`; this process opens them as `/proc/self/fd/N`) that vanish with the process however it ends,
SIGKILL included, so no key is left behind in a temp directory; without memfd it goes to a temp directory
removed at exit.
"""

import atexit
import datetime
import ipaddress
import os
import shutil
import ssl
import tempfile
from pathlib import Path

VALID_DAYS = 365


def self_signed(hosts: list[str], directory: Path) -> tuple[Path, Path]:
    """Write cert.pem and key.pem for `hosts` (DNS names or IPs) into `directory`."""
    cert_pem, key_pem = self_signed_pem(hosts)
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert_pem)
    key_path.touch(mode=0o600)
    key_path.chmod(0o600)  # before the key is in it
    key_path.write_bytes(key_pem)
    return cert_path, key_path


def self_signed_pem(hosts: list[str]) -> tuple[bytes, bytes]:
    """A self-signed certificate for `hosts` and its private key, PEM-encoded."""
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
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def server_context(cert: str | None, key: str | None) -> ssl.SSLContext:
    """An SSL context serving the given certificate files."""
    if not (cert and key):
        raise ValueError("the progress endpoint needs a certificate and a key (or let main make a pair)")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


def ensure_pair(cert: str | None, key: str | None, hosts: list[str]) -> tuple[str, str, bool]:
    """The given cert/key files, or a fresh self-signed pair in memory files; True when self-signed."""
    if cert and key:
        return cert, key, False
    if hasattr(os, "memfd_create") and Path("/proc/self/fd").is_dir():
        cert_pem, key_pem = self_signed_pem(hosts)
        return _memory_file("progress-cert", cert_pem), _memory_file("progress-key", key_pem), True
    directory = tempfile.mkdtemp(prefix="ftjob-progress-tls-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    cert_path, key_path = self_signed(hosts, Path(directory))
    return str(cert_path), str(key_path), True


def _memory_file(name: str, data: bytes) -> str:
    """A path to `data` that exists only in this process's memory (the fd stays open for its lifetime and is
    closed on exec, so no child inherits it)."""
    fd = os.memfd_create(name)
    os.write(fd, data)
    return f"/proc/self/fd/{fd}"
