"""What idle workers are told, and the due time they sleep until.

Idle workers with a wake-up channel look at the store only when told, at the next due time
they read in advance, or at the safety poll: each change that makes work due must announce
itself, and ``next_due_in`` must say when the earliest pending job of some queues is due.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from celery_ratchet.domain.job import (
    PROBE_WAKEUP,
    REVOCATIONS_WAKEUP,
    SCHEDULES_QUEUE,
    JobStatus,
    Settlement,
)
from celery_ratchet.domain.schedule import MasterSpec
from celery_ratchet.events import postgres
from celery_ratchet.events.postgres import PostgresWakeups
from celery_ratchet.runtime import recurring
from celery_ratchet.store.engine import libpq_conninfo
from celery_ratchet.store.job_rows import NOTIFY_CHANNEL
from celery_ratchet.store.jobstore import JobStore
from tests.conftest import Servers, empty_store
from tests.helpers import new_job


def test_next_due_in_is_the_earliest_pending_job_of_the_queues(store: JobStore) -> None:
    assert store.next_due_in(["q"]) is None
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    store.enqueue(new_job(queue="q", due=later))
    store.enqueue(new_job(queue="q", due=later + timedelta(hours=1)))
    store.enqueue(new_job(queue="other"))  # due now, but not in the queues asked about
    due_in = store.next_due_in(["q"])
    # The database's clock, read after ours: up to its resolution past the hour.
    assert due_in is not None and 3000 < due_in <= 3601
    store.enqueue(new_job(queue="q"))
    overdue = store.next_due_in(["q", "more"])
    assert overdue is not None and overdue <= 0
    [claimed] = store.claim("n1", ["q"], 5)  # running: no longer waiting to be due
    assert claimed.queue == "q"
    due_in = store.next_due_in(["q"])
    assert due_in is not None and due_in > 0


class Listener:
    """A LISTEN connection on the wake-up channel, as a worker holds it."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(libpq_conninfo(url), autocommit=True)
        self.conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        self.heard: list[str] = []

    def until(self, payload: str) -> list[str]:
        """Everything heard up to and including ``payload`` (delivered in commit order)."""
        for _ in range(300):
            if payload in self.heard:
                break
            self.heard += [n.payload for n in self.conn.notifies(timeout=0.1)]
        assert payload in self.heard, f"never told {payload!r}; heard {self.heard}"
        index = self.heard.index(payload)
        told, self.heard = self.heard[: index + 1], self.heard[index + 1 :]
        return told

    def marker(self, store: JobStore) -> list[str]:
        """What was told before a fresh enqueue's own notification."""
        queue = f"marker-{uuid.uuid4().hex[:8]}"
        store.enqueue(new_job(queue=queue))
        return self.until(queue)[:-1]


@pytest.fixture
def pg(servers: Servers) -> Iterator[tuple[JobStore, Listener]]:
    url = servers.url("postgresql")
    empty_store(url)
    listener = Listener(url)
    yield JobStore(url, notify=True), listener
    listener.conn.close()


def test_a_revoke_of_a_running_job_is_announced(pg: tuple[JobStore, Listener]) -> None:
    store, listener = pg
    store.enqueue(new_job("waiting", queue="q"))
    store.enqueue(new_job("busy", queue="q2"))
    store.claim("n1", ["q2"], 1)
    listener.marker(store)
    store.request_revoke(["waiting"], "revoked")  # never ran: no node has anything to stop
    assert REVOCATIONS_WAKEUP not in listener.marker(store)
    store.request_revoke(["busy"], "revoked", terminate_signal="SIGTERM")
    assert REVOCATIONS_WAKEUP in listener.marker(store)


def test_a_schedule_changed_in_place_or_resumed_is_announced(
    pg: tuple[JobStore, Listener],
) -> None:
    store, listener = pg
    template = new_job("template", task="tests.tick")

    def register(schedule: str) -> str:
        return recurring.register(
            store,
            "report",
            MasterSpec(schedule, "UTC"),
            task_name="tests.tick",
            priority=4,
            message=template.message,
        )

    assert register("cron:0 0 0 1 1 ? 2099") == "created"
    assert SCHEDULES_QUEUE in listener.marker(store)
    assert register("cron:* * * * * ?") == "updated"
    assert SCHEDULES_QUEUE in listener.marker(store)
    recurring.pause(store, "report")
    assert SCHEDULES_QUEUE not in listener.marker(store)
    recurring.resume(store, "report")
    assert SCHEDULES_QUEUE in listener.marker(store)
    recurring.cancel(store, "report")
    assert register("cron:* * * * * ?") == "revived"
    assert SCHEDULES_QUEUE in listener.marker(store)


