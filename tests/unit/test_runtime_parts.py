"""The worker runtime's parts, each driven one step at a time on a clock the test moves: the
claim loop's round, the settler's write, a heartbeat, an orphan scan, a look for revokes, the
recurring masters' due times. The runtime against real databases, with its threads, is in
tests/integration."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

from celery_ratchet.domain.breaker import BreakerConfig
from celery_ratchet.domain.job import (
    REVOCATIONS_WAKEUP,
    SCHEDULES_QUEUE,
    ClaimedJob,
    JobStatus,
    JobType,
    NewJob,
    Settlement,
    StoredResult,
)
from celery_ratchet.domain.recovery import OrphanRecovery
from celery_ratchet.domain.schedule import MasterSpec
from celery_ratchet.runtime.base import Capacity
from celery_ratchet.runtime.worker import WorkerRuntime
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.ports import WorkerStore
from tests.helpers import new_job
from tests.unit.runtime_fakes import START, FakeClock, FakeStore, claimed, flush

SETTINGS = RatchetSettings(
    poll_interval=1.0,
    poll_interval_min=0.05,
    node_heartbeat_interval_seconds=2.0,
    node_orphan_grace_seconds=10.0,
    orphan_scan_interval_seconds=3.0,
)
#: How long without a heartbeat before the node stops starting what it claimed.
STALE_AFTER = 10.0 - 2.0
#: Two jobs running, two buffered.
ROOM_FOR_4 = Capacity(running=2, buffered=2)


class Executor:
    def __init__(self) -> None:
        self.started: list[str] = []

    def __call__(self, job: ClaimedJob) -> None:
        self.started.append(job.job_id)


def node(
    store: FakeStore,
    clock: FakeClock,
    *,
    capacity: Capacity = ROOM_FOR_4,
    **extra: Any,
) -> tuple[WorkerRuntime, Executor]:
    """A node's runtime, none of its threads started."""
    executor = Executor()
    rt = WorkerRuntime(
        cast(WorkerStore, store),
        extra.pop("settings", SETTINGS),
        node_id="n1",
        queues=["celery"],
        capacity=capacity,
        dispatch=executor,
        local_clock=clock,
        **extra,
    )
    return rt, executor


# -- the claim loop ---------------------------------------------------------------------------


def test_a_round_claims_for_the_free_room_starts_what_fits_and_buffers_the_rest() -> None:
    store, clock = FakeStore(due=[claimed(f"j{i}") for i in range(5)]), FakeClock()
    rt, executor = node(store, clock)
    assert rt.claimer.round() is None  # room for 4, 4 claimed: there may be more due
    assert executor.started == ["j0", "j1"]
    assert rt._holdings.sizes() == (2, 4)
    rt.settle(Settlement("j0", "t1", JobStatus.SUCCEEDED))
    rt.claimer.round()
    assert executor.started == ["j0", "j1", "j2"]
    flush(rt)
    assert [s.job_id for s in store.settled] == ["j0"]
    assert not rt.unwritten("j0", "t1")


def test_empty_claims_back_off_doubling_up_to_the_poll_interval() -> None:
    store, clock = FakeStore(), FakeClock()
    rt, _ = node(store, clock)
    waits = []
    for _ in range(7):
        waits.append(rt.claimer.round())
        clock.advance(waits[-1] or 0.0)
    assert [round(w or 0.0, 6) for w in waits] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert store.calls.count("claim") == 7
    rt.wake()  # an enqueue was announced: claim at once, without waiting out the backoff
    rt.claimer.round()
    assert store.calls.count("claim") == 8


def test_a_node_without_a_heartbeat_for_too_long_starts_and_claims_nothing() -> None:
    store, clock = FakeStore(due=[claimed(f"j{i}") for i in range(3)]), FakeClock()
    rt, executor = node(store, clock, capacity=Capacity(running=1, buffered=2))
    rt.heartbeat.register()
    rt.claimer.round()
    assert executor.started == ["j0"] and rt._holdings.sizes() == (2, 3)
    clock.advance(STALE_AFTER + 0.1)
    store.due = [claimed("late")]
    rt.claimer.round()
    assert rt._holdings.sizes() == (0, 1)  # the buffer dropped: those claims may be others'
    assert store.calls.count("claim") == 1
    assert rt.accepts_chain_step("celery") is None
    rt.heartbeat.beat()  # went through: its claims are its own again
    rt.settle(Settlement("j0", "t1", JobStatus.SUCCEEDED))
    rt.claimer.round()
    assert executor.started == ["j0", "late"]


