"""celery_ratchet beside raw SQL and beside Celery on its Redis broker, in one run.

    ./dev bench [--jobs 10000] [--quick]
    ./dev bench schedules [--schedules 2000] [--every 10] [--workers 3]   (bench/schedules.py)
    ./dev bench backlog [--sizes 10000,1000000] [--claims 2000] [--rounds 12] (bench/backlog.py)
    ./dev bench pinned [--jobs 10000] [--runs 2]   the drains, servers on a core of their own
    ./dev bench pairs [--jobs 20000] [--rounds 3]   the drains as alternated pairs against
                                                    stock Celery, results off and on
                                                    (bench/pairs.py)
    ./dev bench db-cost [--jobs 20000]   what PostgreSQL pays a job, beside pgqueuer and
                                         procrastinate (bench/db_cost.py)
    ./dev bench celery-suite [all|stock|taskcls|ratchet|taskcls-redisres|ratchet-redisres]
                             Celery's own integration suite (bench/celery_suite/README.md)

Measures on PostgreSQL: enqueue rate (``.delay()`` in a loop), bulk enqueue (a group of
1,000), drain rate (N queued no-op tasks, one worker, ``-c 4``, timed from worker start,
and steady: from the first job done to the last), worker memory (peak RSS of the worker's
processes while draining) and enqueue→start latency with an idle worker, and what idle
workers cost the database (transactions per second per worker, ``--only idle``; see
bench/idle.py). Beside it: a raw psycopg autocommit INSERT of the same row, and Celery 5.7
on Redis. Nothing here asserts anything; read the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import redis  # noqa: E402
from celery import chain, chord, group  # noqa: E402
from sqlalchemy import create_engine  # noqa: E402

PG_ADMIN = os.environ.get("BENCH_PG_ADMIN", "host=127.0.0.1 user=postgres dbname=postgres")
PG_DB = "ratchet_bench"
os.environ.setdefault("RATCHET_URL", f"postgresql://postgres@127.0.0.1/{PG_DB}")

import celery_ratchet  # noqa: E402
from bench.apps import REDIS_URL, ratchet_app, redis_app  # noqa: E402
from bench.claim import bench_claim  # noqa: E402
from bench.idle import bench_idle  # noqa: E402
from bench.procs import children  # noqa: E402
from bench.strays import refuse_strays  # noqa: E402
from celery_ratchet.celery.state import ratchet_state  # noqa: E402

RESULTS: list[dict[str, Any]] = []
_redis = redis.Redis.from_url(REDIS_URL)


def report(section: str, subject: str, value: float, unit: str, note: str = "") -> None:
    RESULTS.append(
        {
            "section": section,
            "subject": subject,
            "value": round(value, 1),
            "unit": unit,
            "note": note,
        }
    )
    print(f"  {subject:44} {value:>10,.1f} {unit:8} {note}", flush=True)


def median_rate(rounds: int, n: int, once: Callable[[int], None]) -> float:
    rates = []
    for r in range(rounds):
        start = time.perf_counter()
        once(r)
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates)


# -- setup -------------------------------------------------------------------------------


def prepare_database() -> None:
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (PG_DB,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{PG_DB}"')
    ratchet_state(ratchet_app).store.ensure_schema()


def reset() -> None:
    store = ratchet_state(ratchet_app).store
    with store.engine.connect() as conn:
        conn.exec_driver_sql("TRUNCATE scheduler_job, scheduler_node")
    _redis.flushdb()


def claim_urls() -> dict[str, str]:
    """The bench database on PostgreSQL, and on MariaDB (created if missing)."""
    mysql_admin = create_engine(
        "mysql+pymysql://root@127.0.0.1:3306/", isolation_level="AUTOCOMMIT"
    )
    with mysql_admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE IF NOT EXISTS {PG_DB} CHARACTER SET utf8mb4")
    mysql_admin.dispose()
    return {
        "postgresql": os.environ["RATCHET_URL"],
        "mysql": f"mysql://root@127.0.0.1:3306/{PG_DB}",
    }


def raw_connection() -> psycopg.Connection[Any]:
    return psycopg.connect(f"host=127.0.0.1 user=postgres dbname={PG_DB}", autocommit=True)


# -- enqueue -----------------------------------------------------------------------------

RAW_INSERT = (
    "INSERT INTO scheduler_job (job_id, task_name, queue, status, job_type, priority, "
    "scheduled_time, created_at, attempts, claims, payload, content_type, content_encoding, "
    "headers, properties) VALUES (%s, 'bench.noop', 'celery', 'PENDING', 'SINGLE', 4, now(), "
    "now(), 0, 0, %s, 'application/json', 'utf-8', %s, %s)"
)


def _raw_row(i: int, tag: str) -> tuple[str, bytes, str, str]:
    """A row as big as the one .delay() writes: same payload, headers and properties."""
    job_id = f"raw-{tag}-{i}"
    headers = json.dumps(
        {
            "lang": "py",
            "task": "bench.noop",
            "id": job_id,
            "retries": 0,
            "root_id": job_id,
            "argsrepr": f"({i},)",
            "kwargsrepr": "{}",
            "origin": "gen1@bench",
            "ignore_result": True,
        }
    )
    return (job_id, json.dumps([[i], {}, {"callbacks": None}]).encode(), headers, '{"priority": 4}')


def bench_enqueue(n: int, rounds: int) -> None:
    print(f"enqueue: {n} single sends, median of {rounds} rounds")
    reset()
    with raw_connection() as conn:
        raw = median_rate(
            rounds, n, lambda r: [conn.execute(RAW_INSERT, _raw_row(i, f"{r}")) for i in range(n)]
        )
    report("enqueue", "raw psycopg INSERT (autocommit, same row)", raw, "jobs/s")
    reset()
    noop = ratchet_app.tasks["bench.noop"]
    noop.delay(0)
    ours = median_rate(rounds, n, lambda r: [noop.delay(i) for i in range(n)])
    redis_noop = redis_app.tasks["bench.noop"]
    redis_noop.delay(0)
    celery = median_rate(rounds, n, lambda r: [redis_noop.delay(i) for i in range(n)])
    report(
        "enqueue",
        "celery_ratchet .delay() on PostgreSQL",
        ours,
        "jobs/s",
        f"{ours / raw:.2f}x raw, {ours / celery:.2f}x Celery on Redis",
    )
    report("enqueue", "Celery .delay() on Redis", celery, "jobs/s")


def bench_bulk(rounds: int) -> None:
    print(f"bulk enqueue: a group of 1,000, median of {rounds} rounds")
    reset()
    with raw_connection() as conn:

        def raw_once(r: int) -> None:
            with conn.cursor() as cur, conn.transaction():
                cur.executemany(RAW_INSERT, [_raw_row(i, f"bulk{r}") for i in range(1000)])

        raw = median_rate(rounds, 1000, raw_once)
    report("bulk", "raw psycopg executemany of 1,000", raw, "jobs/s")
    noop = ratchet_app.tasks["bench.noop"]
    redis_noop = redis_app.tasks["bench.noop"]
    group([noop.s(i) for i in range(10)]).apply_async()
    ours = median_rate(
        rounds, 1000, lambda r: group([noop.s(i) for i in range(1000)]).apply_async()
    )
    celery = median_rate(
        rounds, 1000, lambda r: group([redis_noop.s(i) for i in range(1000)]).apply_async()
    )
    report(
        "bulk",
        "celery_ratchet group of a list of 1,000",
        ours,
        "jobs/s",
        f"{ours / raw:.2f}x raw, {ours / celery:.2f}x Celery on Redis",
    )
    # A group of a generator is written member by member, as the generator yields them (as
    # stock Celery publishes them), not as one insert.
    lazy = median_rate(rounds, 1000, lambda r: group(noop.s(i) for i in range(1000)).apply_async())
    lazy_celery = median_rate(
        rounds, 1000, lambda r: group(redis_noop.s(i) for i in range(1000)).apply_async()
    )
    report(
        "bulk",
        "celery_ratchet group of a generator of 1,000",
        lazy,
        "jobs/s",
        f"{lazy / lazy_celery:.2f}x Celery on Redis",
    )

    def bulk_once(r: int) -> None:
        with celery_ratchet.bulk(ratchet_app) as producer:
            for i in range(1000):
                noop.apply_async((i,), producer=producer)

    in_bulk = median_rate(rounds, 1000, bulk_once)
    report("bulk", "celery_ratchet.bulk() of 1,000", in_bulk, "jobs/s", f"{in_bulk / raw:.2f}x raw")
    report("bulk", "Celery group of a list of 1,000 on Redis", celery, "jobs/s")
    report("bulk", "Celery group of a generator of 1,000 on Redis", lazy_celery, "jobs/s")


# -- workers -----------------------------------------------------------------------------


def start_worker(
    app_name: str,
    pool: str,
    *extra: str,
    env: dict[str, str] | None = None,
    alone: bool = True,
) -> subprocess.Popen[bytes]:
    """Start a bench worker; ``alone``: refuse while another bench worker runs."""
    if alone:
        refuse_strays()
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        f"bench.apps:{app_name}",
        "--quiet",
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
        *extra,
    ]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def tree_rss_kb(pid: int) -> int:
    """Resident memory of a process and its descendants, in kB."""
    tree = children()
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        todo += tree.get(current, [])
        try:
            for line in (Path("/proc") / str(current) / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def stop(worker: subprocess.Popen[bytes]) -> None:
    worker.terminate()
    try:
        worker.wait(60)
    except subprocess.TimeoutExpired:
        worker.kill()


def drain(label: str, app_name: str, prefix: str, pool: str, n: int, task: str) -> None:
    reset()
    app = ratchet_app if app_name == "ratchet_app" else redis_app
    sig = app.tasks[task]
    with app.producer_or_acquire() as producer:
        for i in range(n):
            sig.apply_async((i,), producer=producer)
    start = time.perf_counter()
    worker = start_worker(app_name, pool)
    peak = 0
    counter = f"{prefix}:done"
    # The worker's start (imports, bootsteps) is in the first figure, as a deployment pays
    # it; the second counts from the first job done to the last, the steady rate alone.
    first: tuple[float, int] | None = None
    try:
        while (done := int(_redis.get(counter) or 0)) < n:
            if first is None and done > 0:
                first = (time.perf_counter(), done)
            peak = max(peak, tree_rss_kb(worker.pid))
            if time.perf_counter() - start > 600:
                raise RuntimeError(f"{label}: not drained after 600 s")
            time.sleep(0.05 if first is not None else 0.005)
        ended = time.perf_counter()
        peak = max(peak, tree_rss_kb(worker.pid))
    finally:
        stop(worker)
    report("drain", label, n / (ended - start), "jobs/s", f"peak RSS {peak / 1024:.0f} MB")
    if first is not None and ended > first[0]:
        report("drain", f"{label}, steady", (n - first[1]) / (ended - first[0]), "jobs/s")
    RESULTS.append(
        {
            "section": "memory",
            "subject": label,
            "value": round(peak / 1024, 1),
            "unit": "MB",
            "note": "",
        }
    )


def bench_drain(n: int) -> None:
    print(f"drain: {n} queued no-op tasks, one worker -c 4, timed from worker start")
    drain("celery_ratchet -P threads", "ratchet_app", "ratchet", "threads", n, "bench.noop")
    drain(
        "celery_ratchet -P ratchet (prefork)", "ratchet_app", "ratchet", "ratchet", n, "bench.noop"
    )
    drain(
        "celery_ratchet -P threads, results stored",
        "ratchet_app",
        "ratchet",
        "threads",
        n,
        "bench.echo",
    )
    drain(
        "celery_ratchet -P ratchet (prefork), results stored",
        "ratchet_app",
        "ratchet",
        "ratchet",
        n,
        "bench.echo",
    )
    drain("Celery on Redis -P threads", "redis_app", "redis", "threads", n, "bench.noop")
    drain("Celery on Redis -P prefork", "redis_app", "redis", "prefork", n, "bench.noop")


def bench_canvas(size: int, steps: int, rounds: int) -> None:
    print(f"canvas: a chord of {size} children, a chain of {steps} steps; worker -P threads -c 4")
    for label, app_name, env in (
        ("celery_ratchet (LISTEN/NOTIFY)", "ratchet_app", {}),
        ("Celery on Redis", "redis_app", {}),
    ):
        reset()
        app = ratchet_app if app_name == "ratchet_app" else redis_app
        echo, total, inc = (app.tasks[f"bench.{n}"] for n in ("echo", "total", "inc"))
        worker = start_worker(app_name, "threads", env=env)
        try:
            assert chain(inc.s(0), inc.s()).apply_async().get(timeout=120) == 2  # worker up
            chords, chains = [], []
            for _ in range(rounds):
                # interval: how often get() reads the row (Redis pushes results instead)
                start = time.perf_counter()
                body = chord(echo.s(i) for i in range(size))(total.s())
                assert body.get(timeout=600, interval=0.01) == sum(range(size))
                chords.append(time.perf_counter() - start)
                start = time.perf_counter()
                steps_ = chain(inc.s(0), *[inc.s() for _ in range(steps - 1)]).apply_async()
                assert steps_.get(timeout=600, interval=0.01) == steps
                chains.append(time.perf_counter() - start)
        finally:
            stop(worker)
        report("canvas", f"{label}: chord of {size}", statistics.median(chords), "s",
               "submit to body result, median")  # fmt: skip
        report("canvas", f"{label}: chain of {steps}", steps / statistics.median(chains),
               "steps/s", "one step after another, median")  # fmt: skip


def latency(
    label: str, app_name: str, prefix: str, samples: int, env: dict[str, str], gap: float = 0.05
) -> None:
    reset()
    app = ratchet_app if app_name == "ratchet_app" else redis_app
    # The sender takes part in wake-ups too (its INSERT notifies, it publishes to Redis).
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    ratchet_state(ratchet_app).reset()
    try:
        _latency(label, app, prefix, samples, env, gap)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        ratchet_state(ratchet_app).reset()


def _latency(
    label: str, app: Any, prefix: str, samples: int, env: dict[str, str], gap: float
) -> None:
    app_name = "ratchet_app" if app is ratchet_app else "redis_app"
    stamp = app.tasks["bench.stamp"]
    worker = start_worker(app_name, "threads", env=env)
    try:
        warm = time.time()
        stamp.delay(warm)
        deadline = time.time() + 60
        while not _redis.llen(f"{prefix}:latency"):
            if time.time() > deadline:
                raise RuntimeError(f"{label}: worker did not start")
            time.sleep(0.05)
        _redis.delete(f"{prefix}:latency")
        for _ in range(samples):
            stamp.delay(time.time())
            time.sleep(gap)
        deadline = time.time() + 60
        while _redis.llen(f"{prefix}:latency") < samples and time.time() < deadline:
            time.sleep(0.05)
        values = sorted(float(v) * 1000 for v in _redis.lrange(f"{prefix}:latency", 0, -1))
    finally:
        stop(worker)
    p50 = values[len(values) // 2]
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    report("latency", f"{label} p50", p50, "ms")
    report("latency", f"{label} p99", p99, "ms")


def bench_latency(samples: int, sparse: int) -> None:
    print(
        f"enqueue→start latency, -P threads: {samples} tasks 50 ms apart (busy), then "
        f"{sparse} tasks 1.5 s apart (a worker idle between them)"
    )
    polling = {"RATCHET_LISTEN_NOTIFY": "false"}
    for label, app_name, prefix, env in (
        ("celery_ratchet, polling only, poll 1 s", "ratchet_app", "ratchet", polling),
        (
            "celery_ratchet, polling only, poll 0.1 s",
            "ratchet_app",
            "ratchet",
            {**polling, "RATCHET_POLL_INTERVAL": "0.1"},
        ),
        ("celery_ratchet, LISTEN/NOTIFY (default)", "ratchet_app", "ratchet", {}),
        (
            "celery_ratchet, Redis wake-ups",
            "ratchet_app",
            "ratchet",
            {**polling, "RATCHET_EVENTS_URL": REDIS_URL},
        ),
        ("Celery on Redis", "redis_app", "redis", {}),
    ):
        latency(f"{label}, busy", app_name, prefix, samples, env)
        latency(f"{label}, idle", app_name, prefix, sparse, env, gap=1.5)


def main() -> None:
    if sys.argv[1:2] == ["celery-suite"]:  # a script of its own: bench/celery_suite/run.sh
        script = str(ROOT / "bench" / "celery_suite" / "run.sh")
        os.execv(script, [script, *(sys.argv[2:] or ["all"])])
    if sys.argv[1:2] == ["schedules"]:  # its own command line: see bench/schedules.py
        from bench.schedules import main as schedules

        schedules(sys.argv[2:])
        return
    if sys.argv[1:2] == ["backlog"]:  # its own command line: see bench/backlog.py
        from bench.backlog import main as backlog

        backlog(sys.argv[2:])
        return
    if sys.argv[1:2] == ["db-cost"]:  # its own command line: see bench/db_cost.py
        from bench.db_cost import main as db_cost

        db_cost(sys.argv[2:])
        return
    if sys.argv[1:2] == ["pairs"]:  # its own command line: see bench/pairs.py
        from bench.pairs import main as pairs

        pairs(sys.argv[2:])
        return
    if sys.argv[1:2] == ["pinned"]:  # its own command line: see bench/pinned.py
        from bench.pinned import main as pinned

        pinned(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs to drain")
    parser.add_argument("--enqueue", type=int, default=3_000, help="single sends per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-samples", type=int, default=200)
    parser.add_argument("--idle-samples", type=int, default=12)
    parser.add_argument("--quick", action="store_true", help="small numbers, for a smoke run")
    parser.add_argument(
        "--only", choices=["enqueue", "bulk", "drain", "latency", "claim", "canvas", "idle"]
    )
    parser.add_argument("--idle-seconds", type=float, default=30.0, help="idle window")
    parser.add_argument("--idle-workers", type=int, default=2)
    parser.add_argument("--backlog", type=int, default=20_000, help="pending rows to claim from")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.enqueue, args.rounds = 500, 300, 1
        args.latency_samples, args.idle_samples = 20, 3
        args.backlog = 1_000
        args.idle_seconds = 10.0
    prepare_database()
    sections = {
        "enqueue": lambda: bench_enqueue(args.enqueue, args.rounds),
        "bulk": lambda: bench_bulk(args.rounds),
        "drain": lambda: bench_drain(args.jobs),
        "latency": lambda: bench_latency(args.latency_samples, args.idle_samples),
        "claim": lambda: bench_claim(claim_urls(), args.backlog, args.backlog // 2, report),
        "canvas": lambda: bench_canvas(1000 if not args.quick else 100, 50, args.rounds),
        "idle": lambda: bench_idle(args.idle_seconds, args.idle_workers, report),
    }
    for name, run in sections.items():
        if args.only in (None, name):
            run()
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    path = out / time.strftime("%Y%m%d-%H%M%S.json")
    path.write_text(json.dumps(RESULTS, indent=2))
    print(f"written: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
