"""The worker runtime's parts against the in-memory store, both on one clock the test moves:
orphan recovery once a node's heartbeat stands still, a schedule firing once across two
nodes sharing the store, retry backoff, dead-letter alerts sent once. No database, no sleep;
threads only where two nodes race on purpose. (tests/unit/test_runtime_parts.py drives the
same parts against a fake that records calls; here the store keeps the rows.)"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Any

from celery_ratchet.domain.job import SCHEDULES_QUEUE, ClaimedJob, JobStatus, NewJob, Settlement
from celery_ratchet.domain.retry import Backoff, decide
from celery_ratchet.domain.schedule import MasterSpec
from celery_ratchet.runtime import recurring
from celery_ratchet.runtime.base import Capacity
from celery_ratchet.runtime.dlq import DeadLetterAlerts
from celery_ratchet.runtime.worker import WorkerRuntime
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.memory import MemoryStore
from tests.helpers import new_job
from tests.unit.runtime_fakes import FakeClock, flush

START = datetime(2026, 6, 1, 12, 0, 0, 500000, tzinfo=timezone.utc)
HEARTBEAT = 2.0
GRACE = 10.0
SETTINGS = RatchetSettings(
    poll_interval=1.0,
    poll_interval_min=0.05,
    node_heartbeat_interval_seconds=HEARTBEAT,
    node_orphan_grace_seconds=GRACE,
    orphan_scan_interval_seconds=3.0,
)


class Executor:
    """Starts nothing itself: remembers what the node handed it."""

    def __init__(self) -> None:
        self.started: list[ClaimedJob] = []

    def __call__(self, job: ClaimedJob) -> None:
        self.started.append(job)

    @property
    def ids(self) -> list[str]:
        return sorted(j.job_id for j in self.started)


def _occurrence(master: ClaimedJob, spec: MasterSpec, fire: datetime) -> NewJob:
    return new_job(recurring.occurrence_id(master.job_id, fire), task="tests.tick")


def node(store: MemoryStore, clock: FakeClock, node_id: str) -> tuple[WorkerRuntime, Executor]:
    """A node's runtime, none of its threads started: the test runs each step."""
    executor = Executor()
    rt = WorkerRuntime(
        store,
        SETTINGS,
        node_id=node_id,
        queues=["celery"],
        capacity=Capacity(running=2, buffered=0),
        dispatch=executor,
        occurrence=_occurrence,
        local_clock=clock,
    )
    return rt, executor


def _status(store: MemoryStore, job_id: str) -> JobStatus | str:
    record = store.result(job_id)
    assert record is not None, job_id
    return record.status


# -- orphan recovery ---------------------------------------------------------------------------


def test_a_node_whose_heartbeat_stands_still_loses_its_jobs_to_the_node_watching_it() -> None:
    clock = FakeClock(START)
    store = MemoryStore(clock.now)
    dead, dead_ran = node(store, clock, "dead")
    judge, judge_ran = node(store, clock, "judge")
    dead.heartbeat.register()
    judge.heartbeat.register()
    store.enqueue_many([new_job("j1"), new_job("j2")])
    dead.claimer.round()
    assert dead_ran.ids == ["j1", "j2"]

    # The judge beats every interval and scans; the dead node's heartbeat stands still. Not
    # before the grace is over, by the judge's clock and by the store's, is anything taken.
    watched = 0.0
    while watched <= GRACE:
        assert [_status(store, j) for j in ("j1", "j2")] == [JobStatus.RUNNING] * 2
        judge.heartbeat.beat()
        judge.orphan_scan.scan()
        clock.advance(HEARTBEAT)
        watched += HEARTBEAT
    judge.heartbeat.beat()
    judge.orphan_scan.scan()

    assert set(store.node_heartbeats()) == {"judge"}
    assert [_status(store, j) for j in ("j1", "j2")] == [JobStatus.PENDING] * 2
    judge.claimer.round()
    assert judge_ran.ids == ["j1", "j2"]
    assert {j.claims for j in judge_ran.started} == {2}

    # The dead node comes back: its late outcomes are refused, and it registers again.
    for job in dead_ran.started:
        dead.settle(Settlement(job.job_id, job.token, JobStatus.SUCCEEDED))
    flush(dead)
    assert [_status(store, j) for j in ("j1", "j2")] == [JobStatus.RUNNING] * 2
    dead.heartbeat.beat()  # told it was declared dead
    assert set(store.node_heartbeats()) == {"judge", "dead"}


