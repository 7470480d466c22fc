"""Dev PKI for the local control plane.

Every certificate carries keyUsage, Subject/Authority Key Identifiers and (for servers) a SAN of
127.0.0.1/localhost, so that Python 3.13's ``VERIFY_X509_STRICT`` (kr8s, kubernetes client,
httpx) accepts it. Adapted from the checked generator in shared/docs/local-control-plane.md §5.3.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CertAndKey = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]
VISIBILITY_SERVICE = "kueue-visibility-server"


def _key_usage(ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True, key_cert_sign=ca, crl_sign=ca, content_commitment=False,
        key_encipherment=False, data_encipherment=False, key_agreement=False,
        encipher_only=False, decipher_only=False,
    )


def issue(
    cn: str,
    org: str | None = None,
    ca: CertAndKey | None = None,
    eku: tuple[x509.ObjectIdentifier, ...] = (),
    sans: tuple[x509.GeneralName, ...] = (),
) -> CertAndKey:
    """Issue a certificate (self-signed CA when ``ca`` is None)."""
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    subject = x509.Name(attrs)
    issuer_name, signer = (ca[0].subject, ca[1]) if ca else (subject, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=ca is None, path_length=None), critical=True)
        .add_extension(_key_usage(ca is None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False
        )
    )
    if eku:
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(eku)), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(signer, hashes.SHA256()), key


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` in one step, so a process reading it (Kueue's certificate watchers)
    never sees half a file; no write at all when the content is already there."""
    if path.exists() and path.read_bytes() == data:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    os.replace(tmp, path)


def _save(directory: Path, stem: str, pair: CertAndKey) -> None:
    cert, key = pair
    write_atomic(directory / f"{stem}.crt", cert.public_bytes(ser.Encoding.PEM))
    write_atomic(directory / f"{stem}.key",
                 key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()),
                 0o600)


SERVING_FILES = ("serving-ca.crt", "webhook.crt", "webhook.key")


def ensure_serving_pki(directory: Path) -> None:
    """The machine-wide serving pair of Kueue's webhook, metrics and visibility servers, and the
    CA that signed it (``serving-ca``), created once under a lock.

    Kueue v0.19 reads its metrics and visibility certificates from fixed paths
    (``/etc/kueue/metrics/certs``, ``/visibility``) and reloads them when they change, so every
    local control plane on a machine serves the same files. With one pair for all of them,
    starting a second control plane no longer swaps the first one's visibility certificate
    (which broke its API discovery and hung namespace deletion). Client authentication keeps a
    CA per run (``ensure_pki``)."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all((directory / f).exists() for f in SERVING_FILES):
            return
        local = (x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost"))
        ca = issue("m2g-dev-kueue-serving-ca")
        # The aggregator verifies an APIService backend as <service>.<namespace>.svc.
        sans = (*local, x509.DNSName(f"{VISIBILITY_SERVICE}.kueue-system.svc"))
        _save(directory, "webhook", issue("kueue-webhook", ca=ca, eku=(
            ExtendedKeyUsageOID.SERVER_AUTH,), sans=sans))
        write_atomic(directory / "serving-ca.crt", ca[0].public_bytes(ser.Encoding.PEM))


def ensure_pki(directory: Path, serving: Path) -> None:
    """Create the run's PKI in ``directory`` unless it is already complete, and copy the
    machine-wide serving pair from ``serving`` (see ``ensure_serving_pki``) into it.

    Files: ca, apiserver, admin (CN=admin, O=system:masters), front-proxy-client (the
    aggregator's client) as ``.crt``/``.key``; ``sa.key``/``sa.pub`` for service-account tokens;
    ``serving-ca.crt`` and ``webhook.crt``/``.key`` (Kueue's webhook, metrics and visibility
    servers).
    """
    ensure_serving_pki(serving)
    directory.mkdir(parents=True, exist_ok=True)
    for name in SERVING_FILES:
        write_atomic(directory / name, (serving / name).read_bytes(),
                     0o600 if name.endswith(".key") else 0o644)
    wanted = ["ca", "apiserver", "admin", "front-proxy-client"]
    if all((directory / f"{s}.crt").exists() for s in wanted) and (directory / "sa.pub").exists():
        return
    local = (x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost"))
    ca = issue("m2g-dev-ca")
    _save(directory, "ca", ca)
    server = (ExtendedKeyUsageOID.SERVER_AUTH,)
    _save(directory, "apiserver", issue("kube-apiserver", ca=ca, eku=server, sans=local))
    client = (ExtendedKeyUsageOID.CLIENT_AUTH,)
    _save(directory, "admin", issue("admin", org="system:masters", ca=ca, eku=client))
    # kube-apiserver's client certificate towards aggregated APIs (Kueue's visibility API)
    _save(directory, "front-proxy-client", issue("front-proxy-client", ca=ca, eku=client))
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (directory / "sa.key").write_bytes(
        sa.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    )
    (directory / "sa.pub").write_bytes(
        sa.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
    )
