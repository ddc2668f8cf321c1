"""Stopping real workers the way service managers do, on PostgreSQL and MariaDB.

systemd (``KillMode=control-group``) and supervisord (``stopasgroup``) signal the worker's
whole process group, pool processes included; docker and Kubernetes signal the main process
only. Either way the worker exits (the waits below are generous hang detectors, not timings:
``bench/stop.py`` measures those), running jobs finish or, cut off, go back to PENDING at
once, claimed but unstarted jobs are handed back, and nothing is lost: a second worker runs
every job, each exactly once after a warm stop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import JobStatus
from celery_ratchet.store.jobstore import JobStore
from tests.acceptance.conftest import (
    Cluster,
    Worker,
    _app_on,
    group_members,
    side_effects,
    wait_until,
)
from tests.conftest import Servers
from tests.private_postgres import PrivatePostgres

pytestmark = pytest.mark.slow

JOBS = 24
#: Long enough that a stop always lands while jobs run, short enough to finish them.
SECONDS = 2.0
#: A stop that has not ended after this long is a hang.
HANG = 60.0
#: No orphan recovery during these tests: whatever comes back, the stop handed back.
NO_RECOVERY = {"RATCHET_NODE_ORPHAN_GRACE_SECONDS": "600"}
#: A worker that recovers a dead node's jobs soon.
OUTAGE_SETTINGS = {
    "RATCHET_NODE_HEARTBEAT_INTERVAL_SECONDS": "1",
    "RATCHET_NODE_ORPHAN_GRACE_SECONDS": "5",
    "RATCHET_ORPHAN_SCAN_INTERVAL_SECONDS": "1",
}

WARM = [
    # (dialect, pool, signal, whole group?)
    ("postgresql", "ratchet", signal.SIGTERM, True),
    ("postgresql", "ratchet", signal.SIGTERM, False),
    ("postgresql", "ratchet", signal.SIGINT, True),
    ("postgresql", "threads", signal.SIGTERM, True),
    ("postgresql", "threads", signal.SIGTERM, False),
    ("postgresql", "solo", signal.SIGTERM, True),
    ("postgresql", "solo", signal.SIGTERM, False),
    ("mysql", "ratchet", signal.SIGTERM, True),
    ("mysql", "ratchet", signal.SIGTERM, False),
    ("mysql", "threads", signal.SIGTERM, True),
]
COLD = [
    ("postgresql", "ratchet", True),
    ("postgresql", "ratchet", False),
    ("postgresql", "threads", False),
    ("mysql", "ratchet", True),
]


def _case_id(case: tuple[object, ...]) -> str:
    parts = []
    for part in case:
        if isinstance(part, signal.Signals):
            parts.append(part.name)
        elif isinstance(part, bool):
            parts.append("group" if part else "main")
        else:
            parts.append(str(part))
    return "-".join(parts)


@pytest.fixture
def stop_cluster(
    servers: Servers, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Cluster]:
    dialect = request.param
    app = next(_app_on(servers.url(dialect)))
    found = Cluster(app.conf.ratchet_url, tmp_path)
    yield found
    found.stop_all()
    for worker in found.workers:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)


def _app() -> Celery:
    from tests.acceptance.app import app

    return app


def signal_worker(worker: Worker, sig: int, group: bool) -> None:
    if group:
        os.killpg(worker.pid, sig)
    else:
        worker.process.send_signal(sig)


def wait_for_exit(worker: Worker, cluster: Cluster) -> int:
    """The worker's exit code, once it and every process of its group are gone."""
    try:
        code = worker.process.wait(HANG)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{worker.name} did not exit:\n{cluster.logs()}") from None
    wait_until(lambda: not group_members(worker.pid), HANG, f"the pool of {worker.name} to end")
    return code


def statuses(store: JobStore, ids: list[str]) -> Counter[str]:
    return Counter("missing" if (r := store.result(i)) is None else r.status.value for i in ids)


def start_busy(cluster: Cluster, pool: str) -> tuple[Worker, list[str], JobStore]:
    """A ``-c 4`` worker busy with JOBS jobs: some running, more claimed behind them."""
    app = _app()
    store = ratchet_state(app).store
    ids = [app.tasks["acc.sleep"].delay(f"s{i}", SECONDS).id for i in range(JOBS)]
    worker = cluster.start("w1", pool=pool, concurrency=4, **NO_RECOVERY)
    wait_until(lambda: len(side_effects(store)) >= 2, HANG, "jobs to start")
    return worker, ids, store


