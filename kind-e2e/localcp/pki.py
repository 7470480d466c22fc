"""Dev PKI for the local control plane.

Every certificate carries keyUsage, Subject/Authority Key Identifiers and (for servers) a SAN of
127.0.0.1/localhost, so that Python 3.13's ``VERIFY_X509_STRICT`` (kr8s, kubernetes client,
httpx) accepts it. Adapted from the checked generator in shared/docs/local-control-plane.md §5.3.
"""

from __future__ import annotations

import datetime
import ipaddress
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


def _save(directory: Path, stem: str, pair: CertAndKey) -> None:
    cert, key = pair
    (directory / f"{stem}.crt").write_bytes(cert.public_bytes(ser.Encoding.PEM))
    key_path = directory / f"{stem}.key"
    key_path.write_bytes(
        key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    )
    key_path.chmod(0o600)


def ensure_pki(directory: Path) -> None:
    """Create the PKI in ``directory`` unless it is already complete.

    Files: ca, apiserver, webhook (Kueue's webhook, metrics and visibility servers), admin
    (CN=admin, O=system:masters), front-proxy-client (the aggregator's client) as
    ``.crt``/``.key``; ``sa.key``/``sa.pub`` for service-account tokens.
    """
    wanted = ["ca", "apiserver", "webhook", "admin", "front-proxy-client"]
    if all((directory / f"{s}.crt").exists() for s in wanted) and (directory / "sa.pub").exists():
        return
    directory.mkdir(parents=True, exist_ok=True)
    local = (x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost"))
    ca = issue("m2g-dev-ca")
    _save(directory, "ca", ca)
    server = (ExtendedKeyUsageOID.SERVER_AUTH,)
    _save(directory, "apiserver", issue("kube-apiserver", ca=ca, eku=server, sans=local))
    # The aggregator verifies an APIService backend as <service>.<namespace>.svc.
    visibility = (*local, x509.DNSName(f"{VISIBILITY_SERVICE}.kueue-system.svc"))
    _save(directory, "webhook", issue("kueue-webhook", ca=ca, eku=server, sans=visibility))
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