def test_an_open_breaker_defers_its_jobs_until_it_half_opens() -> None:
    config = BreakerConfig(failure_rate=0.5, window=2, open_seconds=30.0, minimum_calls=2)
    store, clock = FakeStore(due=[claimed("a"), claimed("b")]), FakeClock()
    rt, executor = node(store, clock, breaker_for=lambda job: ("partner", config))
    rt.claimer.round()
    for job_id in ("a", "b"):
        rt.record_outcome(job_id, "t1", failed=True)
        rt.settle(Settlement(job_id, "t1", JobStatus.FAILED))
    clock.advance(5.0)
    store.due = [claimed("c", claimed_now=START + timedelta(seconds=5))]
    rt.claimer.round()
    assert executor.started == ["a", "b"]
    # Due when the breaker half-opens: 30 s after it opened, on the database's clock.
    assert store.deferred == [("c", "t1", START + timedelta(seconds=30))]
    assert rt._holdings.sizes() == (0, 0)


def test_a_chain_step_is_taken_only_while_the_last_claim_ran_dry() -> None:
    store, clock = (
        FakeStore(due=[claimed("a"), claimed("b"), claimed("c"), claimed("d")]),
        (FakeClock()),
    )
    rt, executor = node(store, clock)
    rt.claimer.round()  # a full claim: a backlog may wait
    assert rt.accepts_chain_step("celery") is None
    for job_id in ("a", "b", "c", "d"):
        rt.settle(Settlement(job_id, "t1", JobStatus.SUCCEEDED))
        rt.claimer.round()
    assert rt.accepts_chain_step("other") is None
    epoch = rt.accepts_chain_step("celery")
    assert epoch == 0
    rt.take_released(claimed("step"), epoch)
    rt.claimer.round()
    assert executor.started[-1] == "step"


# -- the settler ------------------------------------------------------------------------------


def test_outcomes_are_kept_through_an_outage_and_written_after_it() -> None:
    store, clock = FakeStore(due=[claimed("a")]), FakeClock()
    rt, _ = node(store, clock)
    rt.claimer.round()
    rt.settle(Settlement("a", "t1", JobStatus.SUCCEEDED))
    store.down = True
    pending: list[Settlement] = []
    rt.settler._take_queued(pending)
    unwritten, reachable = rt.settler.write(pending)
    assert ([s.job_id for s in unwritten], reachable) == (["a"], False)
    assert rt.unwritten("a", "t1")
    store.down = False
    assert rt.settler.write(unwritten) == ([], True)
    assert not rt.unwritten("a", "t1") and [s.job_id for s in store.settled] == ["a"]


def test_a_result_keeps_its_slot_until_it_is_written() -> None:
    store, clock = FakeStore(due=[claimed("a")]), FakeClock()
    rt, _ = node(store, clock, capacity=Capacity(running=1, buffered=0))
    rt.claimer.round()
    kept = StoredResult(value="4", type_name="int", meta=None)
    rt.report_result(Settlement("a", "t1", JobStatus.SUCCEEDED, result=kept))
    rt.release("a", "t1", due_again=False)
    assert rt._holdings.sizes() == (0, 1)  # the execution ended, its result is not written
    assert not rt.settler.still_running()  # and nothing more is to come from it
    assert not rt.wait_results_written(0.0)
    flush(rt)
    assert rt._holdings.sizes() == (0, 0)
    assert rt.wait_results_written(0.0)


def test_a_hand_back_written_wakes_the_claim_loop() -> None:
    store, clock = FakeStore(), FakeClock()
    rt, _ = node(store, clock)
    rt.claimer.round()
    rt._events.hint.clear()
    rt.settler.hand_back(claimed("a"))
    flush(rt)
    assert store.settled[0].status is JobStatus.PENDING
    assert rt._events.hint.is_set()


