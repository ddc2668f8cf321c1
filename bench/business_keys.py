"""What a business key costs a ``.delay()`` on PostgreSQL, timed as whole processes.

    .venv/bin/python bench/business_keys.py [--sends 3000] [--rounds 3]

Each measurement is a fresh Python process that imports the app, connects, and sends
``--sends`` tasks, timed from spawn to exit; a process that sends none is timed the same way
and subtracted, so what is left is the sends. Three kinds of send:

- ``plain``: no business key (the multi-row-capable INSERT every send takes today);
- ``keyed``: a new key each send (the INSERT with ``ON CONFLICT (business_key) ... DO
  NOTHING``: one row each);
- ``held``: the same key every send, held by the first job (no row: the conflict, then the
  look-up of the holder's id).

Nothing here asserts anything; read the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PG_SERVER = os.environ.get("BENCH_PG_SERVER", "postgresql://postgres@127.0.0.1:5432")
PG_DB = "ratchet_bench_keys"
URL = f"{PG_SERVER}/{PG_DB}"


def child(kind: str, sends: int) -> None:
    from celery import Celery

    app = Celery("bench_keys", task_cls="celery_ratchet:RatchetTask")
    app.conf.ratchet_url = URL

    @app.task(name="bench.noop", ignore_result=True)
    def noop(i: int = 0) -> None:
        return None

    from celery_ratchet.celery.state import ratchet_state

    ratchet_state(app).store.ensure_schema()
    run = uuid.uuid4().hex
    for i in range(sends):
        if kind == "plain":
            noop.delay(i)
        elif kind == "keyed":
            noop.apply_async((i,), ratchet={"business_key": f"{run}-{i}"})
        else:
            noop.apply_async((i,), ratchet={"business_key": run})


def timed(kind: str, sends: int) -> float:
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, __file__, "--child", kind, "--sends", str(sends)],
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return time.perf_counter() - began


def fresh_database() -> None:
    from sqlalchemy import create_engine, text

    admin = create_engine(
        f"{PG_SERVER.replace('postgresql://', 'postgresql+psycopg://')}/postgres",
        isolation_level="AUTOCOMMIT",
    )
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {PG_DB}"))
        conn.execute(text(f"CREATE DATABASE {PG_DB}"))
    admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sends", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=["plain", "keyed", "held", "none"])
    args = parser.parse_args()
    if args.child:
        child(args.child, 0 if args.child == "none" else args.sends)
        return
    fresh_database()
    timed("none", 0)  # creates the schema, warms the disk cache
    print(f"PostgreSQL, {args.sends} sends per process, median of {args.rounds} processes")
    kinds = ("none", "plain", "keyed", "held")
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(args.rounds):  # interleaved: a noisy machine's drift hits every kind alike
        for kind in kinds:
            times[kind].append(timed(kind, args.sends))
    startup = statistics.median(times["none"])
    print(f"  process start, connect, no send: {startup:.2f} s")
    for kind in kinds[1:]:
        total = statistics.median(times[kind])
        per_send = (total - startup) / args.sends * 1e6
        print(
            f"  {kind:6} whole process {total:6.2f} s   per .delay() {per_send:6.0f} µs   "
            f"{args.sends / (total - startup):6.0f} /s"
        )


if __name__ == "__main__":
    main()
