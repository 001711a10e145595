"""Checking a server's TLS certificate and key before gRPC sees them.

gRPC reports a bad pair only as "Server did not start properly" after several lines of its
own logging, which reads like a port conflict; these checks name the file that is wrong
instead, and run before anything is opened or bound.
"""

from __future__ import annotations

import re
import ssl

from sediment.errors import InvalidArgument

_BEGIN = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----")


def pem_kinds(pem: bytes | str) -> set[str]:
    """The kinds of PEM blocks in ``pem``: ``CERTIFICATE``, ``PRIVATE KEY``, ..."""
    return {m.decode() for m in _BEGIN.findall(pem.encode() if isinstance(pem, str) else pem)}


def _has_key(kinds: set[str]) -> bool:
    return any(k.endswith("PRIVATE KEY") for k in kinds)


def check_tls_pem(cert: bytes | str, key: bytes | str, cert_name: str = "the certificate",
                  key_name: str = "the key") -> None:
    """Raise InvalidArgument unless ``cert`` holds a PEM certificate and ``key`` an unencrypted
    PEM private key; ``cert_name`` and ``key_name`` say where each came from."""
    cert_kinds, key_kinds = pem_kinds(cert), pem_kinds(key)
    if "CERTIFICATE" not in cert_kinds and _has_key(cert_kinds) and "CERTIFICATE" in key_kinds:
        raise InvalidArgument(f"{cert_name} holds a private key and {key_name} a certificate: the two are swapped; "
                              "give the certificate as the certificate and the key as the key")
    if "CERTIFICATE" not in cert_kinds:
        raise InvalidArgument(f"{cert_name} holds no PEM certificate (-----BEGIN CERTIFICATE-----, found "
                              f"{', '.join(sorted(cert_kinds)) or 'none'}); give the server's certificate chain")
    if not _has_key(key_kinds):
        raise InvalidArgument(f"{key_name} holds no PEM private key (-----BEGIN PRIVATE KEY-----, found "
                              f"{', '.join(sorted(key_kinds)) or 'none'}); give the certificate's private key")
    key_head = (key.encode() if isinstance(key, str) else key).split(b"-----END", 1)[0]
    if "ENCRYPTED PRIVATE KEY" in key_kinds or b"ENCRYPTED" in key_head:
        raise InvalidArgument(f"{key_name} is encrypted with a passphrase, which the server cannot ask for; "
                              "give the key unencrypted (openssl pkey -in KEY -out KEY.pem)")


def check_tls_files(cert_path: str, key_path: str, cert_name: str, key_name: str) -> tuple[bytes, bytes]:
    """The (certificate, key) PEM of two files, checked: each of the right kind (see
    :func:`check_tls_pem`), and the key the certificate's (loaded with :mod:`ssl`)."""
    cert, key = (_read_pem(path, name) for path, name in ((cert_path, cert_name), (key_path, key_name)))
    check_tls_pem(cert, key, cert_name, key_name)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_path, key_path, password=lambda: b"")
    except ssl.SSLError as exc:
        raise InvalidArgument(f"{key_name} is not the private key of {cert_name} ({exc.reason or exc}), or one of "
                              "them is damaged; give the key the certificate was made for") from None
    return cert, key


def _read_pem(path: str, name: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise InvalidArgument(f"{name}: cannot read it ({exc.strerror or exc}); give a readable PEM file") from None