# -- heartbeats, claims reconciled, orphans ---------------------------------------------------


def test_a_node_declared_dead_drops_its_buffer_registers_again_and_hands_back_old_claims() -> None:
    store, clock = FakeStore(due=[claimed("a"), claimed("b")]), FakeClock()
    rt, executor = node(store, clock, capacity=Capacity(running=1, buffered=1))
    rt.heartbeat.register()
    epoch = rt._holdings.epoch
    rt.claimer.round()
    assert rt._holdings.sizes() == (1, 2)
    store.alive = False
    rt.heartbeat.beat()
    assert store.registrations == 2 and rt._holdings.epoch == epoch + 1
    assert rt._holdings.sizes() == (0, 1)
    rt.claimer._take([claimed("claimed-before")], epoch)  # a claim's reply from before
    flush(rt)
    assert [(s.job_id, s.status) for s in store.settled] == [("claimed-before", JobStatus.PENDING)]
    assert executor.started == ["a"]


def test_queues_left_during_an_outage_are_recorded_by_the_next_heartbeat_through() -> None:
    # Until the row lists the new queues, other nodes hand this one jobs of a queue it left,
    # and the jobs handed to it there stay pinned to it (set_node_queues lets go of them).
    store, clock = FakeStore(), FakeClock()
    rt, _ = node(store, clock)
    store.down = True
    rt.set_queues(["celery", "reports"])
    rt.set_queues(["reports"])
    rt.heartbeat.beat()
    assert store.queue_listings == []
    store.down = False
    rt.heartbeat.beat()
    assert store.queue_listings == [["reports"]]
    rt.heartbeat.beat()  # listed: not written again
    rt.set_queues(["reports"])
    assert store.queue_listings == [["reports"]]
    rt.set_queues(["celery"])  # written at once while the store answers
    assert store.queue_listings == [["reports"], ["celery"]]


def test_the_claim_check_hands_back_only_claims_this_node_lost_track_of() -> None:
    store, clock = FakeStore(due=[claimed("a")]), FakeClock()
    rt, _ = node(store, clock)
    rt.claimer.round()
    store.running = [("a", "t1"), ("lost", "t9")]
    rt.heartbeat.reconcile()
    flush(rt)
    assert [(s.job_id, s.status) for s in store.settled] == [("lost", JobStatus.PENDING)]


def test_the_orphan_scan_judges_only_after_watching_for_a_full_grace_period() -> None:
    store, clock = FakeStore(), FakeClock()
    store.heartbeats = {"n1": START, "other": START}
    rt, _ = node(store, clock)
    rt.heartbeat.beat()
    rt.orphan_scan.scan()
    assert "recover_orphans" not in store.calls
    clock.advance(10.0)
    rt.heartbeat.beat()
    store.recovered = OrphanRecovery(["x"], [], ["other"], ["celery"])
    rt._events.hint.clear()
    rt.orphan_scan.scan()
    assert store.observed == {"other": START}
    assert rt._events.hint.is_set()  # jobs recovered: claim now


def test_a_node_cut_off_judges_nobody_for_a_grace_period_after() -> None:
    store, clock = FakeStore(), FakeClock()
    store.heartbeats = {"other": START}
    rt, _ = node(store, clock)
    rt.heartbeat.beat()
    clock.advance(10.0)
    store.down = True
    rt.heartbeat.beat()
    store.down = False
    clock.advance(1.0)
    rt.heartbeat.beat()
    rt.orphan_scan.scan()
    assert "recover_orphans" not in store.calls


# -- revokes ----------------------------------------------------------------------------------


def test_a_revoke_drops_a_buffered_job_and_hands_a_started_one_on_once() -> None:
    store, clock = FakeStore(due=[claimed("a"), claimed("b")]), FakeClock()
    asked: list[tuple[str, str]] = []
    rt, executor = node(
        store,
        clock,
        capacity=Capacity(running=1, buffered=1),
        on_revoke=lambda job_id, request: asked.append((job_id, request)),
        revoked_error="revoked",
    )
    rt.claimer.round()
    store.revokes = [("a", "t1", "SIGTERM"), ("b", "t1", "REVOKE")]
    rt.revocations.look(announced=True)
    rt.revocations.look(announced=False)
    assert asked == [("a", "SIGTERM")]
    flush(rt)
    assert [(s.job_id, s.status, s.error) for s in store.settled] == [
        ("b", JobStatus.REVOKED, "revoked")
    ]
    assert executor.started == ["a"]


