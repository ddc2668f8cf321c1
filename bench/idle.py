"""What idle workers cost the database: transactions per second per worker, on PostgreSQL.

Real ``celery worker -P ratchet`` processes run idle (no job, the archiver's daily schedule
registered) on a database of their own, created for the run and dropped after it. The figure
is ``pg_stat_database.xact_commit`` (and ``xact_rollback``) of that database over the window,
divided by the window and the number of workers, once per wake-up mode.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN = os.environ.get("BENCH_PG_ADMIN", "host=127.0.0.1 user=postgres dbname=postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/15")

Report = Callable[..., None]

MODES: dict[str, dict[str, str]] = {
    "LISTEN/NOTIFY (default)": {},
    "polling only": {"RATCHET_LISTEN_NOTIFY": "false"},
    "Redis wake-ups": {"RATCHET_LISTEN_NOTIFY": "false", "RATCHET_EVENTS_URL": REDIS_URL},
}


@contextmanager
def own_database() -> Iterator[str]:
    """A database for this run only; dropped afterwards, with whatever still uses it."""
    name = f"ratchet_idle_{os.getpid()}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    from celery_ratchet.store.jobstore import JobStore

    store = JobStore(f"postgresql://postgres@127.0.0.1/{name}")
    store.ensure_schema()  # before the workers: they would all create it at once
    store.engine.dispose()
    try:
        yield name
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def transactions(dbname: str) -> tuple[int, int]:
    """(commits, rollbacks) of ``dbname`` so far, read from another database so that the
    reading itself is not counted."""
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = %s",
            (dbname,),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def registered_nodes(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            row = conn.execute("SELECT count(*) FROM scheduler_node").fetchone()
        except psycopg.errors.UndefinedTable:
            return 0
    return int(row[0]) if row else 0


def start_worker(url: str, name: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "celery", "-A", "bench.apps:ratchet_app", "--quiet",
               "worker", "-P", "ratchet", "-c", "4", "-n", f"{name}@%h", "-l", "warning",
               "--without-heartbeat", "--without-gossip", "--without-mingle"]  # fmt: skip
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, **env, "RATCHET_URL": url, "PYTHONPATH": str(ROOT)},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def measure(
    dbname: str, env: dict[str, str], workers: int, seconds: float, warmup: float
) -> tuple[float, float]:
    """Commits and rollbacks per second per idle worker."""
    url = f"postgresql://postgres@127.0.0.1/{dbname}"
    if registered_nodes(url):  # none left from the mode before
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DELETE FROM scheduler_node")
    logs = [Path(tempfile.gettempdir()) / f"{dbname}-idle{i}.log" for i in range(workers)]
    from bench.strays import refuse_strays  # after main() put the root on the path

    refuse_strays()
    procs = [start_worker(url, f"idle{i}", env, log) for i, log in enumerate(logs)]
    try:
        deadline = time.monotonic() + 120
        while registered_nodes(url) < workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                tails = "\n".join(log.read_text()[-2000:] for log in logs)
                raise RuntimeError(f"idle workers did not start:\n{tails}")
            time.sleep(0.2)
        # Past start-up (the pool's processes check the schema, schedules are registered):
        # on a loaded machine that takes a while.
        time.sleep(warmup)
        commits, rollbacks = transactions(dbname)
        started = time.monotonic()
        time.sleep(seconds)
        # Backends report their counters at most once a second: give the last ones time.
        time.sleep(1.5)
        commits_after, rollbacks_after = transactions(dbname)
        elapsed = time.monotonic() - started - 1.5
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
    per = elapsed * workers
    return (commits_after - commits) / per, (rollbacks_after - rollbacks) / per


def tick_lag(dbname: str, env: dict[str, str], seconds: float, warmup: float) -> list[float]:
    """One worker with a per-second schedule: how long after its fire time each tick's job
    was claimed (milliseconds, by the database's clock), over ``seconds``."""
    url = f"postgresql://postgres@127.0.0.1/{dbname}"
    log = Path(tempfile.gettempdir()) / f"{dbname}-tick.log"
    from bench.strays import refuse_strays  # after main() put the root on the path

    refuse_strays()
    worker = start_worker(url, "tick", {**env, "BENCH_TICK": "1"}, log)
    try:
        time.sleep(warmup + seconds)
    finally:
        worker.terminate()
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM claimed_at - scheduled_time) * 1000 FROM scheduler_job "
            "WHERE task_name = 'bench.tick' AND claimed_at > now() - make_interval(secs => %s) "
            "ORDER BY 1",
            (seconds,),
        ).fetchall()
        conn.execute("DELETE FROM scheduler_job")
    return [float(r[0]) for r in rows]


def bench_idle(seconds: float, workers: int, report: Report, warmup: float = 20.0) -> None:
    print(
        f"idle: {workers} workers -P ratchet -c 4 on PostgreSQL, no jobs, {seconds:.0f} s; "
        "transactions of their database per second per worker"
    )
    with own_database() as dbname:
        for label, env in MODES.items():
            commits, rollbacks = measure(dbname, env, workers, seconds, warmup)
            report("idle", f"idle worker, {label}", commits, "xact/s",
                   f"{commits:.2f} commits/s per worker, {rollbacks:.2f} rollbacks/s")  # fmt: skip
        print(f"per-second schedule, one worker, {seconds:.0f} s: tick claimed after fire time")
        for label, env in MODES.items():
            lags = tick_lag(dbname, env, seconds, warmup)
            if not lags:
                print(f"  {label}: no tick ran")
                continue
            p50, p90 = lags[len(lags) // 2], lags[int(len(lags) * 0.9)]
            report("idle", f"tick lag p50, {label}", p50, "ms", f"{len(lags)} ticks")
            report("idle", f"tick lag p90, {label}", p90, "ms", f"max {lags[-1]:.1f} ms")


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds before measuring")
    args = parser.parse_args(argv)

    def show(section: str, subject: str, value: float, unit: str, note: str = "") -> Any:
        print(f"  {subject:44} {value:>10,.2f} {unit:8} {note}", flush=True)

    bench_idle(args.seconds, args.workers, show, args.warmup)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
