"""Settling what ran: each outcome written only while its claim still holds the row (the
compare-and-swap on the claim), with its result, the chain steps it cancels, its batch part
and the dead letters it makes."""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    bindparam,
    case,
    delete,
    func,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.engine import Connection

from celery_ratchet.domain.batch import BatchPart
from celery_ratchet.domain.job import JobStatus, Settlement
from celery_ratchet.store import dlq_alerts
from celery_ratchet.store.database import CONFLICT_RETRIES, Database
from celery_ratchet.store.db_clock import db_now
from celery_ratchet.store.dialect import Dialect
from celery_ratchet.store.engine import (
    transaction,
)
from celery_ratchet.store.job_rows import (
    CANCELS_DOWNSTREAM,
    CLEARED_CLAIM,
    claim_held,
    group_by_outcome,
    job,
    settled_values,
    storable,
)
from celery_ratchet.store.packets import refuse_oversized
from celery_ratchet.store.raw import RawStatement, execute_on, fetch_on, raw_statement
from celery_ratchet.store.schema import (
    UTCDateTime,
    scheduler_resource_permit,
)
from celery_ratchet.store.step_rows import (
    cancel_downstream,
    record_ended_parts,
    record_part,
)

logger = logging.getLogger(__name__)


class Settle:
    """Settling what ran: the compare-and-swap on the claim. ``dlq_alert_task``: with one,
    each job failing for good is counted into its task name's alert window, in the
    transaction that fails it."""

    def __init__(self, db: Database, dialect: Dialect, *, dlq_alert_task: str | None) -> None:
        self.db = db
        self.dialect = dialect
        self.dlq_alert_task = dlq_alert_task
        owned = claim_held(bindparam("p_job_id"), bindparam("p_token"))
        finished = {"status": bindparam("p_status"), "finished_at": db_now()}
        self._store_outcome = (
            update(job)
            .where(*owned)
            .values(
                **finished,
                job_result=bindparam("p_job_result"),
                result_type=bindparam("p_result_type"),
                result_meta=bindparam("p_result_meta"),
                last_error=bindparam("p_error"),
                error_traceback=bindparam("p_traceback"),
            )
        )
        handed_back = bindparam("p_status") == JobStatus.PENDING.value
        cleared = {k: case((handed_back, None), else_=job.c[k]) for k in CLEARED_CLAIM}
        self._settle_one = (
            update(job)
            .where(*owned)
            .values(
                status=bindparam("p_status"),
                finished_at=case((handed_back, None), else_=db_now()),
                last_error=func.coalesce(bindparam("p_error"), job.c.last_error),
                error_traceback=func.coalesce(bindparam("p_traceback"), job.c.error_traceback),
                **cleared,
            )
        )

    # -- settle -----------------------------------------------------------------------------

    def settle(
        self,
        settlements: Iterable[Settlement],
        *,
        lock_wait: float | None = None,
        retry_conflicts: bool = True,
    ) -> int:
        """Finish claimed executions in one round trip where the driver pipelines. Rows whose
        claim is gone are left alone; returns the number of rows changed.

        ``lock_wait``: wait at most this many seconds on a lock another transaction holds
        (on a row of these jobs, say), then raise :class:`StoreBusy`; on connections made
        with that limit (PostgreSQL's ``lock_timeout``, MySQL/MariaDB's
        ``innodb_lock_wait_timeout``), so it costs no round trip. SQLite, and PostgreSQL
        behind PgBouncer, wait as they always do. ``retry_conflicts``: try again a few times
        after a lock wait ran out or a deadlock, before raising."""
        # An execution reported twice keeps its first outcome, on every database.
        first: dict[tuple[str, str], Settlement] = {}
        for s in settlements:
            first.setdefault((s.job_id, s.token), s)
        settlements = list(first.values())
        results = [s for s in settlements if s.result is not None]
        for s in results:
            refuse_oversized(
                self.db.engine, _result_params(s), f"the result of job {s.job_id} was not stored"
            )
        params = [
            {"p_job_id": s.job_id, "p_token": s.token, "p_status": s.status.value,
             "p_error": storable(s.error), "p_traceback": storable(s.traceback)}
            for s in settlements if s.result is None
        ]  # fmt: skip
        if not settlements:
            return 0
        held: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for s in settlements:
            if s.resource is not None:
                held[s.resource].append((s.job_id, s.token))
        permit = scheduler_resource_permit
        releases = [
            delete(permit).where(
                permit.c.resource == resource,
                tuple_(permit.c.job_id, permit.c.claim_token).in_(claims),
            )
            for resource, claims in held.items()
        ]

        ending = [s for s in settlements if s.status.value in CANCELS_DOWNSTREAM]

        # MySQL/MariaDB write results row by row: a batch that runs out of its lock wait
        # half-way must take back the rows before, which the caller then writes one by one.
        atomic = bool(ending) or (
            lock_wait is not None and not self.dialect.batches_executemany and len(settlements) > 1
        )

        def work(conn: Connection) -> int:
            if not atomic:
                return settle_rows(conn)
            with transaction(conn):  # parts and counters change with the outcome
                return settle_rows(conn)

        handed_back = [s.job_id for s in settlements if s.status is JobStatus.PENDING]

        def settle_rows(conn: Connection) -> int:
            # Only the rows this settle ends: the result backend usually stored the outcome
            # first (with its part, and the steps after it revoked), and the job may have
            # been retried from the dead-letter queue since; an old settle arriving then
            # must not revoke the chain steps the retry restored, nor recount the batch.
            ended = self._still_held(conn, ending)
            changed = self._settle_counting_dead_letters(conn, params) if params else 0
            if results:
                changed += self._store_results(conn, results)
            if handed_back:  # due again at once, for any node: wake the idle ones
                self.db.announce_queues_of(conn, handed_back)
            for release in releases:  # one statement per resource, not per job
                conn.execute(release)
            # Celery reports the children of chords it ran itself; these are for those it
            # never got to run (unknown task, malformed, revoked in the buffer).
            ended_parts: dict[str, list[str]] = defaultdict(list)
            for s in ended:
                cancel_downstream(conn, s.job_id, s.error)
                state = "FAILURE" if s.status is JobStatus.FAILED else "REVOKED"
                ended_parts[state].append(s.job_id)
            for state, ids in ended_parts.items():
                record_ended_parts(conn, ids, state)
            return changed

        return self.db.run(
            work,
            "job outcomes were not recorded",
            lock_wait=lock_wait,
            conflict_retries=CONFLICT_RETRIES if retry_conflicts else 0,
        )

    def _store_results(self, conn: Connection, results: list[Settlement]) -> int:
        """Successes with their results (handed over by the result backend instead of written
        by it), as :meth:`store_outcome` writes each; the number of rows changed."""
        rows = [_result_params(s) for s in results]
        if self.dialect.settles_by_arrays:
            returned = fetch_on(conn, self._raw_store_results_pg, _as_arrays(rows, _RESULT_ARRAYS))
            stored = {(job_id, token) for job_id, token in returned}
        else:
            stored = {
                (p["p_job_id"], p["p_token"])
                for p in rows
                if conn.execute(self._store_outcome, p).rowcount == 1
            }
        for s in results:
            if (s.job_id, s.token) not in stored:
                logger.warning(
                    "ratchet: result of job %s not written by this execution: its row was no "
                    "longer running under its claim (finished already, or recovered from a "
                    "node presumed dead)",
                    s.job_id,
                )
        return len(stored)

    @functools.cached_property
    def _raw_store_results_pg(self) -> RawStatement:
        return raw_statement(_STORE_RESULTS_PG, self.db.engine.dialect)

    def _still_held(self, conn: Connection, settlements: list[Settlement]) -> list[Settlement]:
        """Those of ``settlements`` whose claim still holds its job (RUNNING under it)."""
        if not settlements:
            return []
        claims = [(s.job_id, s.token) for s in settlements]
        held = {
            r.job_id
            for r in conn.execute(
                select(job.c.job_id).where(
                    job.c.status == JobStatus.RUNNING.value,
                    tuple_(job.c.job_id, job.c.claim_token).in_(claims),
                )
            )
        }
        return [s for s in settlements if s.job_id in held]

    def _settle_counting_dead_letters(self, conn: Connection, params: list[dict[str, Any]]) -> int:
        """Settle, counting the jobs this settle fails into their alert windows. Those rows
        are changed one at a time, so only the ones this settle changed count (the result
        backend may have failed the same claim already, and counted it then)."""
        failing = JobStatus.FAILED.value
        if self.dlq_alert_task is None or all(p["p_status"] != failing for p in params):
            return self._settle_rows(conn, params)
        others = [p for p in params if p["p_status"] != failing]
        changed = self._settle_rows(conn, others) if others else 0
        newly_failed = []
        for p in params:
            if p["p_status"] == failing and conn.execute(self._settle_one, p).rowcount == 1:
                changed += 1
                newly_failed.append((p["p_job_id"], p["p_token"]))
        self.count_dead_letters(conn, dlq_alerts.dead_letters(conn, newly_failed))
        return changed

    def count_dead_letters(self, conn: Connection, letters: list[dlq_alerts.DeadLetter]) -> None:
        if self.dlq_alert_task is not None and letters:
            dlq_alerts.count_dead_letters(conn, letters, excluded=self.dlq_alert_task)

    def _settle_rows(self, conn: Connection, params: list[dict[str, Any]]) -> int:
        if self.dialect.settles_by_arrays:
            # One statement over arrays, through the driver: a batch of outcomes costs the
            # worker one parameter set instead of one per row (pipelined executemany).
            return execute_on(conn, self._raw_settle_many, _as_arrays(params))
        if self.dialect.batches_executemany:  # sqlite3's own loop, in C
            return conn.execute(self._settle_one, params).rowcount
        # PyMySQL would send executemany row by row: group the plain outcomes instead.
        plain = [p for p in params if p["p_error"] is None and p["p_traceback"] is None]
        changed = 0
        for p in params:
            if p["p_error"] is not None or p["p_traceback"] is not None:
                changed += conn.execute(self._settle_one, p).rowcount
        for status, claims in group_by_outcome(plain).items():
            stmt = (
                update(job)
                .where(
                    job.c.status == JobStatus.RUNNING.value,
                    # MariaDB looks a one-claim row IN up through no index on job_id: it read
                    # (and locked, waiting on any locked one) every RUNNING row instead.
                    job.c.job_id.in_([job_id for job_id, _ in claims]),
                    tuple_(job.c.job_id, job.c.claim_token).in_(claims),
                )
                .values(**settled_values(JobStatus(status)))
            )
            changed += conn.execute(stmt).rowcount
        return changed

    def defer(self, deferrals: Sequence[tuple[str, str, datetime]]) -> int:
        """Give claimed jobs back, due at the given times, as if never claimed (an open
        circuit breaker): no attempt is counted. Returns how many were still held."""
        if not deferrals:
            return 0
        permit = scheduler_resource_permit
        params = [{"p_job_id": j, "p_token": t, "p_due": due} for j, t, due in deferrals]
        back = (
            update(job)
            .where(*claim_held(bindparam("p_job_id"), bindparam("p_token")))
            .values(
                status=JobStatus.PENDING.value,
                scheduled_time=bindparam("p_due", type_=UTCDateTime()),
                claims=job.c.claims - 1,
                **CLEARED_CLAIM,
            )
        )
        release = delete(permit).where(
            permit.c.job_id == bindparam("p_job_id"), permit.c.claim_token == bindparam("p_token")
        )

        def work(conn: Connection) -> int:
            with transaction(conn):
                changed = conn.execute(back, params).rowcount
                conn.execute(release, [{"p_job_id": j, "p_token": t} for j, t, _ in deferrals])
                self.db.announce_queues_of(conn, [j for j, _, _ in deferrals])
            return changed

        return self.db.run(work, "no job was deferred")

    def store_outcome(
        self,
        job_id: str,
        token: str,
        status: JobStatus,
        *,
        job_result: str | None = None,
        result_type: str | None = None,
        result_meta: str | None = None,
        error: str | None = None,
        traceback: str | None = None,
        part: BatchPart | None = None,
    ) -> bool:
        """Finish the execution this claim owns, with its result; False if the claim was lost.

        ``part``: the job is a child of a batch, which counts it in the same transaction."""
        params = {
            "p_job_id": job_id,
            "p_token": token,
            "p_status": status.value,
            "p_job_result": job_result,
            "p_result_type": result_type,
            "p_result_meta": result_meta,
            "p_error": storable(error),
            "p_traceback": storable(traceback),
        }
        cancels = status.value in CANCELS_DOWNSTREAM
        refuse_oversized(self.db.engine, params, f"the result of job {job_id} was not stored")

        def work(conn: Connection) -> bool:
            if part is None and not cancels:
                # Through the driver (store/raw.py): every stored result takes this way.
                return execute_on(conn, self._raw_store_outcome, params) == 1
            with transaction(conn):
                if conn.execute(self._store_outcome, params).rowcount != 1:
                    return False
                if part is not None:
                    record_part(conn, part)
                if cancels:
                    cancel_downstream(conn, job_id, error)
                if status is JobStatus.FAILED:
                    self.count_dead_letters(conn, dlq_alerts.dead_letters(conn, [(job_id, token)]))
                return True

        return self.db.run(work, "the result was not stored")

    @functools.cached_property
    def _raw_settle_many(self) -> RawStatement:
        return raw_statement(_SETTLE_MANY_PG, self.db.engine.dialect)

    @functools.cached_property
    def _raw_store_outcome(self) -> RawStatement:
        return raw_statement(self._store_outcome, self.db.engine.dialect)

    def holds(self, job_id: str, token: str) -> bool:
        """Whether this claim still owns the job (it is RUNNING under it)."""
        stmt = select(job.c.id).where(*claim_held(job_id, token))
        return bool(self.db.run(lambda conn: conn.execute(stmt).first() is not None, "not read"))

    def note_retry(self, job_id: str, error: str | None, traceback: str | None) -> bool:
        """Record why a job that was just rescheduled for a retry failed; False when no
        pending row of that id was there to take it."""
        stmt = (
            update(job)
            .where(job.c.job_id == job_id, job.c.status == JobStatus.PENDING.value)
            .values(last_error=error, error_traceback=traceback)
        )
        count = self.db.run(
            lambda conn: conn.execute(stmt).rowcount, "the retry reason was not stored"
        )
        return bool(count)

    def store_progress(self, job_id: str, token: str, meta: str | None, *, started: bool) -> None:
        """A running job's interim state (STARTED, or a custom one from ``update_state``)."""
        values: dict[str, Any] = {"result_meta": meta}
        if started:
            values["started_at"] = db_now()
        stmt = update(job).where(*claim_held(job_id, token)).values(**values)
        self.db.run(lambda conn: conn.execute(stmt), "the job's progress was not stored")


