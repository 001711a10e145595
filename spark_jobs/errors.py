"""Sediment's one-line error as the exception a Spark user sees.

A data source's failure reaches the driver wrapped by Spark (an AnalysisException around a
Python traceback, or a Py4J error around a Java stack around a Python traceback). The line
that matters is the last ``sediment.errors.Name: message`` line of that text; this module
finds it and raises the typed error again, with Spark's text kept as its cause.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import sediment.errors as errors

_LINE = re.compile(r"(?:^|\s)(?:sediment\.errors\.)?([A-Z]\w*): (.+?)(?:\s+SQLSTATE: \w+)?\s*$")
T = TypeVar("T")


def sediment_error(exc: BaseException) -> errors.SedimentError | None:
    """The typed sediment error a Spark exception carries, or None."""
    if isinstance(exc, errors.SedimentError):
        return exc
    found: errors.SedimentError | None = None
    for line in "\n".join(_texts(exc)).splitlines():
        m = _LINE.search(line.strip())
        if m is None:
            continue
        cls = getattr(errors, m.group(1), None)
        if isinstance(cls, type) and issubclass(cls, errors.SedimentError):
            try:
                found = cls(m.group(2).strip())
            except TypeError:
                continue
    return found


def _texts(exc: BaseException) -> list[str]:
    """The exception's text, then its causes' (outermost first). A streaming query's failure
    (``StreamingQueryException``) says only "Writing job failed": the task's or commit's
    Python traceback is in the cause PySpark keeps (``_cause``), not in its text."""
    texts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(texts) < 16:
        seen.add(id(current))
        texts.append(str(current))
        current = getattr(current, "_cause", None) or current.__cause__
    return texts


@contextmanager
def sediment_errors() -> Iterator[None]:
    """Re-raise a Spark failure that a sediment error caused as that error (one line)."""
    try:
        yield
    except errors.SedimentError:
        raise
    except Exception as exc:
        typed = sediment_error(exc)
        if typed is None:
            raise
        raise typed from exc


def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` inside :func:`sediment_errors` (``df.collect`` and the like)."""
    with sediment_errors():
        return fn(*args, **kwargs)


def short_traceback(method: Callable[..., T]) -> Callable[..., T]:
    """Spark shows a planning worker's exception with its traceback; a sediment error needs
    none (its message says what and where), so it leaves with one frame."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return method(*args, **kwargs)
        except errors.SedimentError as e:
            raise e.with_traceback(None) from None

    return wrapper