def test_retries_hand_backs_and_requeues_are_announced(pg: tuple[JobStore, Listener]) -> None:
    store, listener = pg
    for job_id, queue in (("retried", "r"), ("handed", "h"), ("failed", "f")):
        store.enqueue(new_job(job_id, queue=queue))
    [retried] = store.claim("n1", ["r"], 1)
    [handed] = store.claim("n1", ["h"], 1)
    [failed] = store.claim("n1", ["f"], 1)
    store.settle([Settlement(failed.job_id, failed.token, JobStatus.FAILED, error="boom")])
    listener.marker(store)

    later = datetime.now(timezone.utc) + timedelta(seconds=30)
    assert store.replace_running(retried.token, new_job("retried", queue="r", due=later))
    assert "r" in listener.marker(store)
    store.settle([Settlement(handed.job_id, handed.token, JobStatus.PENDING)])
    assert "h" in listener.marker(store)
    assert store.retry_failed(["failed"]) == 1
    assert "f" in listener.marker(store)
    # Outcomes that make nothing due tell nobody.
    [again] = store.claim("n1", ["h"], 1)
    store.settle([Settlement(again.job_id, again.token, JobStatus.SUCCEEDED)])
    assert "h" not in listener.marker(store)


def test_jobs_recovered_from_a_dead_node_are_announced(pg: tuple[JobStore, Listener]) -> None:
    store, listener = pg
    store.register_node("dead", "h", 1, ["orphaned"], 1)
    store.enqueue(new_job("orphan", queue="orphaned"))
    [claimed] = store.claim("dead", ["orphaned"], 1)
    listener.marker(store)
    recovered = store.recover_orphans(-60)  # every node's heartbeat counts as too old
    assert recovered.requeued == [claimed.job_id] and recovered.queues == ["orphaned"]
    assert "orphaned" in listener.marker(store)


def test_a_probe_reaches_the_listeners(pg: tuple[JobStore, Listener]) -> None:
    store, listener = pg
    store.announce(PROBE_WAKEUP)  # a worker finding out whether it is told anything
    assert PROBE_WAKEUP in listener.marker(store)


def _listener_thread(store: JobStore) -> tuple[PostgresWakeups, list[str]]:
    heard: list[str] = []
    listener = PostgresWakeups(libpq_conninfo(store.url), probe=store.send_probe, probe_timeout=10)
    listener.start(heard.append)
    return listener, heard


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.02)


def test_a_worker_listener_hears_its_probe(pg: tuple[JobStore, Listener]) -> None:
    """psycopg before 3.3 hands a notification that arrives while a statement runs to
    notify handlers only, never to notifies(): the probe sent right after the LISTEN must
    not arrive while the listener reads its settings, or wake-ups are switched off."""
    store, _ = pg
    for _ in range(3):
        listener, _heard = _listener_thread(store)
        try:
            _wait(lambda heard=listener: heard.heard_probe is not None, "an answer to the probe")
            assert listener.heard_probe is True
        finally:
            listener.stop()


def test_a_notification_during_the_keep_alive_statement_wakes(
    pg: tuple[JobStore, Listener], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that ends idle sessions: the listener runs a statement now and then. What is
    notified while that statement runs reaches the node too (here the statement notifies,
    so that a notification surely arrives during it)."""
    store, _ = pg
    monkeypatch.setattr(postgres, "_keep_alive_interval", lambda conn: 0.05)
    monkeypatch.setattr(
        postgres, "KEEP_ALIVE_STATEMENT", f"SELECT pg_notify('{NOTIFY_CHANNEL}', 'kept')"
    )
    listener, heard = _listener_thread(store)
    try:
        _wait(lambda: "kept" in heard, "woken by the notification of the keep-alive statement")
    finally:
        listener.stop()
