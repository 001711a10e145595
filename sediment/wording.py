"""Counts as a reader says them: ``1 batch``, ``2 batches``, never ``1 batches``.

Every line the command line, ``sediment verify`` and the logs print with a count goes
through :func:`counted`, so the grammar is decided once instead of at each f-string.
"""

from __future__ import annotations


def plural(noun: str) -> str:
    """The plural of one of the nouns sediment counts (batch, row, record, relation, ...)."""
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    return noun + "s"


def counted(n: int, noun: str, many: str | None = None) -> str:
    """``n`` followed by ``noun``, singular for exactly one (``many``: an irregular plural)."""
    return f"{n} {noun if n == 1 else (many or plural(noun))}"
