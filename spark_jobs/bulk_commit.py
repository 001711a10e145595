"""The driver's commit of a bulk load when the coordinator's answer is lost.

Why: the coordinator records a load's job name in the same compare-and-set that commits it
(engine/staged.py), so committing the same job again changes nothing. A commit whose reply
was lost (a reset connection, a coordinator that could not tell whether its metadata write
landed) may have committed: aborting then would leave the rows visible and report a
failure, and writing the frame again (under a new job name) would add every row twice. So
the driver asks again with the same job; only a typed refusal (``NothingWritten``) says
nothing was committed, and only then are the staged files aborted. A refusal of a retry
says so too: the coordinator looks for the job among its committed loads before any check
that refuses. Not a member's refusal to serve the relation (``NotPartitionOwner``), which
comes before that look: after a lost reply it leaves the outcome unknown.
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow.flight as flight

from sediment.errors import NothingWritten, NotPartitionOwner, OutcomeUnknown, SedimentError

COMMIT_ATTEMPTS = 4
FIRST_PAUSE = 0.5  # seconds before the first retry; doubled before each next one


def abort_load(client: Any, relation: str, job: str) -> None:
    """Delete the load's staged files; a failure to do so is left to the coordinator's next open,
    which collects every staging directory (the failure the caller reports matters more)."""
    try:
        client.bulk_abort(relation, job)
    except (SedimentError, flight.FlightError, OSError):
        pass


def commit_load(client: Any, relation: str, job: str, *, time_: int | None, diff: int | None,
                attempts: int = COMMIT_ATTEMPTS, pause: float = FIRST_PAUSE) -> dict[str, Any]:
    """Commit load ``job`` (the coordinator's ``bulk_commit`` reply), asking again with the same
    job while the outcome is unknown. A typed refusal aborts the load and is raised; an
    outcome still unknown after ``attempts`` raises OutcomeUnknown naming the job, with the
    staged files left in place. A retry that finds the load committed by an earlier attempt
    returns ``committed: False`` with the rows and times the first commit kept."""
    last: BaseException | None = None
    for attempt in range(attempts):
        if attempt:
            time.sleep(pause * 2 ** (attempt - 1))
        try:
            return client.bulk_commit(relation, job, time=time_, diff=diff)
        except NothingWritten as e:
            if attempt and isinstance(e, NotPartitionOwner):
                last = e
                break
            abort_load(client, relation, job)
            raise
        except (SedimentError, flight.FlightError, OSError) as e:  # the reply lost, or the coordinator unsure
            last = e
    raise OutcomeUnknown(f"bulk load {job!r} of relation {relation!r}: the commit's outcome is unknown after "
                         f"{attempt + 1} attempts ({type(last).__name__}: {str(last).splitlines()[0] if str(last) else ''}); "
                         f"commit it again with Client.bulk_commit({relation!r}, {job!r}), which commits a load at most "
                         "once, before writing the frame again") from last
