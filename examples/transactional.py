"""Transactional enqueue: the job exists if and only if the order commits. SQLite, no broker.

python examples/transactional.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from celery import Celery
from sqlalchemy import create_engine, text

import celery_ratchet

DB = "sqlite:///ratchet-transactional.db"
app = Celery("transactional", task_cls="celery_ratchet:RatchetTask")
app.conf.ratchet_url = DB
app.conf.ratchet_poll_interval = 0.2
engine = create_engine(DB)  # the application's own engine, on the same database


@app.task
def ship(order_id: int) -> str:
    with engine.connect() as conn:
        found = conn.execute(text("SELECT count(*) FROM orders WHERE id = :i"), {"i": order_id})
        return f"order {order_id} shipped" if found.scalar_one() else "order missing!"


def main() -> None:
    here = Path(__file__).resolve().parent
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS orders"))
        conn.execute(text("CREATE TABLE orders (id INTEGER PRIMARY KEY)"))
    # The job store's tables must exist before jobs join your transactions (DDL cannot run
    # inside one): a worker creates them at start, or `ratchet --url URL schema apply`.
    subprocess.run(
        [sys.executable, "-m", "celery_ratchet.cli.main", "--url", DB, "schema", "apply"],
        check=True,
    )

    with engine.begin() as conn:  # commits: the order and its job
        conn.execute(text("INSERT INTO orders (id) VALUES (1)"))
        with celery_ratchet.transaction(conn):
            committed = ship.delay(1)

    try:
        with engine.begin() as conn:  # rolls back: neither the order nor its job
            conn.execute(text("INSERT INTO orders (id) VALUES (2)"))
            with celery_ratchet.transaction(conn):
                rolled_back = ship.delay(2)
            raise ValueError("payment declined")
    except ValueError as exc:
        print(f"order 2 rolled back ({exc})")

    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT count(*) FROM scheduler_job WHERE job_id = :j"), {"j": rolled_back.id}
        ).scalar_one()
    print(f"job rows for order 2: {rows}")

    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "transactional", "--quiet", "worker",
         "-P", "ratchet", "-c", "2", "-l", "warning"],
        env={**os.environ, "PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )  # fmt: skip
    try:
        print("order 1:", committed.get(timeout=60))
    finally:
        worker.terminate()
        worker.wait(60)


if __name__ == "__main__":
    main()
