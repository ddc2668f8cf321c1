"""The drains as alternated pairs: each celery_ratchet drain right before the same drain
on Celery's Redis broker (the same pool, ``-c 4``), round after round, and the ratio pair by
pair, so that a ratio holds while this shared machine's speed drifts.

    ./dev bench pairs [--jobs 20000] [--rounds 3] [--only threads,prefork,...]

Four pairs: ``-P threads`` against stock ``-P threads``, ``-P ratchet`` (prefork) against
stock ``-P prefork``, and both again with each job's result stored (celery_ratchet's in the
job row, stock's in Redis, the broker's own server). Each drain reports the whole drain
(from the worker's start, as a deployment pays it) and its steady middle: the jobs from
the tenth to the ninetieth percentile over the time between them, without the start and
the last stragglers. Also the worker tree's cpu a job (user+sys, from ``/proc``) and, on
celery_ratchet's side, PostgreSQL's (every ``postgres`` process). Nothing here asserts
anything; read the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import run  # noqa: E402
from bench.apps import ratchet_app, redis_app  # noqa: E402
from bench.procs import children  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Pair:
    name: str
    ratchet_pool: str
    stock_pool: str
    task: str


PAIRS = {
    "threads": Pair("-P threads", "threads", "threads", "bench.noop"),
    "prefork": Pair("-P ratchet (prefork) / stock -P prefork", "ratchet", "prefork", "bench.noop"),
    "threads-results": Pair("-P threads, results stored", "threads", "threads", "bench.echo"),
    "prefork-results": Pair(
        "-P ratchet (prefork) / stock -P prefork, results stored",
        "ratchet",
        "prefork",
        "bench.echo",
    ),
}


@dataclass(frozen=True)
class Drain:
    whole: float  # jobs/s from the worker's start
    steady: float  # jobs/s from the 10th to the 90th percentile
    worker_ms: float  # the worker tree's cpu a job over the steady window
    postgres_ms: float  # every postgres process's cpu a job over the same window


def _cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def _postgres_pids() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as f:
                    if f.read().strip() == "postgres":
                        found.append(int(entry))
            except OSError:
                continue
    return found


def drain(side: str, pool: str, task: str, n: int) -> Drain:
    """Queue ``n`` jobs of ``task``, start one worker, time it until all are done."""
    run.reset()
    app = ratchet_app if side == "ratchet" else redis_app
    sig = app.tasks[task]
    with app.producer_or_acquire() as producer:
        for i in range(n):
            sig.apply_async((i,), producer=producer)
    counter = f"{side}:done"
    low, high = n // 10, n - n // 10
    start = time.perf_counter()
    worker = run.start_worker("ratchet_app" if side == "ratchet" else "redis_app", pool)
    marks: dict[str, tuple[float, int, float, float]] = {}
    try:
        while (done := int(run._redis.get(counter) or 0)) < n:
            for name, at in (("low", low), ("high", high)):
                if name not in marks and done >= at:
                    tree = [worker.pid, *children().get(worker.pid, [])]
                    marks[name] = (
                        time.perf_counter(),
                        done,
                        _cpu_seconds(tree),
                        _cpu_seconds(_postgres_pids()),
                    )
            if time.perf_counter() - start > 600:
                raise RuntimeError(f"{side} {pool}: not drained after 600 s")
            time.sleep(0.005)
        ended = time.perf_counter()
    finally:
        run.stop(worker)
    (t0, d0, w0, p0), (t1, d1, w1, p1) = marks["low"], marks["high"]
    jobs = max(d1 - d0, 1)
    return Drain(
        whole=n / (ended - start),
        steady=jobs / (t1 - t0),
        worker_ms=1000 * (w1 - w0) / jobs,
        postgres_ms=1000 * (p1 - p0) / jobs if side == "ratchet" else 0.0,
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--only", default=",".join(PAIRS), help="comma-separated: " + ", ".join(PAIRS)
    )
    args = parser.parse_args(argv)
    run.prepare_database()
    for key in args.only.split(","):
        pair = PAIRS[key]
        print(f"{pair.name}: {args.jobs} jobs a drain, -c 4, {args.rounds} alternated pairs")
        whole, steady = [], []
        for r in range(args.rounds):
            ours = drain("ratchet", pair.ratchet_pool, pair.task, args.jobs)
            stock = drain("redis", pair.stock_pool, pair.task, args.jobs)
            whole.append(ours.whole / stock.whole)
            steady.append(ours.steady / stock.steady)
            print(
                f"  pair {r + 1}: whole {ours.whole:,.0f} / {stock.whole:,.0f} jobs/s "
                f"= {whole[-1]:.2f}x; steady {ours.steady:,.0f} / {stock.steady:,.0f} "
                f"= {steady[-1]:.2f}x; worker cpu a job {ours.worker_ms:.3f} / "
                f"{stock.worker_ms:.3f} ms; postgres {ours.postgres_ms:.3f} ms",
                flush=True,
            )
        print(
            f"  median ratio: whole {statistics.median(whole):.2f}x, "
            f"steady {statistics.median(steady):.2f}x"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