def finish_elsewhere(cluster: Cluster, store: JobStore, ids: list[str]) -> Counter[str]:
    """Every job runs to its end on a second worker; returns the runs per job key."""
    cluster.start("w2", concurrency=4, **NO_RECOVERY)
    wait_until(
        lambda: statuses(store, ids) == Counter({"SUCCEEDED": len(ids)}),
        180,
        "every job to succeed on the second worker",
    )
    return Counter(key for key, _ in side_effects(store))


@pytest.mark.parametrize(
    ("stop_cluster", "pool", "sig", "group"),
    WARM,
    ids=[_case_id(c) for c in WARM],
    indirect=["stop_cluster"],
)
def test_a_warm_stop_exits_finishes_running_jobs_and_hands_back_the_rest(
    stop_cluster: Cluster, pool: str, sig: int, group: bool
) -> None:
    worker, ids, store = start_busy(stop_cluster, pool)
    signal_worker(worker, sig, group)
    code = wait_for_exit(worker, stop_cluster)
    assert code == (1 if sig == signal.SIGINT else 0), stop_cluster.logs()  # Celery's codes

    after = statuses(store, ids)
    assert set(after) <= {"SUCCEEDED", "PENDING"}, f"{after}\n{stop_cluster.logs()}"
    assert after["SUCCEEDED"] >= 1
    assert store.list_nodes() == []  # it left the cluster: nothing waits for orphan recovery
    # A job handed back never started: the running ones finished, none was cut off.
    assert len(side_effects(store)) == after["SUCCEEDED"], stop_cluster.logs()

    runs = finish_elsewhere(stop_cluster, store, ids)
    assert set(runs.values()) == {1}, runs
    assert len(runs) == JOBS


@pytest.mark.parametrize("stop_cluster", ["postgresql", "mysql"], indirect=True)
@pytest.mark.parametrize("pool", ["ratchet", "threads", "solo"])
def test_a_group_stop_of_an_idle_worker_exits(stop_cluster: Cluster, pool: str) -> None:
    """Idle pool processes wait for work holding the pool's input lock; one that died of
    the group's SIGTERM with it used to leave the main process waiting forever."""
    app = _app()
    store = ratchet_state(app).store
    ids = [app.tasks["acc.sleep"].delay(f"i{i}", 0.1).id for i in range(2)]
    worker = stop_cluster.start("w1", pool=pool, concurrency=4, **NO_RECOVERY)
    wait_until(lambda: statuses(store, ids) == Counter({"SUCCEEDED": 2}), HANG, "two jobs")
    os.killpg(worker.pid, signal.SIGTERM)
    assert wait_for_exit(worker, stop_cluster) == 0, stop_cluster.logs()
    assert store.list_nodes() == []


@pytest.mark.parametrize(
    ("stop_cluster", "pool", "group"),
    COLD,
    ids=[_case_id(c) for c in COLD],
    indirect=["stop_cluster"],
)
def test_a_cold_stop_exits_and_hands_back_what_it_cut_off(
    stop_cluster: Cluster, pool: str, group: bool
) -> None:
    worker, ids, store = start_busy(stop_cluster, pool)
    signal_worker(worker, signal.SIGQUIT, group)
    wait_for_exit(worker, stop_cluster)

    after = statuses(store, ids)
    # The store was reachable: everything was handed back, nothing left for orphan recovery.
    assert set(after) <= {"SUCCEEDED", "PENDING"}, f"{after}\n{stop_cluster.logs()}"
    started = Counter(key for key, _ in side_effects(store))
    cut_off = len(started) - after["SUCCEEDED"]
    assert cut_off <= 4  # at most one per pool process (threads: the running ones)

    runs = finish_elsewhere(stop_cluster, store, ids)
    assert len(runs) == JOBS
    twice = [key for key, n in runs.items() if n > 1]
    assert len(twice) == cut_off and set(runs.values()) <= {1, 2}, runs


