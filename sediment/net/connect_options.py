"""What ``sediment.connect`` accepts: the server's address, its keyword options and the CA of
a TLS server, checked before anything connects.

Kept apart from :mod:`sediment.client` so that the checks need no Arrow Flight import."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sediment import errors
from sediment.net.tls import pem_kinds

CONNECT_OPTIONS = {
    "timeout": "seconds each call may take",
    "tls_root_certs": "PEM bytes or a file name of the CA for grpc+tls://",
    "deadline": "a cluster's: seconds a call keeps following redirects, retries included",
}


def check_connect_options(uri: object, options: Mapping[str, Any]) -> None:
    """InvalidArgument naming each keyword ``sediment.connect`` does not take, and the ones it does."""
    unknown = sorted(set(options) - set(CONNECT_OPTIONS))
    if unknown:
        known = "; ".join(f"{k} ({what})" for k, what in CONNECT_OPTIONS.items())
        raise errors.InvalidArgument(f"unknown option(s) {unknown} for sediment.connect({uri!r}); nothing was "
                                     f"connected. Known options: {known}")


_SCHEMES = ("grpc://", "grpc+tcp://", "grpc+tls://")


def server_location(uri: str) -> str:
    """The Flight location of a server address: ``grpc://HOST:PORT`` or ``grpc+tls://HOST:PORT``
    as given, and a bare ``HOST:PORT`` (``[v6]:PORT``) read as ``grpc://HOST:PORT``, since that
    is how people write an address and plain gRPC is what ``sediment serve`` listens with
    unless it has a certificate."""
    if not isinstance(uri, str):
        raise errors.InvalidArgument(f"a server address is a string such as grpc://127.0.0.1:8815, not "
                                     f"{type(uri).__name__}")
    scheme = next((s for s in _SCHEMES if uri.startswith(s)), None)
    address = uri.removeprefix(scheme) if scheme else uri
    host, sep, port = address.rpartition(":")
    if ("://" in address or "/" in address or any(c.isspace() for c in address) or not sep or not host
            or not port.isdigit() or not 0 < int(port) <= 65535):
        raise errors.InvalidArgument(f"cannot read {uri!r} as a sediment server's address: give "
                                     "grpc://HOST:PORT, grpc+tls://HOST:PORT (a server with --tls-cert) or HOST:PORT "
                                     "with a port in 1..65535")
    return uri if scheme else "grpc://" + uri


def read_ca_file(path: str) -> bytes:
    """The PEM of ``tls_root_certs`` given as a file name, checked by :func:`check_ca_pem`."""
    try:
        with open(path, "rb") as f:
            return check_ca_pem(f.read(), f"the CA file {path!r}")
    except OSError as exc:
        raise errors.InvalidArgument(f"tls_root_certs: cannot read the CA file {path!r} ({exc.strerror or exc}); "
                                     "give the PEM file of the CA that signed the server's certificate, or its "
                                     "PEM bytes") from None


def check_ca_pem(pem: bytes, what: str = "the PEM bytes") -> bytes:
    """``pem`` if it holds a PEM certificate. gRPC given anything else (a private key, a
    DER file) logs several lines of its own and fails each call with "empty address
    list", which reads as a network fault."""
    kinds = pem_kinds(pem)
    if "CERTIFICATE" not in kinds:
        raise errors.InvalidArgument(f"tls_root_certs: {what} holds no PEM certificate (-----BEGIN CERTIFICATE-----, "
                                     f"found {', '.join(sorted(kinds)) or 'none'}); give the certificate of the CA "
                                     "that signed the server's (a self-signed server's own certificate), not a key")
    return pem
