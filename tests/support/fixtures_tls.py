"""A self-signed certificate for 127.0.0.1 (``certificate``), made once per module, for the tests
of TLS between clients and a served coordinator."""

from __future__ import annotations

import datetime
import ipaddress

import pytest


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[bytes, bytes, str, str]:
    """A self-signed certificate for 127.0.0.1: (cert PEM, key PEM, cert file, key file)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    d = tmp_path_factory.mktemp("tls")
    (d / "cert.pem").write_bytes(cert_pem)
    (d / "key.pem").write_bytes(key_pem)
    return cert_pem, key_pem, str(d / "cert.pem"), str(d / "key.pem")