@pytest.mark.parametrize("stop_cluster", ["postgresql", "mysql"], indirect=True)
def test_a_cold_stop_during_a_warm_one_cuts_it_short_and_hands_every_job_back(
    stop_cluster: Cluster,
) -> None:
    """SIGQUIT lands while the warm stop waits for jobs far longer than the wait below."""
    app = _app()
    store = ratchet_state(app).store
    ids = [app.tasks["acc.sleep"].delay(f"c{i}", 2 * HANG).id for i in range(6)]
    worker = stop_cluster.start("w1", concurrency=4, **NO_RECOVERY)
    wait_until(lambda: len(side_effects(store)) == 4, HANG, "four jobs to start")
    worker.process.send_signal(signal.SIGTERM)
    wait_until(lambda: "warm shutdown" in stop_cluster.whole_logs().lower(), 30, "the warm stop")
    worker.process.send_signal(signal.SIGQUIT)
    try:
        worker.process.wait(30)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"the cold stop did not end the warm one:\n{stop_cluster.logs()}"
        ) from None
    wait_until(lambda: not group_members(worker.pid), HANG, "the pool to end")
    assert statuses(store, ids) == Counter({"PENDING": 6}), stop_cluster.logs()


@pytest.mark.parametrize("stop_cluster", ["postgresql", "mysql"], indirect=True)
def test_a_pool_process_killed_mid_job_during_a_stop_hands_its_job_back_at_once(
    stop_cluster: Cluster,
) -> None:
    app = _app()
    store = ratchet_state(app).store
    # The victim's job outlasts any delay before the kill: it is still running when killed.
    ids = [app.tasks["acc.sleep"].delay(f"k{i}", 60.0 if i == 0 else 4.0).id for i in range(4)]
    worker = stop_cluster.start("w1", concurrency=4, **NO_RECOVERY)
    wait_until(lambda: len(side_effects(store)) == 4, HANG, "all four jobs to start")
    victim_key = "k0"
    victim_pid = dict(side_effects(store))[victim_key]
    worker.process.send_signal(signal.SIGTERM)  # docker/Kubernetes: the main process only
    os.kill(victim_pid, signal.SIGKILL)  # and one pool process dies under its job
    assert wait_for_exit(worker, stop_cluster) == 0, stop_cluster.logs()

    by_key = {f"k{i}": job_id for i, job_id in enumerate(ids)}
    victim = store.result(by_key[victim_key])
    assert victim is not None and victim.status is JobStatus.PENDING, stop_cluster.logs()
    others = [by_key[k] for k in by_key if k != victim_key]
    assert statuses(store, others) == Counter({"SUCCEEDED": 3})
    assert store.list_nodes() == []


@pytest.mark.parametrize("stop_cluster", ["postgresql"], indirect=True)
def test_a_job_longer_than_the_stop_grace_is_killed_and_recovered_elsewhere(
    stop_cluster: Cluster,
) -> None:
    """The service manager's whole sequence (docs/deploy.md): SIGTERM to the group, then,
    when the grace period (TimeoutStopSec, terminationGracePeriodSeconds) is over, SIGKILL.
    The short job finishes within the grace, the queued ones are handed back at the
    SIGTERM, and the long one, killed, comes back through orphan recovery."""
    app = _app()
    store = ratchet_state(app).store
    sleep = app.tasks["acc.sleep"]
    long_job = sleep.delay("long", 25.0)
    wait_until(lambda: store.result(long_job.id) is not None, HANG, "the long job stored")
    short = sleep.delay("short", 1.5)
    queued = [sleep.delay(f"q{i}", 0.1) for i in range(4)]
    worker = stop_cluster.start("w1", concurrency=2, **NO_RECOVERY)
    wait_until(lambda: len(side_effects(store)) == 2, HANG, "the long and the short job to run")
    assert {key for key, _ in side_effects(store)} == {"long", "short"}

    os.killpg(worker.pid, signal.SIGTERM)
    wait_until(
        lambda: statuses(store, [short.id]) == Counter({"SUCCEEDED": 1}),
        HANG,
        "the short job to finish within the grace",
    )
    # Claimed behind them: handed back, those in the pool once a process is free.
    wait_until(
        lambda: statuses(store, [q.id for q in queued]) == Counter({"PENDING": 4}),
        HANG,
        "the queued jobs to be handed back",
    )
    assert worker.process.poll() is None  # still finishing the long job: the grace runs out
    worker.kill()  # SIGKILL to the group
    assert statuses(store, [long_job.id]) == Counter({"RUNNING": 1}), stop_cluster.logs()

    stop_cluster.start("w2", concurrency=2, **OUTAGE_SETTINGS)  # a short orphan grace
    wait_until(
        lambda: statuses(store, [q.id for q in queued]) == Counter({"SUCCEEDED": 4}),
        180,
        "the handed-back jobs to run on the second worker",
    )
    wait_until(
        lambda: Counter(key for key, _ in side_effects(store))["long"] == 2,
        180,
        "the long job to be recovered and to start again",
    )
    runs = Counter(key for key, _ in side_effects(store))
    assert runs == Counter({"long": 2, "short": 1, "q0": 1, "q1": 1, "q2": 1, "q3": 1})


