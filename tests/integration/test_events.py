"""Celery task events over the events Redis: what ``celery events`` and Flower read."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

from celery import Celery, group

import celery_ratchet
from tests.conftest import Servers, empty_store
from tests.integration.conftest import BrokerTrap, make_app, worker_running
from tests.integration.test_wakeups import REDIS, _redis_reachable

TASK_EVENTS = {
    "task-sent", "task-received", "task-started", "task-succeeded", "task-failed",
    "task-retried",
}  # fmt: skip


class Capture:
    """An event receiver, as ``celery -A app events`` runs one, in a thread."""

    def __init__(self, app: Celery) -> None:
        self.by_task: dict[str, set[str]] = defaultdict(set)
        #: Each task's events by type, as received.
        self.events: dict[tuple[str, str], dict[str, Any]] = {}
        self.types: set[str] = set()
        self.ready = threading.Event()
        with app.connection_for_read() as conn:  # the app's (in-process) broker connection
            self.receiver = app.events.Receiver(conn, handlers={"*": self._on_event})
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _on_event(self, event: dict[str, Any]) -> None:
        self.types.add(event["type"])
        if "uuid" in event:
            self.by_task[event["uuid"]].add(event["type"])
            self.events[event["uuid"], event["type"]] = event

    def _run(self) -> None:
        for _ in self.receiver.consume(limit=None, timeout=None, wakeup=False):
            self.ready.set()

    def wait_for(self, task_id: str, wanted: set[str], timeout: float = 30) -> set[str]:
        deadline = time.monotonic() + timeout
        while not wanted <= self.by_task[task_id] and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.by_task[task_id]

    def stop(self) -> None:
        self.receiver.should_stop = True


def test_workers_and_clients_send_celery_events_over_redis(
    servers: Servers, broker_trap: BrokerTrap
) -> None:
    _redis_reachable()
    url = empty_store(servers.url("sqlite")).url
    app = make_app(
        url,
        broker_trap.url,
        ratchet_events_url=REDIS,
        worker_send_task_events=True,
        task_send_sent_event=True,
    )
    celery_ratchet.install(app)  # as `celery -A app events` does before it reads events
    capture = Capture(app)
    assert capture.ready.wait(10) or True  # consuming starts at once; no event needed
    time.sleep(0.5)  # the receiver's queue is bound before anything is sent
    try:
        with worker_running(app):
            ok = app.tasks["t.add"].delay(1, 2)
            failed = app.tasks["t.fail"].delay("boom")
            retried = app.tasks["t.flaky"].delay("events-flaky", 1)
            assert ok.get(timeout=30) == 3
            assert retried.get(timeout=30) == "done after 1"
            failed.get(timeout=30, propagate=False)
            seen = capture.wait_for(ok.id, {"task-sent", "task-received", "task-started",
                                           "task-succeeded"})  # fmt: skip
            assert {"task-sent", "task-received", "task-started", "task-succeeded"} <= seen
            # The seeds' types: the execution type stored with the job, and its public type.
            for kind in ("task-sent", "task-received"):
                event = capture.events[ok.id, kind]
                assert (event["job_type"], event["public_type"]) == ("SINGLE", "SINGLE")
            grouped = group(app.tasks["t.add"].si(1, 1), app.tasks["t.add"].si(2, 2))()
            assert grouped.get(timeout=30) == [2, 4]
            member = grouped.results[0].id
            capture.wait_for(member, {"task-sent", "task-received"})
            for kind in ("task-sent", "task-received"):
                event = capture.events[member, kind]
                assert (event["job_type"], event["public_type"]) == ("BATCH_CHILD", "BATCH")
            assert "task-failed" in capture.wait_for(failed.id, {"task-failed"})
            assert "task-retried" in capture.wait_for(retried.id, {"task-retried"})
    finally:
        capture.stop()
    assert capture.types >= TASK_EVENTS
    assert broker_trap.connections == 0, "events went over the broker URL"
