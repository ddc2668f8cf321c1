"""Writing jobs: plain, keyed, in a caller's transaction, chains stored ahead."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    bindparam,
    delete,
    func,
    inspect,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError

from celery_ratchet.domain.job import (
    JobStatus,
    NewJob,
    OnDuplicate,
)
from celery_ratchet.errors import (
    ConfigurationError,
    DuplicateJob,
    SchemaOutdated,
    StoreBusy,
)
from celery_ratchet.store.database import Database
from celery_ratchet.store.db_clock import db_now
from celery_ratchet.store.db_errors import in_callers_transaction, sqlstate_of
from celery_ratchet.store.dialect import Dialect, dialect_of
from celery_ratchet.store.engine import (
    insert_ignoring_conflicts,
    same_database,
    savepoint,
    transaction,
)
from celery_ratchet.store.job_rows import (
    CLEARED_CLAIM,
    CLEARED_RESULT,
    KEY_TRIES,
    NOTIFY_CHANNEL,
    TERMINAL,
    WAITING_COLUMNS,
    WAITING_DUE,
    as_bytes,
    claim_held,
    is_active_key_conflict,
    job,
    job_params,
    lacks_active_key_index,
    new_job_values,
    no_guard,
)
from celery_ratchet.store.raw import execute as execute_raw
from celery_ratchet.store.raw import pooled
from celery_ratchet.store.redact import mask_url
from celery_ratchet.store.row_writer import RowWriter
from celery_ratchet.store.schema import (
    ACTIVE_KEY_INDEX,
    metadata,
    scheduler_resource_permit,
)
from celery_ratchet.store.units import Unit, connection_of, is_callers

logger = logging.getLogger(__name__)

#: A running job taken over by a step of its replacement keeps a revoke asked of its id.
_CLEARED_RESULT_KEEPING_REVOKE = {
    k: v for k, v in CLEARED_RESULT.items() if k != "revoke_requested"
}


#: Job ids looked up in one statement when jobs are moved in from a broker.
_IDS_PER_LOOKUP = 1000


def _present(conn: Connection, ids: Sequence[str]) -> set[str]:
    if dialect_of(conn).looks_up_by_array:
        # One array parameter: an IN list of a thousand is compiled anew for every look-up.
        rows = conn.exec_driver_sql(
            f"SELECT job_id FROM {job.name} WHERE job_id = ANY(%(ids)s)", {"ids": list(ids)}
        )
        return {str(found) for (found,) in rows}
    return {
        str(found)
        for start in range(0, len(ids), _IDS_PER_LOOKUP)
        for found in conn.execute(
            select(job.c.job_id).where(job.c.job_id.in_(ids[start : start + _IDS_PER_LOOKUP]))
        ).scalars()
    }


@dataclass(frozen=True)
class _Taken:
    """A plain insert found its job id taken; ``maybe_ours``: by a try of its own."""

    maybe_ours: bool


#: A move from a broker left idle this long inside its transaction is ended by the server. A
#: run stopped there (Ctrl-Z) would hold the new ids' rows locked, and a run taking over
#: its messages would wait on them; a healthy move is never idle for a second.
MOVE_IDLE_LIMIT = 5.0


class Enqueue:
    """Writing jobs: plain, keyed, in a caller's transaction, chains stored ahead; a
    running job replaced by its retry. ``rows``: the job INSERT (store/row_writer.py)."""

    def __init__(self, db: Database, dialect: Dialect, rows: RowWriter) -> None:
        self.db = db
        self.dialect = dialect
        self.rows = rows
        self._key_holder = dialect.key_holder(locking=True)
        self._committed_key_holder = dialect.key_holder(locking=False)
        released = new_job_values()
        released.pop("group_id")  # a step keeps the group its signature was frozen with
        released.pop("job_type")  # and its type (CHAIN_STEP): the message sent cannot say
        # A chain step stored ahead holds no business key (see waiting_steps): releasing it
        # gives it none, so the release never meets the unique index on active keys.
        released.pop("business_key")
        self._release_waiting_silently = (
            update(job)
            .where(job.c.job_id == bindparam("p_job_id"), job.c.status == JobStatus.WAITING.value)
            .values(**released, created_at=db_now())
        )
        rescheduled = new_job_values()
        # A retry or replace is the same job: it keeps its business key (and stays active),
        # and its type.
        rescheduled.pop("business_key")
        rescheduled.pop("job_type")
        self._replace_running_silently = (
            update(job)
            .where(*claim_held(bindparam("p_job_id"), bindparam("p_token")))
            .values(**rescheduled, **CLEARED_CLAIM)
        )
        #: A finished job's row, made a new job of the same id (a job sent again).
        self.reuse_finished = (
            update(job)
            .where(job.c.job_id == bindparam("p_job_id"), job.c.status.in_(TERMINAL))
            .values(**new_job_values(), **CLEARED_CLAIM, **CLEARED_RESULT, created_at=db_now())
        )
        self._prepare()
        db.when_silent(self._prepare)

    def _prepare(self) -> None:
        self._release_waiting = self._release_waiting_silently
        self._replace_running = self._replace_running_silently
        if self.db.notify:
            # A released step or a retry is due (now or after its countdown): idle workers
            # sleep until the next due time they know of, so they are told.
            self._release_waiting = self._release_waiting.returning(
                func.pg_notify(NOTIFY_CHANNEL, job.c.queue)
            )
            self._replace_running = self._replace_running.returning(
                func.pg_notify(NOTIFY_CHANNEL, job.c.queue)
            )

    # -- enqueue ----------------------------------------------------------------------------

    def enqueue(self, new: NewJob, *, maybe_committed: bool = False) -> dict[str, str]:
        """Insert one job; a finished job with the same id is replaced, an active one is not.
        Returns what :meth:`enqueue_many` does."""
        return self.enqueue_many([new], maybe_committed=maybe_committed)

    def enqueue_many(
        self,
        jobs: Sequence[NewJob],
        waiting: Sequence[NewJob] = (),
        *,
        maybe_committed: bool = False,
    ) -> dict[str, str]:
        """Insert jobs with multi-row INSERTs in one transaction: all or nothing.

        ``waiting`` are chain steps stored ahead of time (WAITING, never claimed); one whose id
        exists already is left alone. A job whose id is such a waiting step releases it.

        A job whose business key an active job holds is not inserted; the result maps its
        id to the holder's (``on_duplicate`` RAISE, or the head of a chain: DuplicateJob,
        and nothing is written). Jobs without a key take the plain multi-row path.

        ``maybe_committed``: an earlier call with these jobs failed in a way that may have
        committed them (a lost reply). A row holding the same id and message is then ours:
        success, whatever its state; a finished one is not run again."""
        if not jobs and not waiting:
            return {}
        self.rows.check_packet(jobs, waiting)
        params = [job_params(j) for j in jobs]
        keyed = any(j.business_key is not None for j in jobs)
        heads = {w.depends_on for w in waiting}
        tries = 0
        if len(params) == 1 and not keyed and not waiting and params[0]["p_parent_id"] is None:
            # The common send: one plain row, no chain step to release. A taken id (or a try
            # that may have committed already) goes on to the full path below, which decides.
            taken = self._insert_plain(params[0], "no job was enqueued")
            if taken is None:
                return {}
            tries = 1 if taken.maybe_ours else 0

        def work(conn: Connection) -> dict[str, str]:
            nonlocal tries
            tries += 1
            # After a broken connection the earlier try may have committed: finding our own
            # row then is success, not a duplicate.
            retried = maybe_committed or tries > 1
            # Sent from inside a task: most likely the next step of a chain, stored as WAITING
            # with the rest of its chain at submission. Releasing it is all there is to do.
            from_a_task = len(params) == 1 and params[0]["p_parent_id"] is not None
            if from_a_task and conn.execute(self._release_waiting, params[0]).rowcount == 1:
                return {}
            if keyed and len(params) == 1 and not waiting:
                # Autocommit: one statement, nothing to roll back to.
                return self._insert_each(conn, jobs, params, retried, no_guard, heads)
            if waiting or keyed:
                with transaction(conn):
                    self._insert_waiting(conn, waiting)
                    return self._insert_each(
                        conn, jobs, params, retried, lambda: savepoint(conn), heads
                    )
            if len(params) == 1:
                try:
                    conn.execute(self.rows.insert, params[0])
                except IntegrityError:
                    self._reuse_or_refuse(conn, params[0], retried, no_guard)
                return {}
            try:
                with transaction(conn):
                    self.rows.insert_many(conn, params)
                return {}
            except IntegrityError:
                pass
            # An id already taken: one row at a time, still all or nothing.
            with transaction(conn):
                return self._insert_each(conn, jobs, params, retried, lambda: savepoint(conn))

        return self.db.run(work, "no job was enqueued")

    def import_jobs(self, moved: Sequence[tuple[NewJob, Sequence[NewJob]]]) -> set[str]:
        """Write jobs moved from a broker, each with the chain steps stored ahead of it, in one
        transaction: a job whose id the store holds already, in any state, is left as it is
        (it was moved before, by a run that did not get to delete it from the broker), never
        re-armed or run again, and its steps are not written. Returns those ids."""
        if not moved:
            return set()
        jobs = [j for j, _ in moved]
        self.rows.check_packet(jobs, [w for _, steps in moved for w in steps])
        ids = [j.job_id for j in jobs]

        def work(conn: Connection) -> set[str]:
            try:
                with transaction(conn):
                    self.dialect.end_if_idle(conn, MOVE_IDLE_LIMIT)
                    present = _present(conn, ids)
                    fresh = [(j, steps) for j, steps in moved if j.job_id not in present]
                    if fresh:
                        params = [job_params(j) for j, _ in fresh]
                        try:
                            with savepoint(conn):  # the fast path (COPY on PostgreSQL)
                                self.rows.insert_many(conn, params)
                        except IntegrityError:
                            # Another writer took one of the ids since the look-up: it stays.
                            self.rows.insert_many(conn, params, ignore_existing=True)
                        self._insert_waiting(conn, [w for _, steps in fresh for w in steps])
            finally:
                self.dialect.lift_idle_limit(conn)
            return present

        found: set[str] = self.db.run(work, "no job was moved")
        return found

    def stored_contents(self, ids: Sequence[str]) -> dict[str, tuple[str, bytes | None]]:
        """The task name and payload of each of ``ids`` the store holds, in any state."""
        if not ids:
            return {}

        def work(conn: Connection) -> dict[str, tuple[str, bytes | None]]:
            found: dict[str, tuple[str, bytes | None]] = {}
            for start in range(0, len(ids), _IDS_PER_LOOKUP):
                stmt = select(job.c.job_id, job.c.task_name, job.c.payload).where(
                    job.c.job_id.in_(list(ids[start : start + _IDS_PER_LOOKUP]))
                )
                for row in conn.execute(stmt):
                    payload = bytes(row.payload) if row.payload is not None else None
                    found[str(row.job_id)] = (str(row.task_name), payload)
            return found

        contents: dict[str, tuple[str, bytes | None]] = self.db.run(work, "no job was read")
        return contents

    def _insert_plain(self, params: dict[str, Any], what: str) -> _Taken | None:
        """Insert one row through the driver itself (see store/raw.py): None when inserted,
        else its job id is taken (an active job, a finished one to re-arm, or this very row
        from a try whose reply was lost). Errors are translated as any write's are."""
        tries = 0

        def work(connection: Any) -> _Taken | None:
            nonlocal tries
            tries += 1
            try:
                execute_raw(self.db.engine, connection, self.rows.raw_insert, params)
            except IntegrityError:
                # A try before this one lost its connection: the row may be its own.
                return _Taken(maybe_ours=tries > 1)
            return None

        self.db.ensure_schema()
        return self.db.attempt(work, what, lambda: pooled(self.db.engine))

    def enqueue_with(
        self,
        jobs: Sequence[NewJob],
        waiting: Sequence[NewJob],
        also: Callable[[Connection], None],
        what: str,
    ) -> None:
        """Insert jobs (multi-row) and run ``also`` on the same transaction: both or neither.
        A chunk of a streaming batch and the batch's counter and lease are written so. The
        jobs are a batch's children, which the batch counts itself: a business key an active
        job holds raises :class:`DuplicateJob` and nothing of the chunk is written."""
        self.rows.check_packet(jobs, waiting)
        params = [job_params(j) for j in jobs]
        keyed = any(j.business_key is not None for j in jobs)
        tries = 0

        def work(conn: Connection) -> None:
            nonlocal tries
            tries += 1
            # A try before may have lost its reply after committing: our own rows are found.
            retried = tries > 1
            with transaction(conn):
                if waiting:
                    self._insert_waiting(conn, waiting)
                held: dict[str, str] = {}
                if keyed:
                    held = self._insert_each(conn, jobs, params, retried, lambda: savepoint(conn))
                else:
                    try:
                        with savepoint(conn):
                            self.rows.insert_many(conn, params)
                    except IntegrityError:
                        held = self._insert_each(
                            conn, jobs, params, retried, lambda: savepoint(conn)
                        )
                if held:
                    holder = next(iter(held.values()))
                    raise DuplicateJob(
                        holder,
                        business_key=DuplicateJob.HELD,
                        reason="a streaming batch counts its own children, so none can stand "
                        "in for another job: give its children no business key, or keys no "
                        "active job holds",
                    )
                also(conn)

        self.db.run(work, what)

    def _insert_each(
        self,
        conn: Connection,
        jobs: Sequence[NewJob],
        params: list[dict[str, Any]],
        retried: bool,
        guard: Callable[[], contextlib.AbstractContextManager[Any]],
        heads: set[str | None] | None = None,
        within: bool = False,
    ) -> dict[str, str]:
        """One row at a time, each under ``guard`` (a savepoint in a transaction); returns
        the ids of jobs whose business key was held, mapped to the holders'. ``within``:
        ``conn`` is in the caller's own transaction."""
        held: dict[str, str] = {}
        for new, p in zip(jobs, params, strict=True):
            if new.business_key is not None:
                holder = (
                    self._committed_holder(p) if within and not self.dialect.single_writer else None
                )
                if holder is None:
                    holder = self._insert_keyed(conn, p, retried, guard, within=within)
            else:
                try:
                    with guard():
                        conn.execute(self.rows.insert, p)
                    continue
                except IntegrityError:
                    holder = self._reuse_or_refuse(conn, p, retried, guard)
            if holder is None:
                continue
            if new.job_id in (heads or ()):
                raise DuplicateJob(
                    holder,
                    business_key=new.business_key,
                    reason="a chain cannot follow a job that is not its first step: "
                    "send the chain again once that job has ended",
                )
            if new.on_duplicate is OnDuplicate.RAISE:
                raise DuplicateJob(holder, business_key=new.business_key)
            held[new.job_id] = holder
        return held

    def _insert_keyed(
        self,
        conn: Connection,
        params: dict[str, Any],
        retried: bool,
        guard: Callable[[], contextlib.AbstractContextManager[Any]],
        within: bool = False,
    ) -> str | None:
        """Insert a job with a business key unless an active job holds the key: the
        database's unique index decides, so concurrent sends of a key make one job. None
        when the row is in (inserted, or ours from an earlier try), else the holder's id."""
        for _ in range(KEY_TRIES):
            try:
                with guard():
                    inserted = conn.execute(self.rows.insert_keyed_row, params).rowcount == 1
            except IntegrityError as exc:
                if not is_active_key_conflict(exc):  # the job id is taken
                    return self._reuse_or_refuse(conn, params, retried, guard)
                inserted = False
            except DBAPIError as exc:
                if within and sqlstate_of(exc.orig) == "40001":
                    # PostgreSQL, a REPEATABLE READ or SERIALIZABLE caller: the holder was
                    # committed after the caller's snapshot, which cannot see it.
                    holder = self._committed_holder(params)
                    if holder is not None:
                        return holder
                    raise StoreBusy(
                        f"the business key of job {params['p_job_id']!r} is held by a job "
                        "the caller's transaction cannot see (its snapshot is older); no "
                        "job was enqueued, send it again in a new transaction"
                    ) from exc
                if lacks_active_key_index(exc):
                    raise SchemaOutdated(
                        f"the job store at {self.db.display_url} lacks the unique index "
                        f"{ACTIVE_KEY_INDEX} on active business keys (its schema predates "
                        "this version and was not brought up to date, or active jobs of an "
                        "earlier version share a key); run `ratchet --url URL schema apply`, "
                        "which says what stands in the way; no job was enqueued"
                    ) from exc
                raise
            if inserted:
                return None
            holder = self._holder_of(conn, params["p_business_key"])
            if holder == params["p_job_id"]:
                return None  # this very job: sent before, still active
            if holder is not None:
                return holder
            # The holder ended between the conflict and the look-up: the key is free now.
        raise StoreBusy(
            f"the business key of job {params['p_job_id']!r} kept changing hands "
            f"({KEY_TRIES} tries); no job was enqueued"
        )

    def _committed_holder(self, params: dict[str, Any]) -> str | None:
        """The committed active job holding the key, other than this job, read on the store's
        own connection. MySQL: a caller's transaction that met the key through the unique
        index (or a locking read) would hold a lock on the holder's row until it ends, and
        the holder's worker could not record its outcome meanwhile. PostgreSQL: a REPEATABLE
        READ caller's insert would fail to serialize against a holder its snapshot lacks."""
        with self.db.engine.connect() as own:
            holder = own.execute(self._committed_key_holder, {"key": params["p_business_key"]})
            found = holder.scalar()
        return None if found is None or found == params["p_job_id"] else str(found)

    def _holder_of(self, conn: Connection, business_key: str) -> str | None:
        holder = conn.execute(self._key_holder, {"key": business_key}).scalar()
        return None if holder is None else str(holder)

    def _insert_waiting(self, conn: Connection, steps: Sequence[NewJob]) -> None:
        if not steps:
            return
        rows = [
            {**{k[2:]: v for k, v in job_params(s).items() if k[2:] in WAITING_COLUMNS},
             "status": JobStatus.WAITING.value, "scheduled_time": WAITING_DUE,
             "created_at": datetime.now(timezone.utc), "attempts": 0, "claims": 0}
            for s in steps
        ]  # fmt: skip
        taken = {s.job_id for s in steps if s.takes_over and self._take_over(conn, s, rows)}
        rows = [r for r in rows if r["job_id"] not in taken]
        if rows:
            conn.execute(insert_ignoring_conflicts(conn.dialect, job, key="job_id"), rows)

    def _take_over(self, conn: Connection, step: NewJob, rows: list[dict[str, Any]]) -> bool:
        """The running job of ``step``'s id, still held by the claim ``step.takes_over``,
        becomes the WAITING step (it was replaced by the chain this step ends): the step
        before it releases it as any step. Its own execution's end then finds its claim gone.
        False when that claim is gone already."""
        (row,) = [r for r in rows if r["job_id"] == step.job_id]
        values = {k: v for k, v in row.items() if k != "job_id"}
        return _wait_in_place(conn, step.job_id, step.takes_over or "", values)

    def wait_in_place(self, job_id: str, token: str, unit: Unit | None = None) -> bool:
        """The running job ``job_id``, still held by the claim ``token``, becomes a WAITING
        row that the next send of its id releases with that send's message: a task replaced
        by a group, whose id the group's chord body (``celery.accumulate``) takes once every
        member ended; that send could otherwise find the task's row still RUNNING (its
        outcome not written yet) and be refused as a DuplicateJob. In ``unit`` when given.
        Its own execution's end then finds its claim gone. False when that claim is gone."""
        what = "the replaced job was not handed to its replacement"
        # No step before it releases it (depends_on NULL): a failure written to its id from
        # outside (the chord's error) finishes it, as it finishes a job of no row.
        values = {
            "status": JobStatus.WAITING.value,
            "scheduled_time": WAITING_DUE,
            "depends_on": None,
        }

        def work(conn: Connection) -> bool:
            with transaction(conn):
                return _wait_in_place(conn, job_id, token, values)

        if unit is None:
            return bool(self.db.run(work, what))
        conn = connection_of(unit)
        with in_callers_transaction(conn, what, callers=is_callers(unit)), conn.begin_nested():
            return _wait_in_place(conn, job_id, token, values)

    def enqueue_within(
        self, unit: Unit, jobs: Sequence[NewJob], waiting: Sequence[NewJob] = ()
    ) -> dict[str, str]:
        """Insert jobs in the caller's unit of work, inside the caller's transaction: they
        exist if and only if that transaction commits. A taken task id raises DuplicateJob
        without spoiling the caller's transaction (a savepoint holds each try); a business
        key held by an active job is as in :meth:`enqueue_many`."""
        if not jobs:
            return {}
        conn = connection_of(unit)
        self._check_same_database(conn)
        if not self.db.schema_ready:
            # DDL cannot run inside the caller's transaction (MySQL would commit it, SQLite
            # would wait on its own lock): the tables must exist already.
            with in_callers_transaction(conn, "the jobs were not sent", callers=is_callers(unit)):
                missing = set(metadata.tables) - set(inspect(conn).get_table_names())
            if missing:
                raise ConfigurationError(
                    f"the job store's tables do not exist yet ({', '.join(sorted(missing))}); "
                    "create them before enqueueing in your own transaction: "
                    "`ratchet --url URL schema apply`, or start a worker once"
                )
            self.db.schema_found()
        self.rows.check_packet(jobs, waiting)
        params = [job_params(j) for j in jobs]
        keyed = any(j.business_key is not None for j in jobs)
        with (
            in_callers_transaction(conn, "the jobs were not sent", callers=is_callers(unit)),
            conn.begin_nested(),
        ):
            self._insert_waiting(conn, waiting)
            if not keyed:
                try:
                    with conn.begin_nested():
                        self.rows.insert_many(conn, params)
                    return {}
                except IntegrityError:
                    pass
            heads = {w.depends_on for w in waiting}
            return self._insert_each(
                conn, jobs, params, False, conn.begin_nested, heads, within=True
            )

    def _check_same_database(self, conn: Connection) -> None:
        theirs = conn.engine.url
        if not same_database(self.db.engine.url, theirs):
            shown = mask_url(theirs.render_as_string(hide_password=False))
            described = conn.info.get("ratchet_described_as", "this connection")
            remedy = conn.info.get(
                "ratchet_remedy", "give a connection to that database, or send outside the block"
            )
            raise ConfigurationError(
                f"transactional enqueue needs the job store's database: {described} is to "
                f"{shown}, ratchet_url is {self.db.display_url}; {remedy}"
            )

    def _reuse_or_refuse(
        self,
        conn: Connection,
        params: dict[str, Any],
        retried: bool,
        guard: Callable[[], contextlib.AbstractContextManager[Any]],
    ) -> str | None:
        """The job id is taken: release the waiting step of that id, or re-arm the finished
        job of that id, or raise DuplicateJob. Returns the holder's id when re-arming met
        the job's business key held by another active job (then nothing was written)."""
        if conn.execute(self._release_waiting, params).rowcount == 1:
            return None
        if params["p_parent_id"] is not None:
            depends_on = conn.execute(
                select(job.c.depends_on).where(job.c.job_id == params["p_job_id"])
            ).scalar()
            if depends_on == params["p_parent_id"]:
                # A chain step released already, sent again by a second execution of the
                # step before it (recovered from a dead node): the step runs once.
                logger.info("ratchet: chain step %s was released already", params["p_job_id"])
                return None
        # Before anything re-arms a finished row: one that holds this very message was
        # written by an earlier try of this send whose reply was lost, and may have run.
        if retried and self._holds_message(conn, params):
            logger.info(
                "ratchet: job %s was stored by an earlier try whose reply was lost",
                params["p_job_id"],
            )
            return None
        try:
            with guard():
                if conn.execute(self.reuse_finished, params).rowcount == 1:
                    return None
        except IntegrityError as exc:
            key = params["p_business_key"]
            if key is None or not is_active_key_conflict(exc):
                raise
            holder = self._holder_of(conn, key)
            if holder is not None:
                return holder
            raise StoreBusy(
                f"the business key of job {params['p_job_id']!r} changed hands while the "
                "job was re-armed; no job was enqueued, send it again"
            ) from exc
        raise DuplicateJob(params["p_job_id"])

    def _holds_message(self, conn: Connection, params: dict[str, Any]) -> bool:
        """Whether the row of this job id holds this message (headers and payload)."""
        stored = conn.execute(
            select(job.c.headers, job.c.payload).where(job.c.job_id == params["p_job_id"])
        ).first()
        return (
            stored is not None
            and stored.headers == params["p_headers"]
            and as_bytes(stored.payload) == as_bytes(params["p_payload"])
        )

    def replace_running(self, token: str, new: NewJob) -> bool:
        """Reschedule the row this claim owns with a new message (a retry, a replace).

        False when the claim was lost: the row belongs to another execution now.
        """
        params = {**job_params(new), "p_token": token}
        permit = scheduler_resource_permit
        release = delete(permit).where(permit.c.job_id == new.job_id, permit.c.claim_token == token)

        def work(conn: Connection) -> bool:
            if conn.execute(self._replace_running, params).rowcount != 1:
                return False
            conn.execute(release)  # a permit is held per execution, not across retries
            return True

        return self.db.run(work, "the job was not rescheduled")


def _wait_in_place(conn: Connection, job_id: str, token: str, values: dict[str, Any]) -> bool:
    """The row of ``job_id`` held by ``token`` takes ``values`` (a WAITING row's) with its
    claim and outcome cleared (a revoke asked of its id kept) and its permit released."""
    changed = conn.execute(
        update(job)
        .where(*claim_held(job_id, token))
        .values(**values, **CLEARED_CLAIM, **_CLEARED_RESULT_KEEPING_REVOKE)
    )
    if changed.rowcount != 1:
        return False
    permit = scheduler_resource_permit
    conn.execute(delete(permit).where(permit.c.job_id == job_id, permit.c.claim_token == token))
    return True
