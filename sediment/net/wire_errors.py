"""Typed errors across the wire: the server packs an exception into a Flight error's
``extra_info``; the client rebuilds the same class from :mod:`sediment.errors` (or a
builtin ValueError/TypeError/...) with the same message and attributes.

Both halves live here so that what one writes the other reads, without the client
importing the server.
"""

from __future__ import annotations

import builtins
import json
from typing import Any

import pyarrow.flight as flight

from sediment import errors
from sediment.errors import SedimentError, ServerError
from sediment.net.protocol import BUILTIN_ERRORS, tuples


def error_detail(exc: BaseException) -> bytes:
    """The JSON that lets the client re-raise ``exc`` as its own class with its own message
    (and attributes such as WalCorruption's path and offset), not as a generic Flight error."""
    cls = type(exc)
    if isinstance(exc, SedimentError) and getattr(errors, cls.__name__, None) is cls:
        module = "sediment.errors"
    elif cls.__module__ == "builtins" and cls.__name__ in BUILTIN_ERRORS:
        module = "builtins"
    else:
        module = ""
    attrs = {}
    for key, value in vars(exc).items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue  # not representable: the message still says it
        attrs[key] = value
    detail = {"error": cls.__name__, "module": module, "message": shortened(str(exc), MESSAGE_CHARS), "attrs": attrs}
    out = json.dumps(detail).encode()
    if len(out) > DETAIL_BYTES:  # attributes too large for the trailers: the message still says it
        detail["attrs"] = {}
        out = json.dumps(detail).encode()
    return out


# gRPC refuses trailers past 16 KiB (the status message and the detail travel there), and the
# call then fails with a transport error in place of the server's: both are kept well below.
MESSAGE_CHARS = 2000
DETAIL_BYTES = 10 * 1024


def shortened(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def to_flight_error(exc: BaseException) -> flight.FlightError:
    """``exc`` as the Flight error the client maps back (authentication errors pass as they are)."""
    if isinstance(exc, flight.FlightError):
        return exc
    return flight.FlightServerError(shortened(f"{type(exc).__name__}: {exc}", 200), extra_info=error_detail(exc))


def error_from_detail(detail: object) -> BaseException | None:
    """The exception :func:`error_detail` described, or None when ``detail`` is not one."""
    if not isinstance(detail, dict) or "error" not in detail:
        return None
    name, module, message = str(detail["error"]), detail.get("module"), str(detail.get("message", ""))
    cls: Any = None
    if module == "sediment.errors":
        cls = getattr(errors, name, None)
    elif module == "builtins" and name in BUILTIN_ERRORS:
        cls = getattr(builtins, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        return ServerError(f"the server failed: {name}: {message}")
    typed = cls.__new__(cls)
    Exception.__init__(typed, message)
    attrs = detail.get("attrs")
    if isinstance(attrs, dict):
        typed.__dict__.update({key: tuples(value) for key, value in attrs.items()})
    return typed


def server_error(exc: flight.FlightError) -> BaseException | None:
    """The error the server raised, rebuilt from the Flight error's detail; None when the
    error carries none (the transport's own: a broken connection, a deadline)."""
    try:
        detail = json.loads(exc.extra_info.decode("utf-8")) if exc.extra_info else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        detail = None
    return error_from_detail(detail)


def typed_error(exc: flight.FlightError) -> BaseException:
    """The error the server raised, rebuilt from the Flight error's detail. Flight errors
    without that detail (authentication, an unreachable server, a cancelled call, an
    internal transport failure) become sediment's transport errors."""
    typed = server_error(exc)
    return typed if typed is not None else transport_error(exc)


def error_line(exc: BaseException) -> str:
    """The first line of an error's message, or its type's name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def transport_error(exc: flight.FlightError) -> BaseException:
    """Flight's own errors (no sediment detail) as sediment's: one line, typed, and saying by
    their class whether the call may have been carried out (OutcomeUnknown: cancelled, an
    internal or unknown transport failure) or not (NothingWritten: refused before it ran)."""
    first = error_line(exc)
    if isinstance(exc, flight.FlightUnauthenticatedError):
        return errors.AuthenticationFailed(f"the coordinator refused the token ({first}); pass its token with "
                                           "--token or $SEDIMENT_TOKEN")
    if isinstance(exc, flight.FlightTimedOutError):
        return errors.CallTimedOut(f"the coordinator did not answer within the call's deadline ({first}): the call "
                                   "may or may not have been carried out; read back before writing again")
    if isinstance(exc, flight.FlightUnavailableError) and "certificate verify failed" in first:
        return errors.CoordinatorUnavailable(f"the coordinator's TLS certificate is not one this client trusts "
                                             f"({first}); give the CA that signed it: --tls-root-certs FILE, or "
                                             "sediment.connect(..., tls_root_certs=FILE)")
    if isinstance(exc, flight.FlightUnavailableError):
        return errors.CoordinatorUnavailable(f"no coordinator answered ({first}); is `sediment serve` running "
                                             "there, on that port, with the same TLS setting?")
    if isinstance(exc, flight.FlightCancelledError):
        return errors.CallCancelled(f"the call was cancelled before its answer came ({first}): it may or may not "
                                    "have been carried out; read back before writing again")
    if isinstance(exc, flight.FlightUnauthorizedError):
        return errors.CallRefused(f"the coordinator's transport refused the call ({first}); nothing was done")
    return errors.TransportFailed(f"the transport failed during the call ({type(exc).__name__}: {first}): it may "
                                  "or may not have been carried out; read back before writing again")
