"""Dead-letter alert windows on the three databases: every job failing for good is counted
into exactly one window of its task name, and each window's alert job is written once,
however many nodes close it at once (threads, then processes)."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import text

from celery_ratchet.domain.dlq_alert import DUE, SENT, AlertWindow, alert_id, summarize
from celery_ratchet.domain.job import JobStatus, NewJob, Settlement, error_record
from celery_ratchet.runtime.dlq import DeadLetterQueue
from celery_ratchet.store.jobstore import JobStore
from tests.helpers import new_job, wait_until

ALERT_TASK = "tests.on_dead_letters"


@pytest.fixture
def alerting(open_store: Callable[..., JobStore]) -> JobStore:
    """A store on the emptied database that counts dead letters."""
    return open_store(dlq_alert_task=ALERT_TASK)


def _error(n: int) -> str:
    return error_record("ValueError", [f"card {n} declined"], "builtins")


def fail(store: JobStore, job_id: str, task: str = "shop.charge", *, via: str = "outcome") -> None:
    """Enqueue, claim and fail one job for good, as the result backend or the worker would."""
    queue = f"q-{job_id}"
    store.enqueue(new_job(job_id, task=task, queue=queue))
    # MySQL's SKIP LOCKED may pass over a new row while other transactions lock near it.
    taken: list[Any] = []
    wait_until(lambda: taken.extend(store.claim("node-a", [queue], 1)) or taken, 10, "the claim")
    [claimed] = taken
    if via == "outcome":
        assert store.store_outcome(job_id, claimed.token, JobStatus.FAILED, error=_error(1))
    else:
        settled = Settlement(job_id, claimed.token, JobStatus.FAILED, error=_error(2))
        assert store.settle([settled]) == 1


class Alerts:
    """The alert job factory: records every summary it is asked to send."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, window: AlertWindow, job_ids: list[str], now: datetime) -> NewJob:
        summary = summarize(window, job_ids, now, 0).as_message()
        with self.lock:
            self.sent.append(summary)
        return new_job(alert_id(window), task=ALERT_TASK)


def _open_count(store: JobStore, task: str) -> int:
    state = store.alert_states([task]).get(task)
    return state.failed if state else 0


def _alert_jobs(store: JobStore) -> int:
    with store.engine.connect() as conn:
        query = text("SELECT COUNT(*) FROM scheduler_job WHERE task_name = :t")
        return int(conn.execute(query, {"t": ALERT_TASK}).scalar_one())


def test_jobs_failing_for_good_are_counted_into_their_task_names_window(
    alerting: JobStore,
) -> None:
    fail(alerting, "a1", via="outcome")
    fail(alerting, "a2", via="settle")
    fail(alerting, "b1", task="shop.refund")

    states = alerting.alert_states(["shop.charge", "shop.refund"])
    assert (states["shop.charge"].failed, states["shop.refund"].failed) == (2, 1)
    first = alerting.result("a1")
    assert first is not None and states["shop.charge"].opened_at == first.finished_at


def test_a_failure_the_backend_stored_and_the_worker_then_settled_counts_once(
    alerting: JobStore,
) -> None:
    alerting.enqueue(new_job("twice", queue="q-twice"))
    [claimed] = alerting.claim("node-a", ["q-twice"], 1)
    assert alerting.store_outcome("twice", claimed.token, JobStatus.FAILED, error=_error(1))
    alerting.settle([Settlement("twice", claimed.token, JobStatus.FAILED, error=_error(1))])
    assert _open_count(alerting, "tests.add") == 1


def test_nothing_is_counted_without_an_alert_task(store: JobStore) -> None:
    fail(store, "quiet")
    assert store.alert_states(["shop.charge"]) == {}


def test_the_alert_tasks_own_failures_do_not_alert_again(alerting: JobStore) -> None:
    fail(alerting, "alert-failed", task=ALERT_TASK)
    assert alerting.alert_states([ALERT_TASK]) == {}


def test_a_window_is_not_closed_before_its_interval(alerting: JobStore) -> None:
    fail(alerting, "early")
    assert alerting.due_alert_windows(3600) == []
    assert alerting.close_alert_window("shop.charge", 3600, Alerts()) is None
    assert _open_count(alerting, "shop.charge") == 1


