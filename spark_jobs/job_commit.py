"""The commit of a Spark job's transactions (a batch write's, a stream micro-batch's) when the
coordinator's answer is lost.

Why: ``commit_all`` writes one COMMIT record; the coordinator may make it durable and then
lose the connection, or die, before it answers. Reporting that as a plain failure ("no
coordinator answered") tells the user nothing was written, and writing the frame again
would add every row twice. So the driver asks the coordinator what became of the job's
transactions (``txn_state``): all committed is the job's success; all still open means the
commit never arrived, and it is sent again; all aborted means nothing is visible. A
coordinator that restarted since no longer knows (``unknown``): the outcome is then
reported as unknown (``OutcomeUnknown``), naming the job, rather than as a failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow.flight as flight

from sediment.errors import (
    FrontierRegression,
    NothingWritten,
    OutcomeUnknown,
    SedimentError,
    TransactionError,
)
from sediment.txn_state import ABORTED, COMMITTED, OPEN

COMMIT_ATTEMPTS = 4
FIRST_PAUSE = 0.5  # seconds before the first question after a lost answer; doubled each time


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def commit_job(connect: Callable[[], Any], txns: Sequence[int], *, group: str | None, relation: str,
               job: str | None = None, attempts: int = COMMIT_ATTEMPTS, pause: float = FIRST_PAUSE) -> None:
    """``commit_all(txns, group=group)`` through a client from ``connect()``, settled even
    when its answer is lost (see the module docstring); ``job`` names it in errors (default:
    the group). Raises the coordinator's refusal
    (TransactionError: nothing is visible), or OutcomeUnknown when it cannot tell."""
    ids = [int(t) for t in txns]
    job = job or group or "spark job"
    lost: BaseException | None = None
    for attempt in range(attempts):
        if attempt:
            time.sleep(pause * 2 ** (attempt - 1))
        verdict: SedimentError | None = None
        try:
            with connect() as client:
                states = [] if lost is None else [client.txn_state(t) for t in ids]
                if lost is None or all(s == OPEN for s in states):
                    client.commit_all(ids, group=group)  # first, or again: it never arrived
                    return
                if all(s == COMMITTED for s in states):
                    return  # the lost answer was a success
                verdict = _settled(job, relation, ids, states, lost)
        except NothingWritten:
            raise
        except TransactionError as exc:
            if lost is None:
                raise  # refused: nothing of the job is visible
            lost = exc  # a resent commit refused: the first may have landed meanwhile; ask again
        except (SedimentError, flight.FlightError, OSError) as exc:  # the answer lost, or no coordinator
            lost = exc
        if verdict is not None:
            raise verdict
    raise OutcomeUnknown(f"job {job!r}: the commit into relation {relation!r} got no answer after {attempts} "
                         f"attempts ({_line(lost) if lost else ''}): the rows may or may not be visible; read the "
                         "relation to find out before writing again")


def _settled(job: str, relation: str, ids: list[int], states: list[str], lost: BaseException) -> SedimentError:
    """The error for a job whose transactions are not all committed nor all open."""
    if all(s == ABORTED for s in states):
        return TransactionError(f"job {job!r}: the commit into relation {relation!r} lost its answer "
                                f"({_line(lost)}) and the coordinator aborted its transactions: nothing of this job "
                                "is visible; write it again")
    return OutcomeUnknown(f"job {job!r}: the commit of transactions {[hex(t) for t in ids]} into relation "
                          f"{relation!r} lost its answer ({_line(lost)}) and the coordinator no longer knows them "
                          f"(states {sorted(set(states))}: it restarted since): the rows may or may not be visible; "
                          "read the relation to find out before writing again")


def seal_through(client: Any, relation: str, t: int) -> None:
    """Seal ``relation`` at ``t`` after a job committed there, unless it is sealed that far
    already. Why: another job may seal past ``t`` between the check and the seal; its
    FrontierRegression would report this job, whose rows are visible, as failed."""
    if t <= client.sealed(relation):
        return
    try:
        client.seal(relation, t)
    except FrontierRegression:
        if client.sealed(relation) < t:
            raise