def test_an_idle_node_looks_for_revokes_only_when_one_is_announced() -> None:
    store, clock = FakeStore(), FakeClock()
    rt, _ = node(store, clock)
    rt.revocations.look(announced=False)
    assert "revocations" not in store.calls
    rt._woken(REVOCATIONS_WAKEUP)
    assert rt.revocations._wait() is True


# -- recurring masters ------------------------------------------------------------------------


def _master(job_id: str) -> ClaimedJob:
    return claimed(
        job_id,
        job_type=JobType.RECURRING,
        schedule_spec=MasterSpec("every:60").to_json(),
    )


def _occurrence(master: ClaimedJob, spec: MasterSpec, fire: Any) -> NewJob:
    return new_job(f"{master.job_id}@{fire.isoformat()}")


def test_masters_are_claimed_when_the_earliest_is_due_and_not_before() -> None:
    store, clock = FakeStore(next_due=10.0), FakeClock()
    rt, _ = node(store, clock, occurrence=_occurrence)
    assert rt.masters is not None
    rt.masters.fire_due()  # due at once at start: nothing claimable yet, its due time read
    assert store.calls.count("claim") == 1
    clock.advance(5.0)
    store.next_due = 5.0
    rt.masters.fire_due()  # looked again (no wake-up channel: every poll interval)
    assert store.calls.count("claim") == 1
    clock.advance(5.01)
    rt.heartbeat.beat()  # else 10 s without one: the node would claim nothing
    store.masters_due = [_master("recurring:k")]
    rt.masters.fire_due()
    assert store.calls.count("claim") == 2
    [(master, occurrences, next_due)] = store.fired
    assert master.job_id == "recurring:k" and len(occurrences) == 1
    assert next_due == START + timedelta(seconds=60)


def test_a_master_changed_elsewhere_is_read_again_at_once() -> None:
    store, clock = FakeStore(next_due=None), FakeClock()
    rt, _ = node(store, clock, occurrence=_occurrence)
    assert rt.masters is not None
    rt.masters.fire_due()
    looks = store.calls.count("next_due_in")
    assert rt.masters.next_look_in() == SETTINGS.poll_interval  # no master: only the look
    rt._woken(SCHEDULES_QUEUE)
    assert rt.masters.next_look_in() == 0.0
    rt.masters.fire_due()
    assert store.calls.count("next_due_in") == looks + 1


class _Replies:
    """Replies to one ticket, one more each time the gatherer looks."""

    def __init__(self, clock: FakeClock, arrive: list[float]) -> None:
        self.clock, self.arrive, self.dropped = clock, arrive, False
        self.started = clock.monotonic()

    def replies(self, ticket: str, after: int) -> list[Any]:
        from types import SimpleNamespace

        elapsed = self.clock.monotonic() - self.started
        due = [i for i, at in enumerate(self.arrive, 1) if at <= elapsed and i > after]
        return [SimpleNamespace(id=i, reply=f"r{i}") for i in due]

    def drop_replies(self, ticket: str) -> None:
        self.dropped = True


def test_gathering_replies_waits_the_timeout_after_the_last_one_by_its_clock() -> None:
    from celery_ratchet.runtime.control import gather

    clock = FakeClock()
    source = _Replies(clock, arrive=[0.5, 1.5, 9.0])
    got = gather(cast(Any, source), "t", timeout=1.0, limit=None, decode=str, clock=clock)
    assert got == ["r1", "r2"]  # the third came after a second of silence
    assert 2.5 <= clock.monotonic() - source.started < 3.0 and source.dropped
    clock = FakeClock()
    source = _Replies(clock, arrive=[0.0, 0.0, 0.0])
    assert gather(cast(Any, source), "t", timeout=5, limit=2, decode=str, clock=clock) == [
        "r1",
        "r2",
    ]
    assert clock.monotonic() == source.started  # the limit ends it at once
