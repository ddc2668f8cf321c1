"""Small builders shared by the test suites."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from celery_ratchet.domain.job import Message, NewJob

BODY = json.dumps(
    [[1, 2], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
).encode()


def new_job(
    job_id: str | None = None,
    *,
    task: str = "tests.add",
    queue: str = "celery",
    priority: int = 4,
    due: datetime | None = None,
    attempts: int = 0,
    resource: str | None = None,
) -> NewJob:
    job_id = job_id or uuid.uuid4().hex
    headers = {"id": job_id, "task": task, "retries": attempts}
    return NewJob(
        job_id=job_id,
        task_name=task,
        queue=queue,
        priority=priority,
        message=Message(BODY, "application/json", "utf-8", json.dumps(headers), "{}"),
        due=due,
        attempts=attempts,
        resource=resource,
    )


def as_user(admin_url: str, user: str, password: str, database: str | None = None) -> str:
    """The admin's URL with another login (and, when given, another database)."""
    server, _, admin_database = admin_url.rpartition("/")
    scheme = server.partition("://")[0]
    hostport = server.rpartition("@")[2]
    return f"{scheme}://{user}:{password}@{hostport}/{database or admin_database}"


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Return once ``predicate()`` is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@contextmanager
def listening(store: Any, listen_url: str) -> Iterator[tuple[list[str], threading.Event]]:
    """A LISTEN connection to ``listen_url`` whose probe (sent through ``store``) has arrived:
    yields the queues it hears, in order, and an event set at each wake-up."""
    from celery_ratchet.events.postgres import PostgresWakeups
    from celery_ratchet.store.engine import libpq_conninfo

    woken: list[str] = []
    heard = threading.Event()

    def wake(queue: str) -> None:
        woken.append(queue)
        heard.set()

    listener = PostgresWakeups(
        libpq_conninfo(listen_url), probe=store.send_probe, on_silent=store.stop_notifying
    )
    listener.start(wake)
    try:
        wait_until(lambda: listener.heard_probe is True, 60, "the probe to arrive")
        yield woken, heard
    finally:
        listener.stop()


class Tripwire:
    """A listening socket standing in for a broker; counts every connection made to it."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def close(self) -> None:
        self.sock.close()


def handler_fired_while_holding(event: threading.Event, action: Callable[[], None]) -> None:
    """Run ``action`` in a real signal handler while this thread holds ``event``'s lock, as
    a stop signal landing inside ``event.set()`` does: returns once the handler has."""
    handled: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        action()
        handled.append(signum)

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        with event._cond:  # type: ignore[attr-defined]  # what Event.set() holds
            os.kill(os.getpid(), signal.SIGUSR1)
            # Python runs the handler in this thread between two bytecodes, lock held.
            for _ in range(100_000):
                if handled:
                    break
            assert handled == [signal.SIGUSR1]
            assert not event.is_set()
    finally:
        signal.signal(signal.SIGUSR1, previous)
