"""Business keys are unique among active jobs (PENDING, WAITING, RUNNING), on every database:
a second send of a key creates nothing and learns the holder's id, or raises; once the holder
ends the key is free. The database's unique index decides, not a read before the insert."""

from __future__ import annotations

import dataclasses
import logging
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import bindparam, create_engine, inspect, text

from celery_ratchet.domain.job import JobStatus, NewJob, OnDuplicate, Settlement
from celery_ratchet.domain.schedule import MasterSpec
from celery_ratchet.errors import (
    DuplicateJob,
    SchemaOutdated,
    StoreBusy,
    StoreUnavailable,
    TransactionRolledBack,
)
from celery_ratchet.runtime import recurring
from celery_ratchet.store.ddl import bring_up_to_date
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.memory import MemoryStore
from celery_ratchet.store.schema import ACTIVE_KEY_INDEX, MYSQL_ACTIVE_KEY_COLUMN
from celery_ratchet.store.units import Unit
from tests.helpers import new_job, wait_until


def keyed(key: str, job_id: str | None = None, **changes: object) -> NewJob:
    return dataclasses.replace(new_job(job_id), business_key=key, **changes)  # type: ignore[arg-type]


def rows_with_key(store: JobStore | MemoryStore, key: str) -> list[tuple[str, str]]:
    if isinstance(store, MemoryStore):
        rows = sorted(store.snapshot().jobs.values(), key=lambda r: r.id)
        return [(r.job_id, r.status) for r in rows if r.business_key == key]
    with store.engine.connect() as conn:
        found = conn.execute(
            text("SELECT job_id, status FROM scheduler_job WHERE business_key = :k ORDER BY id"),
            {"k": key},
        )
        return [(r.job_id, r.status) for r in found]


def test_a_second_send_of_an_active_key_creates_nothing_and_names_the_holder(
    store: JobStore,
) -> None:
    assert store.enqueue(keyed("order-42", "first")) == {}
    assert store.enqueue(keyed("order-42", "second")) == {"second": "first"}
    assert rows_with_key(store, "order-42") == [("first", "PENDING")]


def test_on_duplicate_raise_names_the_active_job_and_writes_nothing(store: JobStore) -> None:
    store.enqueue(keyed("order-42", "first"))
    with pytest.raises(DuplicateJob) as raised:
        store.enqueue(keyed("order-42", "second", on_duplicate=OnDuplicate.RAISE))
    assert raised.value.job_id == "first"
    assert raised.value.business_key == "order-42"
    assert "order-42" not in str(raised.value)  # the key may be data; the message names ids
    assert rows_with_key(store, "order-42") == [("first", "PENDING")]


def test_a_running_job_holds_its_key_through_a_retry(store: JobStore) -> None:
    store.enqueue(keyed("tenant-7", "t"))
    [claimed] = store.claim("n", ["celery"], 1)
    assert store.enqueue(keyed("tenant-7")) != {}
    # A retry reschedules the row from a message that carries no key: the row keeps it.
    retry = dataclasses.replace(new_job("t"), due=datetime.now(timezone.utc) + timedelta(hours=1))
    assert store.replace_running(claimed.token, retry)
    assert rows_with_key(store, "tenant-7") == [("t", "PENDING")]
    assert store.enqueue(keyed("tenant-7", "again")) == {"again": "t"}


@pytest.mark.parametrize("ending", [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.REVOKED])
def test_the_key_is_free_once_its_job_ends(store: JobStore, ending: JobStatus) -> None:
    store.enqueue(keyed("hook-1", "old"))
    if ending is JobStatus.REVOKED:
        store.request_revoke(["old"], '{"exc_type": "TaskRevokedError"}')
    else:
        [claimed] = store.claim("n", ["celery"], 1)
        store.settle([Settlement("old", claimed.token, ending)])
    assert store.enqueue(keyed("hook-1", "new")) == {}
    assert rows_with_key(store, "hook-1") == [("old", ending.value), ("new", "PENDING")]


