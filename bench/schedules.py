"""Recurring schedules at scale: N schedules every P seconds on W real workers, on PostgreSQL.

    ./dev bench schedules [--schedules 2000] [--every 10] [--workers 3] [--window 60]
    ./dev bench schedules --ceiling [--every 10] [--workers 3]

Each schedule fires ``bench.occurrence``, which records in Redis (database 12, which no
other bench flushes) its job id (so a tick run twice shows) and how late it started: the
wall clock at its start minus its fire time (the task's ``eta``). Schedules are spread over
the period by default (cron ``s/P`` with s = i mod P: N/P occurrences each second);
``--aligned`` makes them all ``every=P`` (N at once every P seconds). Workers (``celery
worker -P threads -c 4`` each, ``--pool`` to change) start after the schedules are
registered, on a database of their own (created, then dropped); after a warm-up the window
is measured: ticks whose fire time falls in it, expected from the schedules themselves,
against those that ran. ``--ceiling`` raises the schedule count until start lateness p99
passes 1 s (or a tick is missed or run twice) and reports the last rate fired on time.
Nothing here asserts anything; read the figures.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import psycopg
import redis

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN = os.environ.get("BENCH_PG_ADMIN", "host=127.0.0.1 user=postgres dbname=postgres")
REDIS_URL = os.environ.get("BENCH_SCHEDULES_REDIS_URL", "redis://127.0.0.1:6379/12")
KEY_PREFIX = "bench-sched-"


@contextmanager
def own_database() -> Iterator[str]:
    """A PostgreSQL database for this run only, with the schema; dropped afterwards."""
    name = f"ratchet_sched_{os.getpid()}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql://postgres@127.0.0.1/{name}"
    from celery_ratchet.store.jobstore import JobStore

    store = JobStore(url)
    store.ensure_schema()
    store.engine.dispose()
    try:
        yield url
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def schedule_texts(count: int, every: int, aligned: bool) -> list[str]:
    """The schedule of each of ``count`` schedules, as the store keeps it."""
    if aligned or 60 % every:
        return [f"every:{float(every)!r}"] * count
    return [f"cron:{i % every}/{every} * * * * ?" for i in range(count)]


def register(url: str, count: int, every: int, aligned: bool, processes: int = 4) -> None:
    """Register the schedules from processes of their own (the bench app reads its URL from
    the environment when imported), each a share of them."""
    code = (
        "import sys\n"
        "from bench.schedules import _register_here\n"
        "_register_here(*map(int, sys.argv[1:]))\n"
    )
    env = {**os.environ, "RATCHET_URL": url, "PYTHONPATH": str(ROOT)}
    args = [str(count), str(every), "1" if aligned else "0", str(processes)]
    procs = [subprocess.Popen([sys.executable, "-c", code, *args, str(share)], cwd=ROOT, env=env)
             for share in range(processes)]  # fmt: skip
    if any(p.wait() for p in procs):
        raise RuntimeError("schedules were not registered")


def _register_here(count: int, every: int, aligned: int, shares: int, share: int) -> None:
    from bench.apps import ratchet_app
    from celery_ratchet.celery.schedules.recurring import schedule_recurring

    signature = ratchet_app.signature("bench.occurrence")
    for i, text in enumerate(schedule_texts(count, every, bool(aligned))):
        if i % shares != share:
            continue
        kind, _, value = text.partition(":")
        schedule_recurring(
            ratchet_app,
            value if kind == "cron" else None,
            "UTC",
            signature,
            business_key=f"{KEY_PREFIX}{i}",
            every=float(value) if kind == "every" else None,
        )


def start_worker(url: str, name: str, pool: str, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "celery", "-A", "bench.apps:ratchet_app", "--quiet",
               "worker", "-P", pool, "-c", "4", "-n", f"{name}@%h", "-l", "warning",
               "--without-heartbeat", "--without-gossip", "--without-mingle"]  # fmt: skip
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, "RATCHET_URL": url, "PYTHONPATH": str(ROOT)},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def registered_nodes(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM scheduler_node").fetchone()
    return int(row[0]) if row else 0


def expected_ticks(texts: list[str], start: float, end: float) -> int:
    """Fire times in [start, end) of every schedule, from the schedules themselves."""
    from celery_ratchet.domain.schedule import schedule_from_text

    total = 0
    begin = datetime.fromtimestamp(start - 1e-6, timezone.utc)
    for text in set(texts):
        schedule = schedule_from_text(text)
        count, cursor = 0, schedule.next_after(begin)
        while cursor is not None and cursor.timestamp() < end:
            count += 1
            cursor = schedule.next_after(cursor)
        total += count * texts.count(text)
    return total


@dataclass
class Outcome:
    schedules: int
    every: int
    expected: int
    ran: int
    duplicates: int
    p50: float
    p99: float
    worst: float

    @property
    def rate(self) -> float:
        return self.schedules / self.every

    @property
    def on_time(self) -> bool:
        return self.ran == self.expected and not self.duplicates and self.p99 <= 1.0

    def show(self) -> None:
        missed = self.expected - self.ran
        print(
            f"  {self.schedules} schedules every {self.every} s ({self.rate:,.0f} occurrences/s):"
            f" {self.expected} ticks due, {self.ran} ran, {missed} missed, "
            f"{self.duplicates} run twice; start lateness p50 {self.p50:.3f} s, "
            f"p99 {self.p99:.3f} s, max {self.worst:.3f} s",
            flush=True,
        )


def run_once(
    count: int, every: int, workers: int, window: float, warmup: float, aligned: bool, pool: str
) -> Outcome:
    board = redis.Redis.from_url(REDIS_URL)
    board.delete("schedules:runs", "schedules:late")
    texts = schedule_texts(count, every, aligned)
    with own_database() as url:
        register(url, count, every, aligned)
        logs = [Path(tempfile.gettempdir()) / f"ratchet-sched-{os.getpid()}-{i}.log"
                for i in range(workers)]  # fmt: skip
        from bench.strays import refuse_strays  # after main() put the root on the path

        refuse_strays()
        procs = [start_worker(url, f"sched{i}", pool, log) for i, log in enumerate(logs)]
        try:
            deadline = time.monotonic() + 120
            while registered_nodes(url) < workers:
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    tails = "\n".join(log.read_text()[-2000:] for log in logs)
                    raise RuntimeError(f"workers did not start:\n{tails}")
                time.sleep(0.2)
            start = time.time() + warmup
            end = start + window
            expected = expected_ticks(texts, start, end)
            # Wait for the window's ticks to run: late ones too, up to a minute after it.
            while time.time() < end + 60:
                time.sleep(1.0)
                if time.time() < end:
                    continue
                if _window_runs(board, start, end)[0] >= expected:
                    break
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
    ran, duplicates, lateness = _window_runs(board, start, end)
    lateness.sort()
    pick = (lambda q: lateness[min(len(lateness) - 1, int(len(lateness) * q))]) if lateness else (
        lambda q: float("nan"))  # fmt: skip
    return Outcome(count, every, expected, ran, duplicates, pick(0.5), pick(0.99),
                   lateness[-1] if lateness else float("nan"))  # fmt: skip


def _window_runs(board: redis.Redis, start: float, end: float) -> tuple[int, int, list[float]]:
    """(distinct ticks run, extra runs, start lateness of each distinct tick) for the ticks
    whose fire time is in [start, end)."""
    runs = {k.decode(): int(v) for k, v in board.hgetall("schedules:runs").items()}
    in_window = {}
    for job_id, count in runs.items():
        fired = datetime.fromisoformat(job_id.rpartition("@")[2]).timestamp()
        if start <= fired < end:
            in_window[job_id] = count
    lateness = []
    for entry in board.lrange("schedules:late", 0, -1):
        eta, _, started = entry.decode().partition("|")
        fired = datetime.fromisoformat(eta).timestamp()
        if start <= fired < end:
            lateness.append(float(started) - fired)
    duplicates = sum(c - 1 for c in in_window.values())
    return len(in_window), duplicates, lateness


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="./dev bench schedules", description=__doc__)
    parser.add_argument("--schedules", type=int, default=2000)
    parser.add_argument("--every", type=int, default=10, help="period of each, seconds")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before the window")
    parser.add_argument("--aligned", action="store_true", help="all fire at the same instants")
    parser.add_argument("--pool", default="threads")
    parser.add_argument("--ceiling", action="store_true", help="raise schedules until late")
    args = parser.parse_args(argv)
    mode = "aligned" if args.aligned else "spread over the period"
    print(f"schedules: {args.workers} workers -P {args.pool} -c 4 on PostgreSQL, {mode}, "
          f"{args.warmup:.0f} s warm-up, {args.window:.0f} s window")  # fmt: skip
    if not args.ceiling:
        run_once(args.schedules, args.every, args.workers, args.window, args.warmup,
                 args.aligned, args.pool).show()  # fmt: skip
        return
    count, best = args.schedules, None
    while True:
        outcome = run_once(count, args.every, args.workers, args.window, args.warmup,
                           args.aligned, args.pool)  # fmt: skip
        outcome.show()
        if not outcome.on_time:
            break
        best = outcome
        count *= 2 if count < 8000 else 1.5
        count = int(count)
    if best is None:
        print(f"  ceiling: below {outcome.rate:,.0f} occurrences/s")
    else:
        print(f"  ceiling: {best.rate:,.0f} occurrences/s on time, "
              f"late at {outcome.rate:,.0f}")  # fmt: skip


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