#: PostgreSQL: every outcome of a batch in one UPDATE, the outcomes as parallel arrays. The
#: same writes as ``_settle_one`` row by row: a handed-back job (PENDING) loses its claim and
#: has no end; the others end now, keeping an earlier error where this one has none.
#: The status test of the statements over ``unnest``, as an expression no index serves: each
#: job is then looked up by its id. Else a prepared statement's generic plan, when the table's
#: statistics last counted few RUNNING rows, reads every RUNNING row of the cluster through
#: the (status, picked_by) index for each batch (tests/contract/test_settle_plans.py).
_STILL_RUNNING = "(j.status || '') = 'RUNNING'"


def _unnested(arrays: dict[str, str]) -> str:
    """FROM items: the text array parameters ``arrays`` names (parameter → column), as the
    rows ``o``. The arrays are read through a sub-select kept as it is (``OFFSET 0``), so
    the planner estimates as many rows for any batch: given them directly, it knew each
    batch's length, and the prepared statement's plan for any batch (ten rows) looked dearer
    than the plan for one of fewer, so every settle of fewer than ten was planned again."""
    given = ", ".join(f"CAST(:{name} AS TEXT[]) AS {name}" for name in arrays)
    unnested = ", ".join(f"a.{name}" for name in arrays)
    return f"(SELECT {given} OFFSET 0) AS a, unnest({unnested}) AS o({', '.join(arrays.values())})"


