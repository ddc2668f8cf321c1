"""A statement that committed but whose reply was lost must not leave rows behind."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from celery_ratchet.domain.job import JobStatus, JobType, Settlement
from celery_ratchet.store import enqueue
from celery_ratchet.store.jobstore import JobStore
from tests.helpers import new_job


class _Flaky:
    """An engine whose connections fail once, right after running the first statement that
    ``breaks`` recognises (it is given the statement as executed): the statement is
    committed, the caller never hears so."""

    def __init__(self, engine: Engine, breaks: Any) -> None:
        self._engine = engine
        self.dialect = engine.dialect
        self._breaks = breaks
        self.broken = False

        self.pool = engine.pool

    @contextmanager
    def connect(self) -> Iterator[Any]:
        with self._engine.connect() as conn:
            yield _FlakyConnection(conn, self)

    def raw_connection(self) -> Any:
        """The driver's connection, for the plain single-row insert (store/raw.py)."""
        return _FlakyConnection(self._engine.raw_connection(), self)

    def after(self, statement: Any, target: Any = None) -> None:
        if not self.broken and self._breaks(statement):
            self.broken = True
            raise OperationalError(
                "the statement",
                {},
                Exception("server closed the connection"),
                connection_invalidated=True,
            )


class _FlakyConnection:
    def __init__(self, conn: Any, engine: _Flaky) -> None:
        self._conn = conn
        self._engine = engine

    def execute(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        result = self._conn.execute(statement, *args, **kwargs)
        self._engine.after(statement, self._conn)
        return result

    def cursor(self) -> Any:
        return _FlakyConnection(self._conn.cursor(), self._engine)

    @property
    def connection(self) -> Any:
        """The driver's connection under a SQLAlchemy one, for the claim (store/raw.py)."""
        return _FlakyConnection(self._conn.connection, self._engine)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def _claim_two_of_three_through(store: JobStore, flaky: _Flaky, what: str) -> None:
    """Claim two of three pending jobs with ``flaky`` as the store's engine: the break
    happened, and the claimer holds exactly the rows left RUNNING."""
    for i in range(3):
        store.enqueue(new_job(f"c{i}"))
    real = store.engine
    store.db.engine = flaky  # type: ignore[assignment]
    try:
        claimed = store.claim("n", ["celery"], 2)
    finally:
        store.db.engine = real
    assert flaky.broken, f"{what} was never lost"
    running = store.list_jobs(status=JobStatus.RUNNING)
    assert sorted(j.job_id for j in claimed) == sorted(j.job_id for j in running)
    assert len(claimed) == 2
    assert real.pool.checkedout() == 0


def test_a_claim_whose_reply_was_lost_is_taken_over(store: JobStore) -> None:
    flaky = _Flaky(
        store.engine,
        lambda sql: (
            "scheduler_job SET status = 'RUNNING'" in str(sql)
            or ("FOR UPDATE SKIP LOCKED" in str(sql) and store.family == "mysql")
        ),
    )
    _claim_two_of_three_through(store, flaky, "the reply to the claim")


def _driver_disconnect(store: JobStore) -> Exception:
    """The driver's own error for a connection gone mid-statement, as its dialect knows it."""
    dbapi = store.engine.dialect.loaded_dbapi
    if store.family == "sqlite":
        return dbapi.ProgrammingError("Cannot operate on a closed database.")
    return dbapi.OperationalError("server closed the connection unexpectedly")


class _Severing(_Flaky):
    """Like :class:`_Flaky`, but the connection is really closed under the statement and the
    driver's own error raised: what the store's driver-level statements (store/raw.py) see."""

    def __init__(self, store: JobStore, breaks: Any) -> None:
        super().__init__(store.engine, breaks)
        self._error = _driver_disconnect(store)

    def after(self, statement: Any, target: Any = None) -> None:
        if self.broken or not self._breaks(statement):
            return
        self.broken = True
        if hasattr(target, "fetchall"):  # a driver cursor: close it, then its connection
            target.close()  # (SQLite keeps a connection with a live statement, and its lock)
            target.connection.close()
        raise self._error


def test_a_claim_whose_driver_connection_is_lost_after_it_ran_is_taken_over(
    store: JobStore,
) -> None:
    """On PostgreSQL the claim committed (autocommit) and the rows are adopted by their
    token; on SQLite the connection closed before COMMIT, so nothing was claimed and the
    retry claims afresh. Either way no row is left RUNNING without its claimer knowing."""
    if store.family == "mysql":
        pytest.skip("MySQL's claim runs through SQLAlchemy: the test above covers it")
    severing = _Severing(store, lambda sql: "scheduler_job SET status = 'RUNNING'" in str(sql))
    _claim_two_of_three_through(store, severing, "the claim's connection")


def test_an_enqueue_whose_reply_was_lost_is_not_a_duplicate(store: JobStore) -> None:
    real = store.engine
    flaky = _Flaky(real, lambda sql: str(sql).startswith("INSERT INTO scheduler_job"))
    store.db.engine = flaky  # type: ignore[assignment]
    try:
        store.enqueue(new_job("once"))
    finally:
        store.db.engine = real
    assert flaky.broken, "the reply to the INSERT was never lost"
    assert store.count_by_status() == {"PENDING": 1}


def test_outcomes_with_text_no_database_stores_are_still_written(store: JobStore) -> None:
    store.enqueue(new_job("nul"))
    [job] = store.claim("n", ["celery"], 1)
    assert (
        store.settle(
            [
                Settlement(
                    "nul",
                    job.token,
                    JobStatus.FAILED,
                    error="bad \x00 byte",
                    traceback="lone \udc80 surrogate",
                )
            ]
        )
        == 1
    )
    record = store.result("nul")
    assert record is not None and record.status is JobStatus.FAILED
    assert "\x00" not in (record.last_error or "") and "surrogate" in (record.error_traceback or "")


def test_a_reschedule_whose_reply_was_lost_is_not_taken_for_a_lost_claim(
    store: JobStore, caplog: Any
) -> None:
    from celery_ratchet.celery.send.amqp import _reschedule

    store.enqueue(new_job("retried"))
    [claimed] = store.claim("n", ["celery"], 1)
    again = new_job("retried", attempts=1)
    assert store.replace_running(claimed.token, again)  # committed; say its reply was lost
    caplog.set_level("WARNING")
    _reschedule(store, claimed.token, again, maybe_committed=True)  # the sender's retry
    assert "was not rescheduled" not in caplog.text
    record = store.result("retried")
    assert record is not None and record.status is JobStatus.PENDING and record.attempts == 1


def test_a_registration_sent_again_after_its_reply_was_lost_registers_the_node(
    store: JobStore,
) -> None:
    """The node's first registration committed, the worker never heard so and registers
    again under the same node id: that must succeed (before, every retry failed on the
    duplicate id and the worker never started claiming)."""
    first = store.register_node("lost-reply-node", "h", 1, ["celery"], 2)
    again = store.register_node("lost-reply-node", "h", 1, ["celery"], 2)
    assert again >= first
    assert [n["node_id"] for n in store.list_nodes()] == ["lost-reply-node"]


def test_a_chain_step_handed_over_whose_reply_was_lost_is_read_back_as_claimed(
    store: JobStore,
) -> None:
    waiting = dataclasses.replace(
        new_job("step-2"), depends_on="step-1", parent_id="step-1", job_type=JobType.CHAIN_STEP
    )
    store.enqueue_many([new_job("step-1")], [waiting])
    store.claim("n", ["celery"], 1)
    # PostgreSQL and SQLite release in one UPDATE ... RETURNING, committed at once; MySQL
    # updates then reads the row back in one transaction, which a break before its commit
    # rolls back. Either way the retry must find the step claimed exactly once.
    # PostgreSQL's and SQLite's run through the driver (store/raw.py): their SQL text.
    handoff = (
        store.handoff._handoff_statement
        if store.family == "mysql"
        else store.handoff._raw_handoff.sql
    )
    real = store.engine
    flaky = _Flaky(real, lambda sql: sql is handoff or (isinstance(sql, str) and sql == handoff))
    store.db.engine = flaky  # type: ignore[assignment]
    try:
        claimed = store.release_step_to(
            dataclasses.replace(new_job("step-2"), parent_id="step-1"), "n"
        )
    finally:
        store.db.engine = real
    assert flaky.broken, "the reply to the hand-over was never lost"
    assert claimed is not None and claimed.job_id == "step-2" and claimed.claims == 1
    [running] = [j for j in store.list_jobs(status=JobStatus.RUNNING) if j.job_id == "step-2"]
    assert running.picked_by == "n"
    # The claim returned is the row's own: it settles.
    assert store.settle([Settlement("step-2", claimed.token, JobStatus.SUCCEEDED)]) == 1


def test_a_group_write_whose_commit_reply_was_lost_is_not_a_duplicate(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many rows (a COPY on PostgreSQL): the write committed, its reply was lost, the try
    again finds its own rows instead of refusing them as taken ids."""
    real = enqueue.transaction
    lost: list[bool] = []

    @contextmanager
    def losing_the_reply(conn: Any) -> Iterator[None]:
        with real(conn):
            yield
        if not lost:
            lost.append(True)
            raise OperationalError(
                "COMMIT", {}, Exception("server closed the connection"), connection_invalidated=True
            )

    monkeypatch.setattr(enqueue, "transaction", losing_the_reply)
    store.enqueue_many([new_job(f"many-{i}") for i in range(25)])
    assert lost, "the reply to the write was never lost"
    assert store.count_by_status() == {"PENDING": 25}