# -- stopping while the store is unreachable (a private PostgreSQL server, stopped) ----------


def runs_in(run_log: Path) -> Counter[str]:
    if not run_log.exists():
        return Counter()
    return Counter(line.split()[0] for line in run_log.read_text().splitlines())


@pytest.mark.infra
def test_a_worker_started_while_the_store_is_down_stops_when_told(
    private_postgres: PrivatePostgres, private_app: Celery, tmp_path: Path
) -> None:
    store = ratchet_state(private_app).store
    job = private_app.tasks["acc.noted_sleep"].delay("early", 0.1)
    private_postgres.stop("fast")
    run_log = tmp_path / "runs.log"
    cluster = Cluster(private_app.conf.ratchet_url, tmp_path)
    try:
        worker = cluster.start("w1", RATCHET_ACCEPTANCE_RUN_LOG=str(run_log))
        wait_until(
            lambda: "recurring jobs not registered yet" in worker.log.read_text(),
            HANG,
            "the worker to wait for the store",
        )
        worker.process.send_signal(signal.SIGTERM)
        wait_for_exit(worker, cluster)
    finally:
        cluster.stop_all()
    private_postgres.start()
    record = store.result(job.id)
    assert record is not None and record.status is JobStatus.PENDING
    assert store.list_nodes() == []
    assert runs_in(run_log) == Counter()  # it claimed nothing, ran nothing


@pytest.mark.infra
@pytest.mark.parametrize(
    ("pool", "sigs"),
    [
        ("ratchet", [signal.SIGTERM]),
        ("threads", [signal.SIGTERM]),
        ("ratchet", [signal.SIGQUIT]),
        ("ratchet", [signal.SIGTERM, signal.SIGQUIT]),
    ],
    ids=["ratchet-warm", "threads-warm", "ratchet-cold", "ratchet-warm-then-cold"],
)
def test_a_stop_during_an_outage_exits_and_leaves_its_claims_to_orphan_recovery(
    private_postgres: PrivatePostgres,
    private_app: Celery,
    tmp_path: Path,
    pool: str,
    sigs: list[int],
) -> None:
    """A cold stop too, alone or during a warm one: its handler's writes (the cut-off jobs'
    retry notes) are tried once, and their failure does not cut the stop short."""
    store = ratchet_state(private_app).store
    noted = private_app.tasks["acc.noted_sleep"]
    ids = [noted.delay(f"o{i}", 3.0).id for i in range(12)]
    run_log = tmp_path / "runs.log"
    cluster = Cluster(private_app.conf.ratchet_url, tmp_path)
    try:
        worker = cluster.start(
            "w1", pool=pool, RATCHET_ACCEPTANCE_RUN_LOG=str(run_log), **OUTAGE_SETTINGS
        )
        wait_until(lambda: sum(runs_in(run_log).values()) >= 4, HANG, "four jobs to start")
        private_postgres.stop("fast")
        for sig in sigs:
            worker.process.send_signal(sig)
            if sig == signal.SIGTERM and len(sigs) > 1:
                wait_until(lambda: "warm shutdown" in cluster.logs().lower(), 30, "the warm stop")
        wait_for_exit(worker, cluster)
        private_postgres.start()

        # What it could not write stays RUNNING under its node: nothing was lost.
        after = statuses(store, ids)
        assert set(after) <= {"RUNNING", "PENDING", "SUCCEEDED"}, f"{after}\n{cluster.logs()}"
        assert after["RUNNING"] >= 1, cluster.logs()
        assert "could not be written" in worker.log.read_text()

        cluster.start("w2", RATCHET_ACCEPTANCE_RUN_LOG=str(run_log), **OUTAGE_SETTINGS)
        wait_until(
            lambda: statuses(store, ids) == Counter({"SUCCEEDED": len(ids)}),
            180,
            "every job to succeed after orphan recovery",
        )
    finally:
        cluster.stop_all()
    assert set(runs_in(run_log)) == {f"o{i}" for i in range(12)}