_SETTLE_MANY_PG = text(
    "UPDATE scheduler_job AS j SET status = o.status, "
    "finished_at = CASE WHEN o.status = 'PENDING' THEN NULL ELSE now() END, "
    "last_error = COALESCE(o.error, j.last_error), "
    "error_traceback = COALESCE(o.traceback, j.error_traceback), "
    + ", ".join(
        f"{column} = CASE WHEN o.status = 'PENDING' THEN NULL ELSE j.{column} END"
        for column in CLEARED_CLAIM
    )
    + " FROM "
    + _unnested(
        {
            "ids": "job_id",
            "tokens": "token",
            "statuses": "status",
            "errors": "error",
            "tracebacks": "traceback",
        }
    )
    + f" WHERE j.job_id = o.job_id AND j.claim_token = o.token AND {_STILL_RUNNING}"
)


#: The arrays of ``_SETTLE_MANY_PG``, each from a settle parameter (one per execution).
_SETTLE_ARRAYS = {
    "ids": "p_job_id", "tokens": "p_token", "statuses": "p_status", "errors": "p_error",
    "tracebacks": "p_traceback",
}  # fmt: skip


def _as_arrays(
    rows: list[dict[str, Any]], arrays: dict[str, str] = _SETTLE_ARRAYS
) -> dict[str, list[Any]]:
    """Statement parameters, one set per row, as the parallel arrays ``arrays`` names
    (array → parameter) for a statement over ``unnest``."""
    return {array: [row[name] for row in rows] for array, name in arrays.items()}


