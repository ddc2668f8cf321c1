"""The store's shared ground while its concerns move into parts of their own: one
:class:`~celery_ratchet.store.database.Database`, its :class:`~celery_ratchet.store.dialect.Dialect`
and the prepared statements several concerns share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import (
    bindparam,
    case,
    delete,
    func,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection, Engine

from celery_ratchet.domain.job import (
    JobStatus,
)
from celery_ratchet.domain.priority import DEFAULT_BOOST_MINUTES
from celery_ratchet.store.claim import RETURNED
from celery_ratchet.store.database import CONFLICT_RETRIES, Database, Reachability
from celery_ratchet.store.db_clock import (
    db_now,
)
from celery_ratchet.store.dialect import Dialect
from celery_ratchet.store.engine import EngineOptions
from celery_ratchet.store.job_rows import (
    _CLEARED_CLAIM,
    _CLEARED_RESULT,
    _TERMINAL,
    NOTIFY_CHANNEL,
    _held,
    _insert_statement,
    _new_job_values,
    job,
)
from celery_ratchet.store.raw import raw_statement
from celery_ratchet.store.schema import (
    KeptDateTime,
    scheduler_resource_permit,
)

T = TypeVar("T")


class StoreCore:
    """Job rows in one database: the :class:`Database` and :class:`Dialect` every concern
    of the store shares, and the statements prepared for several of them."""

    def __init__(
        self,
        url: str,
        *,
        create_schema: bool = True,
        engine: Engine | None = None,
        priority_boost_minutes: float = DEFAULT_BOOST_MINUTES,
        notify: bool = False,
        engine_options: EngineOptions | None = None,
        dlq_alert_task: str | None = None,
    ):
        #: The database: connections, outages and retries, announcements, schema checks.
        self.db = Database(
            url,
            create_schema=create_schema,
            engine=engine,
            notify=notify,
            engine_options=engine_options,
        )
        #: What this database does differently (store/dialect.py).
        self.dialect: Dialect = self.db.dialect
        self.url = url
        self.display_url = self.db.display_url
        self.family = self.db.family
        #: The task sent dead-letter alerts: with one, each job failing for good is counted
        #: into its task name's alert window, in the transaction that fails it.
        self.dlq_alert_task = dlq_alert_task
        #: Aging: a waiting job gains one priority level per this many minutes (0: never).
        self.priority_boost_minutes = max(float(priority_boost_minutes), 0.0)
        self._claim = self.dialect.claim_strategy()
        self._insert = _insert_statement(self.engine.dialect, notify=self.notify)
        self._raw_insert = raw_statement(self._insert, self.engine.dialect)
        self._insert_keyed_row = _insert_statement(
            self.engine.dialect, notify=self.notify, keyed=True
        )
        self._key_holder = self.dialect.key_holder(locking=True)
        self._committed_key_holder = self.dialect.key_holder(locking=False)
        released = _new_job_values()
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
        self._release_waiting = self._release_waiting_silently
        if self.notify:
            self._release_waiting = self._release_waiting.returning(
                func.pg_notify(NOTIFY_CHANNEL, job.c.queue)
            )
        self._select_claimed = text(
            f"SELECT {RETURNED} FROM scheduler_job "
            "WHERE claim_token = :token AND status = 'RUNNING'"
        ).columns(scheduled_time=KeptDateTime())
        rescheduled = _new_job_values()
        # A retry or replace is the same job: it keeps its business key (and stays active),
        # and its type.
        rescheduled.pop("business_key")
        rescheduled.pop("job_type")
        self._replace_running = (
            update(job)
            .where(*_held(bindparam("p_job_id"), bindparam("p_token")))
            .values(**rescheduled, **_CLEARED_CLAIM)
        )
        owned = _held(bindparam("p_job_id"), bindparam("p_token"))
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
        cleared = {k: case((handed_back, None), else_=job.c[k]) for k in _CLEARED_CLAIM}
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
        permit = scheduler_resource_permit
        self._known_resources: set[str] = set()
        self._count_permits = (
            select(func.count())
            .select_from(permit)
            .where(permit.c.resource == bindparam("resource"))
        )
        still_running = (
            select(job.c.id)
            .where(
                job.c.job_id == permit.c.job_id,
                job.c.claim_token == permit.c.claim_token,
                job.c.status == JobStatus.RUNNING.value,
            )
            .correlate(permit)
        )
        self._drop_stale_permits = delete(permit).where(
            permit.c.resource == bindparam("resource"), ~still_running.exists()
        )
        self._replace_running_silently = self._replace_running
        if self.notify:
            # A retry is due again (now or after its countdown): idle workers sleep until
            # the next due time they know of, so they are told.
            self._replace_running = self._replace_running.returning(
                func.pg_notify(NOTIFY_CHANNEL, job.c.queue)
            )
        self._reuse_finished = (
            update(job)
            .where(job.c.job_id == bindparam("p_job_id"), job.c.status.in_(_TERMINAL))
            .values(**_new_job_values(), **_CLEARED_CLAIM, **_CLEARED_RESULT, created_at=db_now())
        )

        self.db.when_silent(self._prepare_silent)

    @property
    def engine(self) -> Engine:
        """The database's engine (one pool of connections)."""
        return self.db.engine

    @property
    def notify(self) -> bool:
        """PostgreSQL: inserts notify listening workers (LISTEN/NOTIFY wake-ups)."""
        return self.db.notify

    @property
    def reachability(self) -> Reachability:
        """Whether the database answers, as this process last found it."""
        return self.db.reachability

    def stop_notifying(self) -> None:
        """No more ``pg_notify`` on inserts: nothing receives them (see ``send_probe``)."""
        self.db.stop_notifying()

    def _prepare_silent(self) -> None:
        self._insert = _insert_statement(self.engine.dialect, notify=False)
        self._raw_insert = raw_statement(self._insert, self.engine.dialect)
        self._insert_keyed_row = _insert_statement(self.engine.dialect, keyed=True)
        self._release_waiting = self._release_waiting_silently
        self._replace_running = self._replace_running_silently

    def send_probe(self, payload: str) -> None:
        """NOTIFY the wake-up channel through the store's own connections, the way inserts
        do: a listener that never receives it listens where enqueues do not notify."""
        self.db.send_probe(payload)

    # -- the database's, as the concerns not yet parts of their own call them ---------------

    def _run(
        self,
        work: Callable[[Connection], T],
        what: str,
        *,
        lock_wait: float | None = None,
        conflict_retries: int = CONFLICT_RETRIES,
        liveness: bool = False,
    ) -> T:
        return self.db.run(
            work, what, lock_wait=lock_wait, conflict_retries=conflict_retries, liveness=liveness
        )

    def _attempt(
        self,
        work: Callable[[Any], T],
        what: str,
        connect: Callable[[], Any] | None = None,
        conflict_retries: int = CONFLICT_RETRIES,
    ) -> T:
        return self.db.attempt(work, what, connect, conflict_retries)

    def ensure_schema(self) -> None:
        self.db.ensure_schema()

    def create_missing_tables(self) -> list[str]:
        return self.db.create_missing_tables()

    def schema_differences(self) -> list[str]:
        """What the live database lacks of the schema: tables, columns, indexes."""
        return self.db.schema_differences()

    def index_shapes(self) -> tuple[list[str], list[str]]:
        """Indexes of the schema's names not as this version makes them: (problems, notes)."""
        return self.db.index_shapes()

    def announce(self, word: str) -> None:
        """PostgreSQL with LISTEN/NOTIFY on: tell listening workers ``word`` now."""
        self.db.announce(word)

    def _announce(self, conn: Connection, word: str) -> None:
        self.db.announce_in(conn, word)

    def _announce_queues_of(self, conn: Connection, job_ids: Sequence[str]) -> None:
        self.db.announce_queues_of(conn, job_ids)
