"""A streaming batch's producer memory and throughput, on PostgreSQL and MariaDB.

    .venv/bin/python bench/stream.py [--counts 20000,200000] [--dialects postgresql,mysql]
        [--workers 2] [--no-process] [--chunked]

For each database and count: a fresh database, ``--workers`` worker processes
(``celery -A tests.acceptance.stream_app worker -P ratchet -c 4``) started first, then a
producer process streaming COUNT items, one child each (chunks of 1,000), or with
``--chunked`` one child per chunk of 1,000 items. Reports the
producer's peak RSS before and after streaming, the time the stream took, the time until
the success callback ran, and whether every item ran exactly once. With ``--no-process`` no
worker runs: only the producer is measured. Nothing here asserts anything; read the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, text  # noqa: E402

SERVERS = {
    "postgresql": ("postgresql+psycopg://postgres@127.0.0.1:5432", '"'),
    "mysql": ("mysql+pymysql://root@127.0.0.1:3306", "`"),
}
DB = "ratchet_bench_stream"


def fresh_database(dialect: str) -> str:
    base, quote = SERVERS[dialect]
    admin = create_engine(f"{base}/{'postgres' if dialect == 'postgresql' else ''}",
                          isolation_level="AUTOCOMMIT")  # fmt: skip
    with admin.connect() as conn:
        force = " WITH (FORCE)" if dialect == "postgresql" else ""
        conn.execute(text(f"DROP DATABASE IF EXISTS {quote}{DB}{quote}{force}"))
        conn.execute(text(f"CREATE DATABASE {quote}{DB}{quote}"))
    admin.dispose()
    url = f"{base}/{DB}"
    with create_engine(url).begin() as conn:
        conn.execute(text("CREATE TABLE acceptance_run (run_key VARCHAR(100), pid INTEGER, "
                          "ppid INTEGER)"))  # fmt: skip
    return url


def run_keys(url: str, prefix: str) -> list[str]:
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT run_key FROM acceptance_run WHERE run_key LIKE :p"), {"p": prefix + "%"}
        )
        found = [r[0] for r in rows]
    engine.dispose()
    return found


def start_worker(env: dict[str, str], name: str, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "celery", "-A", "tests.acceptance.stream_app", "worker",
               "-P", "ratchet", "-c", "4", "-n", f"{name}@%h", "-l", "warning"]  # fmt: skip
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def bench(
    dialect: str, count: int, workers: int, log_dir: Path, chunked: bool = False
) -> dict[str, object]:
    url = fresh_database(dialect)
    env = {**os.environ, "RATCHET_URL": url, "PYTHONPATH": str(ROOT)}
    started_workers = [start_worker(env, f"bench{i}", log_dir / f"{dialect}-{count}-w{i}.log")
                       for i in range(workers)]  # fmt: skip
    began = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.acceptance.stream_app", str(count),
             *(["--chunked"] if chunked else [])],
            cwd=ROOT, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
        if workers:
            while not run_keys(url, "done:"):
                time.sleep(1)
            report["seconds_to_success_callback"] = round(time.monotonic() - began, 1)
            items = Counter(run_keys(url, "item-"))
            report["items_run"] = len(items)
            report["items_run_more_than_once"] = sum(1 for n in items.values() if n > 1)
            report["success_callbacks"] = run_keys(url, "done:")
    finally:
        for worker in started_workers:
            os.killpg(worker.pid, signal.SIGTERM)
        for worker in started_workers:
            worker.wait(120)
    return {"dialect": dialect, "count": count, **report}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", default="20000,200000")
    parser.add_argument("--dialects", default="postgresql,mysql")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-process", action="store_true")
    parser.add_argument("--chunked", action="store_true", help="a child per 1,000 items")
    parser.add_argument("--logs", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    workers = 0 if args.no_process else args.workers
    for dialect in args.dialects.split(","):
        for count in (int(c) for c in args.counts.split(",")):
            report = bench(dialect, count, workers, args.logs, args.chunked)
            print(json.dumps({**report, "chunked": args.chunked}), flush=True)


if __name__ == "__main__":
    main()
