"""How long a worker takes to exit on each stop signal: celery_ratchet beside Celery on Redis.

    .venv/bin/python bench/stop.py [--rounds 3] [--jobs 24] [--seconds 1.5]

Per case: ``--jobs`` tasks that sleep ``--seconds`` are queued, a ``-c 4`` worker is started
in its own session (as systemd or a container runtime would), and once the first task has
finished the signal is sent — to the whole process group (systemd's KillMode=control-group,
supervisord's stopasgroup) or to the main process only (docker stop, Kubernetes). The figure
is the time from the signal to the main process's exit (median of the rounds); a worker still
there after 30 s counts as hung and is killed. For celery_ratchet the job rows are counted
after the exit: RUNNING ones are left to orphan recovery. Nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from celery import Celery  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
PG_DB = "ratchet_bench_stop"
RATCHET_URL = os.environ.get("BENCH_STOP_URL", f"postgresql://postgres@127.0.0.1/{PG_DB}")
os.environ.setdefault("RATCHET_URL", RATCHET_URL)
HUNG = 30.0

_redis = redis.Redis.from_url(REDIS_URL)

ratchet_app = Celery("bench_stop_ratchet", task_cls="celery_ratchet:RatchetTask")
ratchet_app.conf.update(ratchet_url=os.environ["RATCHET_URL"], ratchet_poll_interval=0.2)
redis_app = Celery("bench_stop_redis", broker=REDIS_URL, backend=REDIS_URL)
redis_app.conf.update(broker_connection_retry_on_startup=True)


def _register(app: Celery, prefix: str) -> None:
    @app.task(name="bench.stop_sleep", shared=False)
    def stop_sleep(seconds: float) -> None:
        time.sleep(seconds)
        _redis.incr(f"{prefix}:done")


_register(ratchet_app, "ratchet")
_register(redis_app, "redis")

POOLS = (("prefork", ("TERM", "INT", "QUIT")), ("threads", ("TERM",)), ("solo", ("TERM",)))
SIGNALS = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "QUIT": signal.SIGQUIT}


def prepare() -> None:
    admin = create_engine(
        "postgresql+psycopg://postgres@127.0.0.1/postgres", isolation_level="AUTOCOMMIT"
    )
    with admin.connect() as conn:
        if not conn.execute(text(f"SELECT 1 FROM pg_database WHERE datname = '{PG_DB}'")).first():
            conn.execute(text(f'CREATE DATABASE "{PG_DB}"'))
    admin.dispose()


def reset() -> None:
    from celery_ratchet.celery.state import ratchet_state

    store = ratchet_state(ratchet_app).store
    store.ensure_schema()
    with store.engine.begin() as conn:
        from celery_ratchet.store.schema import metadata

        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    redis_app.control.purge()
    _redis.delete("ratchet:done", "redis:done")


def ratchet_counts() -> dict[str, int]:
    from celery_ratchet.celery.state import ratchet_state

    return ratchet_state(ratchet_app).store.count_by_status()


def one(app_name: str, pool: str, sig: str, group: bool, jobs: int, seconds: float) -> float:
    app = ratchet_app if app_name == "ratchet" else redis_app
    reset()
    for _ in range(jobs):
        app.tasks["bench.stop_sleep"].delay(seconds)
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            f"bench.stop:{app_name}_app",
            "worker",
            "-P",
            pool,
            "-c",
            "4",
            "-l",
            "warning",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while int(_redis.get(f"{app_name}:done") or 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(seconds / 3)  # the signal lands while jobs run
    sent = time.monotonic()
    if group:
        os.killpg(worker.pid, SIGNALS[sig])
    else:
        worker.send_signal(SIGNALS[sig])
    try:
        worker.wait(HUNG)
        took = time.monotonic() - sent
    except subprocess.TimeoutExpired:
        took = float("inf")
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    rows = f" rows {ratchet_counts()}" if app_name == "ratchet" else ""
    where = "group" if group else "main"
    print(f"      {app_name} -P {pool} SIG{sig} {where}: {took:.2f}s{rows}", flush=True)
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=24)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--only", default="", help="e.g. ratchet or redis")
    args = parser.parse_args()
    prepare()
    cases = [
        (app, pool, sig, group)
        for app in ("ratchet", "redis")
        for pool, sigs in (
            ("prefork", ("TERM", "INT", "QUIT")),
            ("threads", ("TERM",)),
            ("solo", ("TERM",)),
        )
        for sig in sigs
        for group in (True, False)
        if not args.only or app == args.only
    ]
    for app, pool, sig, group in cases:
        used = "ratchet" if app == "ratchet" and pool == "prefork" else pool
        times = [one(app, used, sig, group, args.jobs, args.seconds) for _ in range(args.rounds)]
        where = "group" if group else "main"
        runs = ", ".join(f"{t:.2f}" for t in times)
        median = statistics.median(times)
        print(f"{app:8} -P {used:8} SIG{sig:5} to {where:5}: median {median:.2f}s  (runs: {runs})")


if __name__ == "__main__":
    main()