def test_a_finished_job_id_sent_again_follows_the_holder_of_its_key(store: JobStore) -> None:
    store.enqueue(keyed("k", "done"))
    [claimed] = store.claim("n", ["celery"], 1)
    store.settle([Settlement("done", claimed.token, JobStatus.SUCCEEDED)])
    store.enqueue(keyed("k", "holder"))
    # Re-arming the finished row would make a second active job of the key.
    assert store.enqueue(keyed("k", "done")) == {"done": "holder"}
    assert rows_with_key(store, "k") == [("done", "SUCCEEDED"), ("holder", "PENDING")]


def test_many_at_once_keep_one_job_per_key_and_insert_the_rest(store: JobStore) -> None:
    store.enqueue(keyed("a", "a-held"))
    jobs = [keyed("a", "a1"), keyed("b", "b1"), new_job("plain"), keyed("b", "b2")]
    assert store.enqueue_many(jobs) == {"a1": "a-held", "b2": "b1"}
    assert rows_with_key(store, "a") == [("a-held", "PENDING")]
    assert rows_with_key(store, "b") == [("b1", "PENDING")]
    assert store.result("plain") is not None


def test_raise_inside_many_writes_none_of_them(store: JobStore) -> None:
    store.enqueue(keyed("a", "a-held"))
    jobs = [new_job("plain"), keyed("a", "a1", on_duplicate=OnDuplicate.RAISE)]
    with pytest.raises(DuplicateJob):
        store.enqueue_many(jobs)
    assert store.result("plain") is None


def test_a_chain_whose_first_step_key_is_held_is_refused_whole(store: JobStore) -> None:
    store.enqueue(keyed("a", "a-held"))
    step = dataclasses.replace(new_job("step-2"), depends_on="head", parent_id="head")
    with pytest.raises(DuplicateJob, match="chain"):
        store.enqueue_many([keyed("a", "head")], [step])
    assert store.result("step-2") is None


def test_a_recurring_master_does_not_hold_its_key_for_jobs(store: JobStore) -> None:
    spec = MasterSpec("every:60")
    recurring.register(store, "report", spec, task_name="t", priority=4, message=new_job().message)
    assert store.enqueue(keyed("report", "one-off")) == {}


