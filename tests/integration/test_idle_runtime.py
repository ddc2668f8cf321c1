"""An idle node with a wake-up channel: it looks at the store when told, at due times it read
in advance, and at the safety poll (here an hour away, so only the first two can act)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone

import pytest

from celery_ratchet.domain.job import REVOCATIONS_WAKEUP, ClaimedJob, JobStatus, Settlement
from celery_ratchet.runtime.base import Capacity
from celery_ratchet.runtime.worker import WorkerRuntime
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.jobstore import JobStore
from tests.helpers import new_job
from tests.integration.test_runtime import wait_for

TOLD_ONLY = RatchetSettings(poll_interval=0.1, wakeup_poll_interval=3600.0)


class Channel:
    """A wake-up source the test speaks through; ``live`` as if subscribed or not, and
    ``delivers`` as if what is announced arrives (not so behind a transaction pooler)."""

    def __init__(self, live: bool, delivers: bool) -> None:
        self.live = live
        self.delivers = delivers
        self.wake: Callable[[str], None] | None = None

    def start(self, wake: Callable[[str], None]) -> None:
        self.wake = wake

    def announce(self, words: list[str]) -> None:
        if self.live and self.delivers and self.wake is not None:
            for word in words:
                self.wake(word)

    def stop(self) -> None:
        pass


class Executor:
    """Runs jobs by handing them to ``behaviour``; remembers each start."""

    def __init__(self, behaviour: Callable[[WorkerRuntime, ClaimedJob, int], None]) -> None:
        self.behaviour = behaviour
        self.starts: list[str] = []
        self.runtime: WorkerRuntime | None = None
        self._lock = threading.Lock()

    def __call__(self, job: ClaimedJob) -> None:
        with self._lock:
            self.starts.append(job.job_id)
            count = self.starts.count(job.job_id)
        assert self.runtime is not None
        self.behaviour(self.runtime, job, count)


def succeed(runtime: WorkerRuntime, job: ClaimedJob, _: int) -> None:
    runtime.settle(Settlement(job.job_id, job.token, JobStatus.SUCCEEDED))


@pytest.fixture
def node(store: JobStore) -> Iterator[Callable[..., tuple[WorkerRuntime, Executor, Channel]]]:
    started: list[WorkerRuntime] = []

    def start(
        behaviour: Callable[[WorkerRuntime, ClaimedJob, int], None] = succeed,
        *,
        live: bool = True,
        delivers: bool = True,
        on_revoke: Callable[[str, str], None] | None = None,
    ) -> tuple[WorkerRuntime, Executor, Channel]:
        executor, channel = Executor(behaviour), Channel(live, delivers)
        runtime = WorkerRuntime(
            store,
            TOLD_ONLY,
            node_id=f"idle-{len(started)}",
            queues=["celery"],
            capacity=Capacity(running=2, buffered=2),
            dispatch=executor,
            on_revoke=on_revoke,
            wakeups=[channel],
        )
        executor.runtime = runtime
        runtime.start()
        started.append(runtime)
        return runtime, executor, channel

    yield start
    for runtime in started:
        runtime.close(timeout=10)


def test_a_job_due_later_is_claimed_when_due(store: JobStore, node) -> None:  # type: ignore[no-untyped-def]
    store.enqueue(new_job("later", due=datetime.now(timezone.utc) + timedelta(seconds=1)))
    _, executor, _ = node()  # its first claim finds nothing due, and reads when it will be
    wait_for(lambda: store.count_by_status() == {"SUCCEEDED": 1}, 60)
    assert executor.starts == ["later"]


def test_a_retry_of_its_own_job_is_claimed_again(store: JobStore, node) -> None:  # type: ignore[no-untyped-def]
    def retry_once(runtime: WorkerRuntime, job: ClaimedJob, count: int) -> None:
        if count > 1:
            return succeed(runtime, job, count)
        due = datetime.now(timezone.utc) + timedelta(seconds=0.5)
        assert store.replace_running(job.token, new_job(job.job_id, due=due, attempts=1))
        runtime.release(job.job_id, job.token)  # the row needs no write: it is rescheduled

    _, executor, channel = node(retry_once)
    store.enqueue(new_job("flaky"))
    assert channel.wake is not None
    channel.wake("celery")
    wait_for(lambda: store.count_by_status() == {"SUCCEEDED": 1}, 60)
    assert executor.starts == ["flaky", "flaky"]


def test_an_announced_revoke_reaches_a_running_job(store: JobStore, node) -> None:  # type: ignore[no-untyped-def]
    revoked: list[tuple[str, str]] = []
    _, executor, channel = node(lambda *_: None, on_revoke=lambda *asked: revoked.append(asked))
    store.enqueue(new_job("long"))
    assert channel.wake is not None
    channel.wake("celery")
    wait_for(lambda: executor.starts == ["long"], 60)
    store.request_revoke(["long"], "revoked", terminate_signal="SIGTERM")
    channel.wake(REVOCATIONS_WAKEUP)
    wait_for(lambda: revoked == [("long", "SIGTERM")], 60)


@pytest.mark.parametrize(
    ("live", "delivers"), [(False, True), (True, False)], ids=["not-subscribed", "deaf"]
)
def test_a_channel_that_tells_nothing_leaves_the_node_polling(  # type: ignore[no-untyped-def]
    store: JobStore, node, live: bool, delivers: bool
) -> None:
    claims: list[int] = []
    claim = store.claim

    def counted(*args: object) -> list[ClaimedJob]:
        found = claim(*args)  # type: ignore[arg-type]
        claims.append(len(found))
        return found

    store.claim = counted  # type: ignore[method-assign]
    _, executor, _ = node(live=live, delivers=delivers)
    wait_for(lambda: len(claims) >= 2 and not any(claims), 60)  # it looked, found nothing
    store.enqueue(new_job("unannounced"))  # told nobody: only polling finds it
    wait_for(lambda: executor.starts == ["unannounced"], 60)
