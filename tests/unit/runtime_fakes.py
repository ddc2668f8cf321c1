"""A clock a test moves by hand and a store of the few port methods the runtime's parts call,
recording what they were asked: the runtime's parts driven one step at a time, no thread,
no sleep, no database."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from celery_ratchet.domain.job import ClaimedJob, NewJob, Settlement
from celery_ratchet.domain.queue_pause import PausedQueue
from celery_ratchet.domain.recovery import OrphanRecovery
from celery_ratchet.errors import StoreUnavailable
from celery_ratchet.runtime.worker import WorkerRuntime
from tests.helpers import new_job

START = datetime(2026, 1, 1, tzinfo=timezone.utc)


class FakeClock:
    """Time moves only when the test says (or a part sleeps, which moves it)."""

    def __init__(self, start: datetime = START) -> None:
        self.mono = 1000.0
        self.wall = start

    def monotonic(self) -> float:
        return self.mono

    def now(self) -> datetime:
        return self.wall

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += timedelta(seconds=seconds)


def claimed(job_id: str, token: str = "t1", **fields: Any) -> ClaimedJob:
    job = new_job(job_id, resource=fields.pop("resource", None))
    return ClaimedJob(
        id=1,
        job_id=job.job_id,
        task_name=job.task_name,
        queue=job.queue,
        priority=job.priority,
        attempts=0,
        claims=1,
        token=token,
        scheduled_time=fields.pop("scheduled_time", START),
        message=job.message,
        claimed_now=fields.pop("claimed_now", START),
        resource=job.resource,
        **fields,
    )


@dataclass
class FakeStore:
    """Answers from what the test put in; ``down`` makes every call fail as an outage."""

    display_url: str = "fake://"
    due: list[ClaimedJob] = field(default_factory=list)
    masters_due: list[ClaimedJob] = field(default_factory=list)
    next_due: float | None = None
    alive: bool = True
    down: bool = False
    settled: list[Settlement] = field(default_factory=list)
    deferred: list[tuple[str, str, datetime]] = field(default_factory=list)
    fired: list[tuple[ClaimedJob, list[NewJob], datetime | None]] = field(default_factory=list)
    running: list[tuple[str, str]] = field(default_factory=list)
    revokes: list[tuple[str, str, str]] = field(default_factory=list)
    heartbeats: dict[str, datetime] = field(default_factory=dict)
    recovered: OrphanRecovery = field(default_factory=lambda: OrphanRecovery([], [], []))
    calls: list[str] = field(default_factory=list)
    registrations: int = 0
    #: Each list of queues written to the node's row, in order.
    queue_listings: list[list[str]] = field(default_factory=list)

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.down:
            raise StoreUnavailable("the job store is unreachable (a test)")

    def announce(self, word: str) -> None:
        self._call("announce")

    def claim(self, node_id: str, queues: Sequence[str], limit: int) -> list[ClaimedJob]:
        self._call("claim")
        source = self.masters_due if "ratchet.schedules" in queues else self.due
        taken, source[:] = source[:limit], source[limit:]
        return taken

    def claim_for_resource(
        self, node_id: str, queues: Sequence[str], resource: str, capacity: int, limit: int
    ) -> list[ClaimedJob]:
        self._call("claim_for_resource")
        return []

    def defer(self, deferrals: Sequence[tuple[str, str, datetime]]) -> int:
        self._call("defer")
        self.deferred.extend(deferrals)
        return len(deferrals)

    def settle(self, settlements: Iterable[Settlement], **_: Any) -> int:
        self._call("settle")
        batch = list(settlements)
        self.settled.extend(batch)
        return len(batch)

    def paused_queues(self) -> dict[str, PausedQueue]:
        return {}

    def next_due_in(self, queues: Sequence[str], node_id: str | None = None) -> float | None:
        self._call("next_due_in")
        return self.next_due

    def running_claims(self, node_id: str, *, older_than_seconds: float) -> list[tuple[str, str]]:
        self._call("running_claims")
        return list(self.running)

    def fire_masters(
        self, firings: Sequence[tuple[ClaimedJob, Sequence[NewJob], datetime | None]]
    ) -> list[bool]:
        self._call("fire_masters")
        self.fired.extend((m, list(o), n) for m, o, n in firings)
        return [True] * len(firings)

    def register_node(self, node_id: str, *args: Any) -> datetime:
        self._call("register_node")
        self.registrations += 1
        return START

    def set_node_queues(self, node_id: str, queues: Sequence[str]) -> None:
        self._call("set_node_queues")
        self.queue_listings.append(list(queues))

    def heartbeat(self, node_id: str) -> bool:
        self._call("heartbeat")
        return self.alive

    def node_heartbeats(self) -> dict[str, datetime]:
        self._call("node_heartbeats")
        return dict(self.heartbeats)

    def recover_orphans(
        self,
        grace_seconds: float,
        *,
        observed: Mapping[str, datetime] | None = None,
        max_recoveries: int | None = None,
    ) -> OrphanRecovery:
        self._call("recover_orphans")
        self.observed = dict(observed or {})
        return self.recovered

    def revocations(self, node_id: str) -> list[tuple[str, str, str]]:
        self._call("revocations")
        return list(self.revokes)


def flush(rt: WorkerRuntime) -> None:
    """What the settler thread does with the outcomes queued now."""
    pending: list[Settlement] = []
    rt.settler._take_queued(pending)
    rt.settler.write(pending)
