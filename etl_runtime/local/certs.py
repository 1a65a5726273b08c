"""``sluice up --tls``: a local CA and a certificate per server, under ``DIR/tls/``.

* ``ca.crt`` / ``ca.key``: made once and kept (clients keep trusting the same
  ``ca.crt`` across restarts); ECDSA P-256, 10 years.
* ``NAME.crt`` / ``NAME.key`` for every server (``gateway``, ``t0``, ...,
  ``transformer``): signed by that CA, for ``127.0.0.1``, ``localhost``,
  ``::1`` and the ``--host`` address when it is another; made again when
  missing, when the CA changed, or within 30 days of its end.

Private keys are written mode 0600 (the transformers' key belongs to the
user ETL code runs as: ``sluice up`` hands it over). Made with the
``cryptography`` package, no hand-written ASN.1.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
LEAF_DAYS = 825
RENEW_DAYS = 30
DEFAULT_NAMES = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Pair:
    """A certificate and its key (PEM paths)."""

    cert: Path
    key: Path


def _write(path: Path, data: bytes, private: bool) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o600 if private else 0o644)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def make_ca(directory: Path) -> Pair:
    """``ca.crt``/``ca.key`` in ``directory``, made unless both are there."""
    directory.mkdir(parents=True, exist_ok=True)
    pair = Pair(directory / "ca.crt", directory / "ca.key")
    if pair.cert.is_file() and pair.key.is_file():
        return pair
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Sluice local CA")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(pair.key, _key_pem(key), private=True)
    _write(pair.cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return pair


def _alt_names(names: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for n in dict.fromkeys(names):
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            out.append(x509.DNSName(n))
    return out


def _fresh(pair: Pair, ca_cert: x509.Certificate, names: list[str]) -> bool:
    if not (pair.cert.is_file() and pair.key.is_file()):
        return False
    try:
        cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    left = cert.not_valid_after_utc - _now()
    return (
        cert.issuer == ca_cert.subject
        and cert.signature_hash_algorithm is not None
        and left > datetime.timedelta(days=RENEW_DAYS)
        and set(sans) >= set(_alt_names(names))
        and _signed_by(cert, ca_cert)
    )


def _signed_by(cert: x509.Certificate, ca_cert: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def make_cert(directory: Path, name: str, ca: Pair, hosts: Iterable[str] = ()) -> Pair:
    """``NAME.crt``/``NAME.key`` signed by ``ca`` for the loopback names and ``hosts``."""
    names = [*DEFAULT_NAMES, *[h for h in hosts if h and h not in ("0.0.0.0", "::")]]
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    if _fresh(pair, ca_cert, names):
        return pair
    loaded = serialization.load_pem_private_key(ca.key.read_bytes(), None)
    assert isinstance(loaded, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"sluice {name}")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
        .add_extension(x509.SubjectAlternativeName(_alt_names(names)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(loaded.public_key()), critical=False
        )
        .sign(loaded, hashes.SHA256())
    )
    _write(pair.key, _key_pem(key), private=True)
    _write(pair.cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return pair