def test_closing_sends_one_summary_and_the_next_failure_opens_the_next_window(
    alerting: JobStore,
) -> None:
    alerts = Alerts()
    for i in range(3):
        fail(alerting, f"w1-{i}")
    assert alerting.due_alert_windows(0) == ["shop.charge"]

    sent = alerting.close_alert_window("shop.charge", 0, alerts)

    assert sent is not None and sent.task_name == ALERT_TASK
    [summary] = alerts.sent
    assert summary["count"] == 3
    assert sorted(summary["job_ids"]) == ["w1-0", "w1-1", "w1-2"]
    assert summary["newest_error"] is not None and "card 1 declined" in summary["newest_error"]
    state = alerting.alert_states(["shop.charge"])["shop.charge"]
    assert (state.opened_at, state.failed, state.last_count) == (None, 0, 3)
    assert state.last_alert_id == sent.job_id
    assert alerting.result(sent.job_id) is not None  # the alert job, due now
    assert alerting.close_alert_window("shop.charge", 0, alerts) is None  # nothing open

    fail(alerting, "w2-0")
    assert _open_count(alerting, "shop.charge") == 1
    letters = DeadLetterQueue(alerting)
    shown = letters.alerts_of(letters.list(task_name="shop.charge"))
    assert shown == {"w1-0": SENT, "w1-1": SENT, "w1-2": SENT, "w2-0": DUE}


def test_dead_letters_of_orphan_recovery_are_counted(alerting: JobStore) -> None:
    alerting.register_node("dead", "h", 1, ["celery"], 1)
    alerting.enqueue(new_job("poison", task="shop.crash"))
    alerting.claim("dead", ["celery"], 1)
    with alerting.engine.begin() as conn:
        conn.execute(
            text("UPDATE scheduler_node SET heartbeat_ts = :t"), {"t": datetime(2000, 1, 1)}
        )
    recovered = alerting.recover_orphans(1.0, max_recoveries=0)
    assert recovered.dead_lettered == ["poison"]
    assert _open_count(alerting, "shop.crash") == 1


def _close_race(url: str, barrier: Any) -> int:
    """One node closing the window at the same moment as the others: 1 if it sent the alert."""
    store = JobStore(url, dlq_alert_task=ALERT_TASK)
    store.ensure_schema()
    barrier.wait()
    return 0 if store.close_alert_window("shop.charge", 0, Alerts()) is None else 1


def test_eight_threads_closing_one_window_at_once_send_one_alert(
    alerting: JobStore, db_url: str
) -> None:
    for i in range(5):
        fail(alerting, f"t-{i}")
    barrier = threading.Barrier(8)
    won: list[int] = []
    threads = [
        threading.Thread(target=lambda: won.append(_close_race(db_url, barrier))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won) == [0] * 7 + [1]
    assert _alert_jobs(alerting) == 1
    assert alerting.alert_states(["shop.charge"])["shop.charge"].last_count == 5


def test_four_processes_closing_one_window_at_once_send_one_alert(
    alerting: JobStore, db_url: str
) -> None:
    for i in range(5):
        fail(alerting, f"p-{i}")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(4)
        with ctx.Pool(4) as pool:
            won = pool.starmap(_close_race, [(db_url, barrier)] * 4)
    assert sorted(won) == [0, 0, 0, 1]
    assert _alert_jobs(alerting) == 1


def test_no_failure_is_dropped_while_windows_keep_closing(alerting: JobStore, db_url: str) -> None:
    """Four threads fail 25 jobs each while two others close the window as fast as they can:
    the alerts' counts and the open window's add up to the 100 failures."""
    alerts = Alerts()
    failing_done = threading.Event()
    errors: list[BaseException] = []

    def failing(k: int) -> None:
        store = JobStore(db_url, dlq_alert_task=ALERT_TASK)
        try:
            for i in range(25):
                fail(store, f"race-{k}-{i}", via="outcome" if i % 2 else "settle")
                # Each failer goes on only once windows have closed meanwhile, so that some
                # close while failures keep coming, however the threads are scheduled.
                if i in (8, 16):
                    closed = 1 if i == 8 else 2
                    wait_until(lambda n=closed: len(alerts.sent) >= n, 30, f"{closed} closed")
        except BaseException as exc:
            errors.append(exc)

    def closing() -> None:
        store = JobStore(db_url, dlq_alert_task=ALERT_TASK)
        try:
            while not failing_done.is_set():
                store.close_alert_window("shop.charge", 0, alerts)
        except BaseException as exc:
            errors.append(exc)

    closers = [threading.Thread(target=closing) for _ in range(2)]
    failers = [threading.Thread(target=failing, args=(k,)) for k in range(4)]
    for t in closers + failers:
        t.start()
    for t in failers:
        t.join()
    failing_done.set()
    for t in closers:
        t.join()

    assert errors == []
    assert len(alerts.sent) >= 2, "windows should have closed while jobs were failing"
    counted = sum(s["count"] for s in alerts.sent) + _open_count(alerting, "shop.charge")
    assert counted == 100
    assert _alert_jobs(alerting) == len(alerts.sent)


def test_an_existing_database_without_the_alert_table_gets_it(store: JobStore, db_url: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("DROP TABLE scheduler_dlq_alert"))
    later = JobStore(db_url, dlq_alert_task=ALERT_TASK)
    later.ensure_schema()
    assert "missing table scheduler_dlq_alert" not in later.schema_differences()
    fail(later, "after-upgrade")
    assert _open_count(later, "shop.charge") == 1
