"""What ``sediment.connect`` accepts: its keyword options, checked before anything connects.

Kept apart from :mod:`sediment.client` so that the check needs no Arrow Flight import."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sediment import errors

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
