"""The worker runtime against a real store, with a stand-in executor."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import text

from celery_ratchet.domain.job import (
    ClaimedJob,
    JobStatus,
    JobType,
    NewJob,
    Settlement,
    StoredResult,
)
from celery_ratchet.errors import StoreBusy, StoreUnavailable, ValueRefused
from celery_ratchet.runtime.base import Capacity
from celery_ratchet.runtime.worker import WorkerRuntime
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.control import control_store
from celery_ratchet.store.jobstore import JobStore
from tests.helpers import handler_fired_while_holding, new_job

FAST = RatchetSettings(
    poll_interval=0.1,
    node_heartbeat_interval_seconds=0.2,
    node_orphan_grace_seconds=1.0,
    orphan_scan_interval_seconds=0.3,
)


class Executor:
    """Runs every job at once and reports success; remembers what it ran."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.runtime: WorkerRuntime | None = None
        self._lock = threading.Lock()

    def __call__(self, job: ClaimedJob) -> None:
        with self._lock:
            self.ran.append(job.job_id)
        assert self.runtime is not None
        self.runtime.settle(Settlement(job.job_id, job.token, JobStatus.SUCCEEDED))


def live_node(
    store: JobStore,
    dispatch: Callable[[ClaimedJob], None],
    settings: RatchetSettings = FAST,
    **extra: Any,
) -> WorkerRuntime:
    """The runtime of node ``live-node``, claiming from ``celery`` with room for 4 jobs."""
    return WorkerRuntime(
        store,
        settings,
        node_id="live-node",
        queues=["celery"],
        capacity=Capacity(running=4, buffered=4),
        dispatch=dispatch,
        **extra,
    )


@pytest.fixture
def runtime(store: JobStore) -> Iterator[tuple[WorkerRuntime, Executor]]:
    executor = Executor()
    rt = live_node(store, executor)
    executor.runtime = rt
    rt.start()
    yield rt, executor
    rt.close(timeout=10)