def test_a_heartbeat_that_moves_before_the_scan_saves_its_node() -> None:
    """After an outage every heartbeat is old by the store's clock: a node that beats again
    before the scan is not declared dead, whatever the scanner saw before."""
    clock = FakeClock(START)
    store = MemoryStore(clock.now)
    store.register_node("holder", "h", 1, ["celery"], 1)
    store.enqueue(new_job("kept"))
    store.claim("holder", ["celery"], 1)
    observed = store.node_heartbeats()
    clock.advance(GRACE + 60)  # nobody could write a heartbeat meanwhile
    assert store.heartbeat("holder")
    recovered = store.recover_orphans(GRACE, observed=observed)
    assert (recovered.dead_nodes, recovered.jobs) == ([], [])
    assert _status(store, "kept") is JobStatus.RUNNING


def test_a_heartbeat_exactly_the_grace_old_declares_no_one_dead() -> None:
    clock = FakeClock(START)
    store = MemoryStore(clock.now)
    store.register_node("quiet", "h", 1, ["celery"], 1)
    observed = store.node_heartbeats()
    clock.advance(GRACE)
    assert store.recover_orphans(GRACE, observed=observed).dead_nodes == []
    clock.advance(0.001)
    assert store.recover_orphans(GRACE, observed=observed).dead_nodes == ["quiet"]


def test_a_job_whose_nodes_keep_dying_under_it_is_dead_lettered() -> None:
    clock = FakeClock(START)
    store = MemoryStore(clock.now)
    store.enqueue(new_job("poison"))
    for life in range(3):  # three nodes in turn die holding it
        holder = f"node-{life}"
        store.register_node(holder, "h", 1, ["celery"], 1)
        [job] = store.claim(holder, ["celery"], 1)
        assert job.claims == life + 1
        clock.advance(GRACE + 1)
        recovered = store.recover_orphans(GRACE, max_recoveries=2)
        assert recovered.dead_nodes == [holder]
    assert recovered.dead_lettered == ["poison"]
    record = store.result("poison")
    assert record is not None and record.status is JobStatus.FAILED
    assert "RecoveryLimitExceeded" in (record.last_error or "")


# -- recurring masters -------------------------------------------------------------------------


def _occurrences(store: MemoryStore) -> list[str]:
    return sorted(j.job_id for j in store.list_jobs(limit=100) if j.task_name == "tests.tick")


def test_a_schedule_fires_once_per_fire_time_across_two_nodes_sharing_the_store() -> None:
    clock = FakeClock(START)
    store = MemoryStore(clock.now)
    template = new_job("template", task="tests.tick")
    recurring.register(store, "tick", MasterSpec("every:60"), task_name="tests.tick",
                       priority=4, message=template.message, now=clock.now())  # fmt: skip
    [master] = store.list_masters()
    first = master["scheduled_time"]
    nodes = [node(store, clock, "a")[0], node(store, clock, "b")[0]]
    for rt in nodes:  # not due yet: each reads when it is
        rt.heartbeat.register()
        rt.masters.fire_due()
    assert _occurrences(store) == []

    for fire in (first, first + timedelta(seconds=60)):
        clock.advance((fire - clock.now()).total_seconds() + 0.01)
        for rt in nodes:  # (a node silent for a grace period claims nothing)
            rt.heartbeat.beat()
        ready = threading.Barrier(len(nodes))

        def fire_due(rt: WorkerRuntime, ready: threading.Barrier = ready) -> None:
            ready.wait()
            rt.masters.fire_due()

        racers = [threading.Thread(target=fire_due, args=(rt,)) for rt in nodes]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join()

    assert _occurrences(store) == [
        recurring.occurrence_id(master["job_id"], first),
        recurring.occurrence_id(master["job_id"], first + timedelta(seconds=60)),
    ]
    [after] = store.list_masters()
    assert (after["status"], after["scheduled_time"]) == (
        "PENDING",
        first + timedelta(seconds=120),
    )
    assert store.claim("a", [SCHEDULES_QUEUE], 10) == []  # nothing more due