@pytest.fixture
def own_engine(store: JobStore) -> Iterator[object]:
    engine = create_engine(store.engine.url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE bk_orders (id INTEGER)"))
    try:
        yield engine
    finally:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE bk_orders"))
        engine.dispose()


def test_a_held_key_inside_a_callers_transaction_leaves_it_usable(
    store: JobStore, own_engine: object
) -> None:
    store.enqueue(keyed("order-42", "first"))
    engine = own_engine
    with engine.begin() as conn:  # type: ignore[attr-defined]
        conn.execute(text("INSERT INTO bk_orders (id) VALUES (1)"))
        held = store.enqueue_within(Unit(conn), [keyed("order-42", "second"), keyed("new", "n")])
        assert held == {"second": "first"}
        # PostgreSQL would refuse every further statement of an aborted transaction.
        conn.execute(text("INSERT INTO bk_orders (id) VALUES (2)"))
        with pytest.raises(DuplicateJob):
            store.enqueue_within(
                Unit(conn), [keyed("order-42", "third", on_duplicate=OnDuplicate.RAISE)]
            )
        conn.execute(text("INSERT INTO bk_orders (id) VALUES (3)"))
    with engine.connect() as conn:  # type: ignore[attr-defined]
        assert conn.execute(text("SELECT COUNT(*) FROM bk_orders")).scalar() == 3
    assert rows_with_key(store, "order-42") == [("first", "PENDING")]
    assert rows_with_key(store, "new") == [("n", "PENDING")]


def _drop_active_key_index(store: JobStore) -> None:
    with store.engine.connect() as conn:
        if store.family == "mysql":
            conn.execute(text(f"ALTER TABLE scheduler_job DROP INDEX {ACTIVE_KEY_INDEX}"))
            conn.execute(text(f"ALTER TABLE scheduler_job DROP COLUMN {MYSQL_ACTIVE_KEY_COLUMN}"))
        else:
            conn.execute(text(f"DROP INDEX {ACTIVE_KEY_INDEX}"))


def _index_present(store: JobStore) -> bool:
    with store.engine.connect() as conn:
        return ACTIVE_KEY_INDEX in {i["name"] for i in inspect(conn).get_indexes("scheduler_job")}


def _written_by_an_older_version(store: JobStore, key: str, *job_ids: str) -> None:
    for job_id in job_ids:
        store.enqueue(new_job(job_id))
    with store.engine.connect() as conn:
        conn.execute(
            text("UPDATE scheduler_job SET business_key = :k WHERE job_id IN :ids").bindparams(
                bindparam("ids", expanding=True)
            ),
            {"k": key, "ids": list(job_ids)},
        )


def test_an_older_table_gets_the_unique_index_through_the_upgrade(store: JobStore) -> None:
    _drop_active_key_index(store)
    _written_by_an_older_version(store, "k", "one")
    assert any(ACTIVE_KEY_INDEX in p for p in store.schema_differences())
    with store.engine.connect() as conn:
        added = bring_up_to_date(conn)
    assert f"index {ACTIVE_KEY_INDEX}" in added
    assert store.schema_differences() == []
    assert store.enqueue(keyed("k", "two")) == {"two": "one"}


def test_an_upgrade_over_duplicate_active_keys_says_which_jobs(store: JobStore) -> None:
    _drop_active_key_index(store)
    # What an earlier version let through: two active jobs of one key.
    _written_by_an_older_version(store, "k", "one", "two")
    with store.engine.connect() as conn, pytest.raises(SchemaOutdated) as raised:
        bring_up_to_date(conn)
    message = str(raised.value)
    assert "'one'" in message and "'two'" in message and "ratchet jobs cancel" in message
    assert not _index_present(store)
    store.request_revoke(["two"], '{"exc_type": "TaskRevokedError"}')
    with store.engine.connect() as conn:
        bring_up_to_date(conn)
    assert _index_present(store)
    assert store.schema_differences() == []


def test_duplicate_active_keys_of_an_older_version_do_not_stop_a_process_starting(
    store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    _drop_active_key_index(store)
    _written_by_an_older_version(store, "k", "one", "two")
    starting = JobStore(str(store.engine.url.render_as_string(hide_password=False)))
    try:
        with caplog.at_level(logging.WARNING, logger="celery_ratchet.store.ddl"):
            starting.ensure_schema()  # a worker or a client starting up: no error
        assert "'one'" in caplog.text and "'two'" in caplog.text
        assert "ratchet jobs cancel" in caplog.text
        assert not _index_present(store)
        starting.enqueue(new_job("plain"))  # sends without a key go on
        claimed = {c.job_id: c for c in starting.claim("n", ["celery"], 5)}
        assert set(claimed) == {"one", "two", "plain"}  # and workers run them
        if starting.family != "mysql":  # MySQL/MariaDB: inserted (the column is what they lack)
            with pytest.raises(SchemaOutdated, match="schema apply"):
                starting.enqueue(keyed("k2", "keyed"))
            assert starting.result("keyed") is None
        two = claimed["two"]
        starting.settle([Settlement(two.job_id, two.token, JobStatus.SUCCEEDED)])
    finally:
        starting.engine.dispose()
    later = JobStore(str(store.engine.url.render_as_string(hide_password=False)))
    try:
        later.ensure_schema()  # the next start, once the extra job has ended
        assert _index_present(store)
    finally:
        later.engine.dispose()


def test_a_dead_letter_retry_leaves_a_job_whose_key_is_held_failed(store: JobStore) -> None:
    store.enqueue(keyed("k", "dead"))
    store.enqueue(new_job("other-dead"))
    for claimed in store.claim("n", ["celery"], 2):
        store.settle([Settlement(claimed.job_id, claimed.token, JobStatus.FAILED)])
    store.enqueue(keyed("k", "holder"))
    assert store.retry_failed() == 1
    assert rows_with_key(store, "k") == [("dead", "FAILED"), ("holder", "PENDING")]
    assert store.result("other-dead").status is JobStatus.PENDING  # type: ignore[union-attr]


def test_a_missing_index_is_a_clear_error_not_a_driver_error(store: JobStore) -> None:
    if store.family == "mysql":
        pytest.skip("MySQL/MariaDB insert without the index; the column is what they lack")
    _drop_active_key_index(store)
    with pytest.raises(SchemaOutdated, match="schema apply"):
        store.enqueue(keyed("k", "one"))


def test_unique_ids_are_unaffected(store: JobStore) -> None:
    job_id = uuid.uuid4().hex
    store.enqueue(keyed("k", job_id))
    with pytest.raises(DuplicateJob) as raised:
        store.enqueue(new_job(job_id))  # the id is taken by an active job
    assert raised.value.business_key is None


def _end_without_waiting(store: JobStore, job_id: str) -> None:
    """End ``job_id`` on a connection that gives up at once on a row lock held elsewhere."""
    engine = create_engine(store.engine.url)
    try:
        with engine.begin() as conn:
            if store.family == "mysql":
                conn.execute(text("SET SESSION innodb_lock_wait_timeout = 1"))
            elif store.family == "postgresql":
                conn.execute(text("SET LOCAL lock_timeout = '1s'"))
            conn.execute(
                text("UPDATE scheduler_job SET status = 'SUCCEEDED' WHERE job_id = :j"),
                {"j": job_id},
            )
    finally:
        engine.dispose()


def test_a_held_key_inside_a_callers_transaction_does_not_lock_the_holder(
    store: JobStore, own_engine: object
) -> None:
    if store.family == "sqlite":
        pytest.skip("SQLite: the caller's write transaction holds the whole database anyway")
    store.enqueue(keyed("order-42", "first"))
    with own_engine.begin() as conn:  # type: ignore[attr-defined]
        assert store.enqueue_within(Unit(conn), [keyed("order-42", "second")]) == {
            "second": "first"
        }
        with pytest.raises(DuplicateJob):
            store.enqueue_within(
                Unit(conn), [keyed("order-42", "third", on_duplicate=OnDuplicate.RAISE)]
            )
        # The holder's worker records its outcome while the caller's transaction is open.
        _end_without_waiting(store, "first")
    assert rows_with_key(store, "order-42") == [("first", "SUCCEEDED")]


def test_a_key_held_since_a_repeatable_read_callers_snapshot_names_the_holder(
    store: JobStore, own_engine: object
) -> None:
    if store.family == "sqlite":
        pytest.skip("SQLite has one writer: no holder can commit after the caller's snapshot")
    engine = own_engine.execution_options(isolation_level="REPEATABLE READ")  # type: ignore[attr-defined]
    with engine.connect() as conn:
        with conn.begin():
            conn.execute(text("SELECT COUNT(*) FROM bk_orders"))  # the snapshot is taken
            store.enqueue(keyed("order-42", "first"))  # committed after it
            held = store.enqueue_within(Unit(conn), [keyed("order-42", "second")])
            assert held == {"second": "first"}
            conn.execute(text("INSERT INTO bk_orders (id) VALUES (1)"))
        assert conn.execute(text("SELECT COUNT(*) FROM bk_orders")).scalar() == 1
    assert rows_with_key(store, "order-42") == [("first", "PENDING")]


def test_a_key_an_open_transaction_holds_past_the_lock_wait_is_store_busy_not_a_driver_error(
    store: JobStore, own_engine: object
) -> None:
    """Two callers' transactions send the same key: the second waits for the first's
    uncommitted row. Past its lock wait limit it gets StoreBusy, which says what happened and
    what to do, and its own transaction goes on without the send."""
    if store.family == "sqlite":
        pytest.skip("SQLite has one writer: the second transaction cannot even begin its write")
    engine = own_engine  # type: Any
    key = f"order-{uuid.uuid4().hex}"
    with engine.connect() as first, engine.connect() as second, first.begin():
        store.enqueue_within(Unit(first), [keyed(key, "first")])
        with second.begin():
            if store.family == "mysql":
                second.execute(text("SET SESSION innodb_lock_wait_timeout = 1"))
            else:
                second.execute(text("SET LOCAL lock_timeout = '200ms'"))
            with pytest.raises(StoreBusy) as raised:
                store.enqueue_within(Unit(second), [keyed(key, "second")])
            message = str(raised.value)
            assert "lock" in message and "your transaction" in message
            # Neither the error nor the driver's error chained to it shows the key.
            shown = "".join(traceback.format_exception(raised.value))
            assert key not in shown and "parameters hidden" in shown
            second.execute(text("INSERT INTO bk_orders (id) VALUES (7)"))
    with engine.connect() as conn:  # the second caller's own write committed
        assert conn.execute(text("SELECT COUNT(*) FROM bk_orders")).scalar() == 1
    assert rows_with_key(store, key) == [("first", "PENDING")]


def _waiting_on_a_lock(engine: Any, family: str) -> bool:
    with engine.connect() as conn:
        if family == "mysql":
            sql = "SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'"
        else:
            sql = "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        return bool(conn.execute(text(sql)).scalar())


def test_a_deadlock_between_two_callers_transactions_is_the_stores_error(
    store: JobStore, own_engine: object
) -> None:
    """Two callers' transactions send two keys in opposite order: one of them is chosen to
    end the deadlock. On PostgreSQL only its send is undone (a savepoint holds it), and it
    gets StoreBusy; MySQL/MariaDB roll its whole transaction back, and it gets
    TransactionRolledBack, which says so. Neither shows the keys or the job's data."""
    if store.family == "sqlite":
        pytest.skip("SQLite has one writer: two transactions never hold locks at once")
    engine = own_engine  # type: Any
    one, two = f"key-{uuid.uuid4().hex}", f"key-{uuid.uuid4().hex}"
    outcomes: dict[str, object] = {}
    with engine.connect() as first, engine.connect() as second:
        first.begin()
        second.begin()
        store.enqueue_within(Unit(first), [keyed(one, "first-a")])
        store.enqueue_within(Unit(second), [keyed(two, "second-b")])

        def send(name: str, conn: Any, key: str, job_id: str) -> None:
            try:
                outcomes[name] = store.enqueue_within(Unit(conn), [keyed(key, job_id)])
            except Exception as exc:
                outcomes[name] = exc

        senders = {
            "first": threading.Thread(target=send, args=("first", first, two, "first-b")),
            "second": threading.Thread(target=send, args=("second", second, one, "second-a")),
        }
        senders["first"].start()
        wait_until(lambda: _waiting_on_a_lock(engine, store.family), 30, "a send waiting")
        senders["second"].start()
        # The victim's error comes first; the other send waits until the victim's
        # transaction ends (on PostgreSQL it holds what it sent before).
        wait_until(
            lambda: any(isinstance(o, Exception) for o in outcomes.values()), 60, "a deadlock"
        )
        [victim_name] = [n for n, o in outcomes.items() if isinstance(o, Exception)]
        survivor_name = "second" if victim_name == "first" else "first"
        victim = first if victim_name == "first" else second
        senders[victim_name].join(60)
        _end_victim(victim, store.family)
        senders[survivor_name].join(60)
        (second if victim is first else first).commit()
    error = outcomes[victim_name]
    assert not isinstance(outcomes[survivor_name], Exception), outcomes
    expected = TransactionRolledBack if store.family == "mysql" else StoreBusy
    assert type(error) is expected, repr(error)
    shown = "".join(traceback.format_exception(error))  # type: ignore[arg-type]
    assert one not in shown and two not in shown and "parameters hidden" in shown
    kept = {job for key in (one, two) for job, _ in rows_with_key(store, key)}
    if store.family == "mysql":  # the victim's transaction is gone; the other's sends stand
        assert kept == (
            {"first-a", "first-b"} if victim_name == "second" else {"second-b", "second-a"}
        )
    else:  # the victim's transaction went on and committed what it sent before
        assert kept == {"first-a", "second-b"}


def _end_victim(conn: Any, family: str) -> None:
    """MySQL/MariaDB rolled the victim's transaction back; on PostgreSQL it goes on."""
    if family == "mysql":
        conn.rollback()
    else:
        conn.commit()


def test_a_callers_connection_lost_in_its_transaction_says_the_transaction_ended(
    store: JobStore, own_engine: object
) -> None:
    """The server ends the caller's session inside its transaction: the send raises
    StoreUnavailable saying nothing of that transaction was committed (not "may have been"),
    and shows neither the key nor the job's data."""
    if store.family != "postgresql":
        pytest.skip("ends another session with pg_terminate_backend")
    engine = own_engine  # type: Any
    key = f"key-{uuid.uuid4().hex}"
    with engine.connect() as conn:
        conn.begin()
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
        with engine.connect() as admin:
            admin.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            admin.commit()
        with pytest.raises(StoreUnavailable) as raised:
            store.enqueue_within(Unit(conn), [keyed(key, "lost")])
    message = str(raised.value)
    assert "nothing written in it was committed" in message and "may have been" not in message
    assert raised.value.outcome_unknown is False
    assert key not in "".join(traceback.format_exception(raised.value))
    assert rows_with_key(store, key) == []


def test_a_dead_letter_retry_that_leaves_a_job_failed_leaves_its_chain_revoked(
    store: JobStore,
) -> None:
    """The chain steps a failed job's failure revoked wait for it again only when it is
    requeued: one left FAILED (its key held meanwhile) keeps them revoked, as they were."""
    step = dataclasses.replace(new_job("step"), depends_on="head")
    store.enqueue_many([keyed("k", "head")], waiting=[step])
    [head] = store.claim("n", ["celery"], 1)
    store.settle([Settlement(head.job_id, head.token, JobStatus.FAILED)])
    assert store.result("step").status is JobStatus.REVOKED  # type: ignore[union-attr]
    store.enqueue(keyed("k", "holder"))
    assert store.retry_failed() == 0
    assert rows_with_key(store, "k") == [("head", "FAILED"), ("holder", "PENDING")]
    assert store.result("step").status is JobStatus.REVOKED  # type: ignore[union-attr]


def test_a_job_purged_while_its_dead_letter_retry_reads_it_leaves_its_chain_revoked(
    store: JobStore, open_store: Callable[[], JobStore]
) -> None:
    """The page of failed jobs is read before the requeue's transaction: one purged by
    another client in between is not requeued, and its chain steps stay revoked."""
    step = dataclasses.replace(new_job("step"), depends_on="head")
    store.enqueue_many([new_job("head"), new_job("other")], waiting=[step])
    for claimed in store.claim("n", ["celery"], 2):
        store.settle([Settlement(claimed.job_id, claimed.token, JobStatus.FAILED)])
    other_client = open_store()

    def purged_meanwhile(headers: str) -> str:
        other_client.purge_failed(["head"])
        return headers

    assert store.retry_failed(rewrite_headers=purged_meanwhile) == 1
    assert store.result("head") is None
    assert store.result("other").status is JobStatus.PENDING  # type: ignore[union-attr]
    assert store.result("step").status is JobStatus.REVOKED  # type: ignore[union-attr]