def wait_for(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_jobs_are_run_and_settled(store: JobStore, runtime: tuple[WorkerRuntime, Executor]) -> None:
    _, executor = runtime
    store.enqueue_many([new_job(f"j{i}") for i in range(30)])
    wait_for(lambda: store.count_by_status() == {"SUCCEEDED": 30})
    assert sorted(executor.ran) == sorted(f"j{i}" for i in range(30))


def test_jobs_of_a_dead_node_are_recovered_and_run(
    store: JobStore, runtime: tuple[WorkerRuntime, Executor]
) -> None:
    _, executor = runtime
    store.register_node("crashed-node", "elsewhere", 1, ["celery"], 4)
    store.enqueue_many([new_job(f"o{i}") for i in range(3)])
    # The crashed node claimed them just before dying (and never heartbeats again); the
    # live node may have won some of the race itself.
    stolen = [j.job_id for j in store.claim("crashed-node", ["celery"], 3)]
    wait_for(lambda: store.count_by_status() == {"SUCCEEDED": 3})
    assert set(stolen) <= set(executor.ran)
    # Had the live node won all three, they may have run before the crashed node had been
    # silent past its grace: its removal is waited for, not read at once.
    wait_for(lambda: "crashed-node" not in {n["node_id"] for n in store.list_nodes()})


def test_claims_the_node_lost_track_of_are_handed_back(
    store: JobStore, runtime: tuple[WorkerRuntime, Executor]
) -> None:
    rt, _ = runtime
    # Claimed under this node's id but never given to it (a claim whose reply was lost), on
    # a queue the node does not consume, so only the hand-back can move them.
    store.enqueue_many([new_job(f"lost{i}", queue="side") for i in range(2)])
    claimed: set[str] = set()

    def claim_both() -> bool:
        # The node's own claims run meanwhile: on MariaDB SKIP LOCKED may pass over a row
        # one of them has just read, and the next try takes it.
        claimed.update(j.job_id for j in store.claim(rt.node_id, ["side"], 2))
        return claimed == {"lost0", "lost1"}

    wait_for(claim_both)
    wait_for(lambda: store.count_by_status() == {"PENDING": 2})


def test_a_node_that_cannot_heartbeat_stops_starting_jobs_and_says_so(
    store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="celery_ratchet.runtime.standing")
    executor = Executor()
    rt = WorkerRuntime(
        store,
        FAST,
        node_id="cut-off",
        queues=["celery"],
        capacity=Capacity(running=2, buffered=2),
        dispatch=executor,
    )
    executor.runtime = rt
    real_heartbeat = store.heartbeat

    def no_heartbeat(node_id: str) -> bool:
        raise StoreUnavailable("cut off from the database")

    store.heartbeat = no_heartbeat  # type: ignore[method-assign]
    rt.start()
    try:
        # Grace 1.0 s minus one 0.2 s interval: after 0.8 s the cluster may declare it dead.
        time.sleep(1.2)
        store.enqueue_many([new_job(f"held{i}") for i in range(3)])
        time.sleep(0.6)
        assert executor.ran == [], "a node that may be presumed dead started a job"
        stale = [r for r in caplog.records if "has written no heartbeat for" in r.message]
        assert len(stale) == 1 and stale[0].levelname == "WARNING", caplog.text
        assert "starts none of the jobs it claimed" in stale[0].message
        store.heartbeat = real_heartbeat  # type: ignore[method-assign]
        wait_for(lambda: store.count_by_status() == {"SUCCEEDED": 3})
        assert "wrote a heartbeat again" in caplog.text
    finally:
        store.heartbeat = real_heartbeat  # type: ignore[method-assign]
        rt.close(timeout=10)


def test_a_master_whose_occurrence_is_refused_does_not_hold_the_others_back(
    store: JobStore,
) -> None:
    """Masters due together fire in one transaction; one whose occurrence the store
    refuses is left unfired and the others fire all the same."""
    from datetime import datetime, timedelta, timezone

    from celery_ratchet.domain.schedule import MasterSpec
    from celery_ratchet.runtime import recurring

    template = new_job("template", task="tests.tick")
    past = datetime.now(timezone.utc) - timedelta(seconds=30)  # registered a while ago
    for key in ("first", "refused", "last"):
        recurring.register(store, key, MasterSpec("every:3600"), task_name="tests.tick",
                           priority=4, message=template.message, now=past)  # fmt: skip
    with store.engine.connect() as conn:  # all three due now
        conn.exec_driver_sql(
            "UPDATE scheduler_job SET scheduled_time = created_at WHERE job_type = 'RECURRING'"
        )

    def occurrence(master: ClaimedJob, spec: MasterSpec, fire: datetime) -> NewJob:
        job_id = recurring.occurrence_id(master.job_id, fire)
        queue = "q" * 1000 if "refused" in master.job_id else "celery"  # over its column
        return new_job(job_id, task="tests.tick", queue=queue)

    executor = Executor()
    rt = WorkerRuntime(store, FAST, node_id="n", queues=["celery"],
                       capacity=Capacity(running=4, buffered=4), dispatch=executor,
                       occurrence=occurrence)  # fmt: skip
    executor.runtime = rt
    rt.start()
    try:
        wait_for(lambda: {j.split("@")[0] for j in executor.ran}
                 >= {"recurring:first", "recurring:last"})  # fmt: skip
    finally:
        rt.close(timeout=10)
    assert not [j for j in executor.ran if j.startswith("recurring:refused")]
    statuses = {m["job_id"]: m["status"] for m in store.list_masters()}
    assert statuses["recurring:first"] == statuses["recurring:last"] == "PENDING"


def test_a_node_is_listed_with_the_jobs_it_runs_at_once_not_its_pool_feed(store: JobStore) -> None:
    # A prefork worker of -c 3 keeps six jobs in its pool (three waiting for a free process):
    # `ratchet nodes` and the dashboard show the 3 it was started with.
    rt = WorkerRuntime(
        store,
        FAST,
        node_id="c3-node",
        queues=["celery"],
        capacity=Capacity(running=6, buffered=6, slots=3),
        dispatch=Executor(),
    )
    rt.start()
    try:
        wait_for(lambda: any(n["node_id"] == "c3-node" for n in store.list_nodes()))
        [node] = [n for n in store.list_nodes() if n["node_id"] == "c3-node"]
        assert node["concurrency"] == 3
    finally:
        rt.close(timeout=10)


def test_a_broadcast_about_a_job_the_node_just_started_is_run(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim threads start before the control thread: a revoke broadcast the moment the
    first job starts is the node's to run, however late the control thread looks."""
    control = control_store(store)
    original_clock = control.clock
    release = threading.Event()

    def late_clock() -> object:  # the control thread gets to it after the job started
        release.wait(10)
        return original_clock()

    monkeypatch.setattr(control, "clock", late_clock)
    ran: list[str] = []
    executor = Executor()

    def broadcast_when_started(job: ClaimedJob) -> None:
        control.broadcast("revoke", "{}", ttl_seconds=60)
        release.set()
        executor(job)

    rt = live_node(
        store,
        broadcast_when_started,
        control=lambda command: ran.append(command.command),  # type: ignore[func-returns-value]
    )
    executor.runtime = rt
    store.enqueue_many([new_job("started-first")])
    rt.start()
    try:
        wait_for(lambda: ran == ["revoke"])
    finally:
        rt.close(timeout=10)
    assert executor.ran == ["started-first"]


def test_a_released_chain_step_is_taken_only_when_no_backlog_waits_and_there_is_room(
    store: JobStore,
) -> None:
    held: list[ClaimedJob] = []
    rt = live_node(store, held.append)  # dispatched jobs are held: they never finish
    rt.start()
    try:
        store.enqueue_many([new_job("first")], [_step("next", "first")])
        wait_for(lambda: [j.job_id for j in held] == ["first"])
        wait_for(lambda: rt.accepts_chain_step("celery") is not None)  # a claim came back short
        assert rt.accepts_chain_step("side") is None  # a queue the node does not consume
        epoch = rt.accepts_chain_step("celery")
        assert epoch is not None
        sent = dataclasses.replace(new_job("next"), parent_id="first")
        claimed = store.release_step_to(sent, rt.node_id)
        assert claimed is not None
        rt.take_released(claimed, epoch)
        wait_for(lambda: [j.job_id for j in held] == ["first", "next"])
        # A backlog: the node fills its 4 slots and 4 buffered places, and takes no step.
        store.enqueue_many([new_job(f"fill{i}") for i in range(12)])
        wait_for(lambda: len(held) == 4)
        wait_for(lambda: rt.accepts_chain_step("celery") is None)
    finally:
        rt.stop_claiming()
        rt.close(timeout=10)


def _step(job_id: str, after: str) -> NewJob:
    return dataclasses.replace(
        new_job(job_id), depends_on=after, parent_id=after, job_type=JobType.CHAIN_STEP
    )


def test_a_stop_asked_by_a_signal_handler_that_interrupted_the_stops_own_set_returns(
    runtime: tuple[WorkerRuntime, Executor],
) -> None:
    """A cold stop (SIGQUIT) landing while the warm stop's handler sets the stop: the
    handler runs in the same thread, which holds the event's lock."""
    rt, _ = runtime
    handler_fired_while_holding(rt._events.stopping, rt.request_stop)
    wait_for(rt._events.stopping.is_set)


def test_a_step_released_by_a_stored_success_is_claimed_at_once_on_a_polling_only_node(
    store: JobStore,
) -> None:
    """A success whose result the backend stored needs no outcome write; the step it
    released is announced where a channel tells the node, and only polling needs the
    claim: with a 30 s poll interval, the step must not wait for the next poll."""
    slow_poll = dataclasses.replace(FAST, poll_interval=30.0, poll_interval_min=30.0)
    ran: list[str] = []
    rt: WorkerRuntime | None = None

    def finish(job: ClaimedJob) -> None:
        assert rt is not None
        ran.append(job.job_id)
        if job.job_id == "first":
            # As the task does: sends its chain's next step, then its result is stored.
            store.enqueue(dataclasses.replace(new_job("next"), parent_id="first"))
            store.settle([Settlement(job.job_id, job.token, JobStatus.SUCCEEDED)])
            rt.release(job.job_id, job.token, due_again=False)
        else:
            rt.settle(Settlement(job.job_id, job.token, JobStatus.SUCCEEDED))

    def dispatch(job: ClaimedJob) -> None:  # as a pool: the job runs beside the loop
        threading.Thread(target=finish, args=(job,)).start()

    rt = live_node(store, dispatch, slow_poll)
    store.enqueue_many([new_job("first")], [_step("next", "first")])
    rt.start()
    try:
        wait_for(lambda: ran == ["first", "next"], timeout=15)
    finally:
        rt.close(timeout=10)


class ResultExecutor(Executor):
    """Reports each success with its result, as the result backend does in the worker's
    own process, then the execution's end, as Celery's request does."""

    def __call__(self, job: ClaimedJob) -> None:
        with self._lock:
            self.ran.append(job.job_id)
        assert self.runtime is not None
        value = "REFUSE" if job.job_id == "refused" else f'"{job.job_id}"'
        stored = StoredResult(value, "str", None)
        self.runtime.report_result(
            Settlement(job.job_id, job.token, JobStatus.SUCCEEDED, result=stored)
        )
        self.runtime.release(job.job_id, job.token, due_again=False)


def test_results_are_written_by_the_settler_and_a_refused_one_fails_its_job(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A result the store refuses does not take the batch down, and its job is not left a
    success with no value: it fails, saying why."""
    store_results = store.settler._store_results

    def refusing(conn: Any, results: list[Settlement]) -> int:
        if any(s.result is not None and s.result.value == "REFUSE" for s in results):
            raise ValueRefused("the job store refused a value (a test); the result was not stored")
        return store_results(conn, results)

    monkeypatch.setattr(store.settler, "_store_results", refusing)
    for name in ("kept-1", "refused", "kept-2"):
        store.enqueue(new_job(name))
    executor = ResultExecutor()
    rt = live_node(store, executor)
    executor.runtime = rt
    rt.start()
    try:
        wait_for(lambda: store.count_by_status() == {"SUCCEEDED": 2, "FAILED": 1})
    finally:
        rt.close(timeout=10)
    for name in ("kept-1", "kept-2"):
        record = store.result(name)
        assert record is not None and record.status is JobStatus.SUCCEEDED
        assert (record.job_result, record.result_type) == (f'"{name}"', "str")
    refused = store.result("refused")
    assert refused is not None and refused.status is JobStatus.FAILED
    assert refused.job_result is None
    assert refused.last_error is not None and "its result was not stored" in refused.last_error


def test_a_slot_stays_taken_until_its_result_is_written(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the store takes no outcomes, a node whose successes wait for the settler starts
    nothing more: as when each thread waited for its own write, no job is started that the
    node could not report (and that another node would run again after the grace period)."""
    store_results = store.settler._store_results
    tries = []

    def unreachable(conn: Any, results: list[Settlement]) -> int:
        tries.append(len(results))
        raise StoreUnavailable("the job store is unreachable (a test)")

    monkeypatch.setattr(store.settler, "_store_results", unreachable)
    store.enqueue_many([new_job(f"w{i}") for i in range(10)])
    executor = ResultExecutor()
    rt = live_node(store, executor)
    executor.runtime = rt
    rt.start()
    try:
        wait_for(lambda: len(executor.ran) == 4)
        wait_for(lambda: len(tries) >= 3)  # the settler tried, and tried again, meanwhile
        assert len(executor.ran) == 4
        monkeypatch.setattr(store.settler, "_store_results", store_results)
        wait_for(lambda: store.count_by_status() == {"SUCCEEDED": 10})
    finally:
        rt.close(timeout=10)
    assert sorted(executor.ran) == sorted(f"w{i}" for i in range(10))


class LockingExecutor(ResultExecutor):
    """As :class:`ResultExecutor`; before job ``locked`` reports, another client locks its
    row (an admin's open transaction, say) and keeps it locked until the test lets go."""

    def __init__(self, store: JobStore) -> None:
        super().__init__()
        self.side = store.engine.connect()

    def __call__(self, job: ClaimedJob) -> None:
        if job.job_id == "locked":  # the store's connections commit each statement by default
            self.side.exec_driver_sql("BEGIN")
            self.side.execute(
                text("SELECT job_id FROM scheduler_job WHERE job_id = 'locked' FOR UPDATE")
            )
        super().__call__(job)


def test_a_row_another_client_keeps_locked_holds_back_only_its_own_outcome(
    server_store: JobStore,
) -> None:
    """The settler writes the node's outcomes together: one row another transaction keeps
    locked must not keep the others unwritten (and their slots taken, so the node starts
    nothing more). Its own outcome is written once the lock is gone."""
    store = server_store
    store.enqueue(new_job("locked"))
    store.enqueue_many([new_job(f"free-{i}") for i in range(12)])
    executor = LockingExecutor(store)
    rt = live_node(store, executor)
    executor.runtime = rt
    rt.start()
    try:
        wait_for(lambda: store.count_by_status() == {"SUCCEEDED": 12, "RUNNING": 1}, timeout=30)
        held = store.result("locked")
        assert held is not None and held.status is JobStatus.RUNNING
        executor.side.exec_driver_sql("ROLLBACK")
        wait_for(lambda: store.count_by_status() == {"SUCCEEDED": 13}, timeout=30)
    finally:
        executor.side.exec_driver_sql("ROLLBACK")
        executor.side.close()
        rt.close(timeout=10)
    record = store.result("locked")
    assert record is not None and record.status is JobStatus.SUCCEEDED
    assert (record.job_result, record.result_type) == ('"locked"', "str")


def test_outcomes_behind_rows_that_stay_locked_are_written_all_the_same(
    server_store: JobStore,
) -> None:
    """Three locked rows at the head of a batch: the settler stops trying row after row (as
    when the whole table is locked), and the outcomes it did not try go first next time."""
    store = server_store
    locked = [f"locked-{i}" for i in range(3)]
    free = [f"free-{i}" for i in range(20)]
    store.enqueue_many([new_job(name) for name in locked + free])
    claimed = {j.job_id: j for j in store.claim("live-node", ["celery"], 23)}
    side = store.engine.connect()
    side.exec_driver_sql("BEGIN")  # the store's connections commit each statement by default
    for name in locked:
        side.execute(
            text("SELECT job_id FROM scheduler_job WHERE job_id = :name FOR UPDATE"),
            {"name": name},
        )
    rt = live_node(store, Executor())
    for name in locked + free:  # one batch, the locked rows first
        rt.settle(Settlement(name, claimed[name].token, JobStatus.SUCCEEDED))
    rt.start()
    try:
        wait_for(lambda: store.count_by_status() == {"SUCCEEDED": 20, "RUNNING": 3}, timeout=30)
        side.exec_driver_sql("ROLLBACK")
        wait_for(lambda: store.count_by_status() == {"SUCCEEDED": 23}, timeout=30)
    finally:
        side.exec_driver_sql("ROLLBACK")
        side.close()
        rt.close(timeout=10)


def test_a_store_lost_while_writing_row_by_row_is_an_outage_not_a_lock(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch ran out of its lock wait, then the store went away: the outcomes are kept
    as unwritten for the outage's retry (and shutdown sees the store unreachable), not
    parked as locked rows tried one connection attempt each."""
    store.enqueue_many([new_job(f"o{i}") for i in range(5)])
    claimed = store.claim("live-node", ["celery"], 5)
    settlements = [Settlement(j.job_id, j.token, JobStatus.SUCCEEDED) for j in claimed]
    tries: list[int] = []

    def failing(batch: list[Settlement], **kwargs: Any) -> int:
        tries.append(len(batch))
        if len(tries) == 1:
            raise StoreBusy("a lock another transaction holds (a test)")
        raise StoreUnavailable("the job store is unreachable (a test)")

    monkeypatch.setattr(store, "settle", failing)
    rt = live_node(store, Executor())
    unwritten, reachable = rt.settler.write(settlements)
    assert (len(unwritten), reachable) == (5, False)
    assert tries == [5, 1]  # one row tried alone, then no more


def test_the_settler_lets_outcomes_gather_only_while_other_jobs_of_the_node_run(
    store: JobStore,
) -> None:
    """A drain's ends of jobs are gathered a moment before each write (bigger batches, less
    database work a job); an outcome with nothing else running is written at once, and so
    are a result (its slot waits for the write) and everything once the node closes. Slots
    held only for results waiting to be written are no running jobs."""
    rt = live_node(store, Executor())
    assert not rt.settler.still_running()
    rt._holdings._in_flight["running"] = "t1"
    assert rt.settler.still_running()
    rt._holdings._unwritten[("running", "t1")] = Settlement("running", "t1", JobStatus.SUCCEEDED)
    assert not rt.settler.still_running()  # its result is reported: nothing more is coming
    rt._holdings._in_flight["other"] = "t2"
    assert rt.settler.still_running()
    ended = Settlement("done", "t3", JobStatus.SUCCEEDED)
    assert rt.settler.may_gather([ended])
    kept = StoredResult(value="4", type_name="int", meta=None)
    assert not rt.settler.may_gather([ended, dataclasses.replace(ended, result=kept)])
    rt._events.closed.set()
    assert not rt.settler.still_running()
    assert not rt.settler.may_gather([ended])


class HoldingExecutor(Executor):
    """Keeps the job ``hold`` running until ``release`` is set; settles the others at once:
    their ends are written while a job of the node still runs (the settler gathers them)."""

    def __init__(self, hold: str) -> None:
        super().__init__()
        self.hold, self.release = hold, threading.Event()

    def __call__(self, job: ClaimedJob) -> None:
        if job.job_id != self.hold:
            super().__call__(job)
            return
        with self._lock:
            self.ran.append(job.job_id)

        def finish() -> None:
            self.release.wait(30)
            assert self.runtime is not None
            self.runtime.settle(Settlement(job.job_id, job.token, JobStatus.SUCCEEDED))

        threading.Thread(target=finish, daemon=True).start()


def test_ends_gathered_while_the_store_is_gone_are_all_written_once_it_is_back(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ends of a busy node's jobs wait for their batch, and while the store takes no
    outcomes they are kept: once it is back, every one is written, none twice."""
    settle = store.settle
    refused: list[int] = []

    def unreachable(settlements: list[Settlement], **options: Any) -> int:
        refused.append(len(settlements))
        raise StoreUnavailable("the job store is unreachable (a test)")

    store.enqueue(new_job("held"))
    store.enqueue_many([new_job(f"e{i}") for i in range(12)])
    executor = HoldingExecutor("held")
    rt = live_node(store, executor)
    executor.runtime = rt
    monkeypatch.setattr(store, "settle", unreachable)
    rt.start()
    try:
        wait_for(lambda: "held" in executor.ran and len(refused) >= 2)
        monkeypatch.setattr(store, "settle", settle)
        wait_for(lambda: len(executor.ran) == 13)
        executor.release.set()
        wait_for(lambda: store.count_by_status() == {"SUCCEEDED": 13})
    finally:
        executor.release.set()
        rt.close(timeout=10)
    assert sorted(executor.ran) == sorted(["held", *(f"e{i}" for i in range(12))])