def test_a_node_that_lost_its_masters_claim_fires_nothing() -> None:
    clock = FakeClock(START)
    store = MemoryStore(clock.now)
    template = new_job("template", task="tests.tick")
    recurring.register(store, "tick", MasterSpec("every:60"), task_name="tests.tick",
                       priority=4, message=template.message, now=clock.now())  # fmt: skip
    clock.advance(60)
    [claimed] = store.claim("slow", [SCHEDULES_QUEUE], 1)  # a node never registered
    clock.advance(GRACE + 1)
    assert store.recover_orphans(GRACE).requeued == [claimed.job_id]
    other, _ = node(store, clock, "other")
    other.masters.fire_due()
    assert len(_occurrences(store)) == 1
    # The slow node comes back and fires with its old claim: refused, nothing written.
    late = new_job("late", task="tests.tick")
    assert not store.fire_master(claimed, [late], claimed.scheduled_time + timedelta(seconds=60))
    assert store.result("late") is None


# -- retries -----------------------------------------------------------------------------------


def test_a_retry_is_claimed_once_its_backoff_is_over_by_the_stores_clock() -> None:
    clock = FakeClock(START)
    store = MemoryStore(clock.now)
    rt, ran = node(store, clock, "n")
    rt.heartbeat.register()
    store.enqueue(new_job("flaky"))
    rt.claimer.round()
    for attempt, delay in ((1, 2.0), (2, 4.0), (3, 8.0)):
        job = ran.started[-1]
        assert (job.job_id, job.attempts) == ("flaky", attempt - 1)
        decision = decide(
            ValueError("down"), attempt=attempt, max_retries=5,
            backoff=Backoff.EXPONENTIAL, backoff_param=2.0,
        )  # fmt: skip
        assert decision.retry and decision.delay == delay
        due = clock.now() + timedelta(seconds=decision.delay)
        assert store.replace_running(job.token, new_job("flaky", attempts=attempt, due=due))
        # The execution that failed reports late: it cannot touch the rescheduled row.
        rt.settle(Settlement("flaky", job.token, JobStatus.FAILED, error='"down"'))
        flush(rt)
        assert _status(store, "flaky") is JobStatus.PENDING
        assert store.next_due_in(["celery"]) == delay
        # The claim loop, each round waiting what the last one said: the job starts once
        # due by the store's clock, within one poll interval of it, and not before.
        started = len(ran.started)
        for _ in range(1000):
            if len(ran.started) > started:
                break
            assert clock.now() < due + timedelta(seconds=SETTINGS.poll_interval)
            wait = rt.claimer.round()
            if len(ran.started) == started:
                clock.advance(wait or 0.0)
                rt.heartbeat.beat()
        assert len(ran.started) > started and clock.now() >= due  # started, not before due
    last = ran.started[-1]
    assert (last.job_id, last.attempts, last.claims) == ("flaky", 3, 1)


# -- dead-letter alerts ------------------------------------------------------------------------


def test_a_dead_letter_window_is_alerted_once_by_two_nodes() -> None:
    clock = FakeClock(START)
    store = MemoryStore(clock.now, dlq_alert_task="ratchet.alert")
    made: list[tuple[str, dict[str, Any]]] = []

    def alert_job(alert_id: str, message: dict[str, Any]) -> NewJob:
        made.append((alert_id, message))
        return new_job(alert_id, task="ratchet.alert")

    alerts = [DeadLetterAlerts(store.another(dlq_alert_task="ratchet.alert"), 300, alert_job)
              for _ in range(2)]  # fmt: skip
    store.enqueue_many([new_job(f"f{i}", task="shop.charge") for i in range(3)])
    for job in store.claim("n", ["celery"], 3):
        store.settle([Settlement(job.job_id, job.token, JobStatus.FAILED, error='"declined"')])
        clock.advance(1)
    assert [a.send_due() for a in alerts] == [[], []]  # the window is still open

    clock.advance(300)
    sent = alerts[0].send_due() + alerts[1].send_due()

    assert len(sent) == len(made) == 1
    assert store.result(sent[0].job_id) is not None
    state = store.alert_states(["shop.charge"])["shop.charge"]
    assert (state.opened_at, state.last_count, state.last_alert_id) == (None, 3, sent[0].job_id)
