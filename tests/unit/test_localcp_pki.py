"""The local control plane's PKI: one Kueue serving pair per machine, a client CA per run.

Kueue reads its metrics and visibility certificates from fixed paths, so every control plane on
a machine serves the same files; these tests pin that two runs agree on that pair (and so cannot
swap it under each other) while keeping their own CA for client authentication."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography import x509
from localcp.pki import ensure_pki, write_atomic

REPO = Path(__file__).resolve().parents[2]


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_two_runs_share_the_serving_pair_and_keep_their_own_ca(tmp_path: Path) -> None:
    serving = tmp_path / "serving"
    a, b = tmp_path / "run-a", tmp_path / "run-b"
    ensure_pki(a, serving)
    ensure_pki(b, serving)
    for name in ("webhook.crt", "webhook.key", "serving-ca.crt"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / "ca.crt").read_bytes() != (b / "ca.crt").read_bytes()
    webhook, serving_ca = _cert(a / "webhook.crt"), _cert(a / "serving-ca.crt")
    webhook.verify_directly_issued_by(serving_ca)  # raises if the serving CA did not sign it
    sans = webhook.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "kueue-visibility-server.kueue-system.svc" in sans.get_values_for_type(x509.DNSName)
    _cert(a / "admin.crt").verify_directly_issued_by(_cert(a / "ca.crt"))
    assert oct((a / "webhook.key").stat().st_mode & 0o777) == "0o600"


def test_a_run_made_before_the_shared_pair_gets_it_without_a_new_ca(tmp_path: Path) -> None:
    run = tmp_path / "run"
    ensure_pki(run, tmp_path / "one")
    ca = (run / "ca.crt").read_bytes()
    ensure_pki(run, tmp_path / "two")  # e.g. the serving pair was made anew
    assert (run / "ca.crt").read_bytes() == ca
    assert (run / "webhook.crt").read_bytes() == (tmp_path / "two" / "webhook.crt").read_bytes()


def test_write_atomic_leaves_an_unchanged_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "tls.crt"
    write_atomic(path, b"one")
    os.utime(path, (1, 1))
    write_atomic(path, b"one")
    assert path.stat().st_mtime == 1  # same content: not rewritten (no reload in Kueue)
    write_atomic(path, b"two", 0o600)
    assert path.read_bytes() == b"two" and oct(path.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in tmp_path.iterdir()] == ["tls.crt"]  # no temporary file left