#: PostgreSQL: successes with their results in one UPDATE, as parallel arrays; each row as
#: ``_store_outcome`` writes it. Returns the executions whose claim still held their row.
_STORE_RESULTS_PG = text(
    "UPDATE scheduler_job AS j SET status = o.status, finished_at = now(), "
    "job_result = o.job_result, result_type = o.result_type, result_meta = o.result_meta, "
    "last_error = NULL, error_traceback = NULL "
    "FROM "
    + _unnested(
        {
            "ids": "job_id",
            "tokens": "token",
            "statuses": "status",
            "results": "job_result",
            "types": "result_type",
            "metas": "result_meta",
        }
    )
    + f" WHERE j.job_id = o.job_id AND j.claim_token = o.token AND {_STILL_RUNNING} "
    "RETURNING j.job_id, j.claim_token"
)

_RESULT_ARRAYS = {
    "ids": "p_job_id", "tokens": "p_token", "statuses": "p_status", "results": "p_job_result",
    "types": "p_result_type", "metas": "p_result_meta",
}  # fmt: skip


def _result_params(s: Settlement) -> dict[str, Any]:
    assert s.result is not None
    return {
        "p_job_id": s.job_id,
        "p_token": s.token,
        "p_status": s.status.value,
        "p_job_result": s.result.value,
        "p_result_type": s.result.type_name,
        "p_result_meta": s.result.meta,
        "p_error": None,
        "p_traceback": None,
    }
