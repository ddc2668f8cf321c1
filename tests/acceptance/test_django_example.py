"""examples/django_app as it is run: ``manage.py migrate``, ``manage.py runserver`` and
``celery -A shop worker -P ratchet``, on PostgreSQL, with no broker.

The order view writes an order and its job in one Django transaction: the worker ships the
order, the status view reads SUCCESS through ``AsyncResult``; an order refused inside the
transaction leaves neither its row nor its job."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.schema import metadata
from tests.acceptance.conftest import ROOT
from tests.conftest import Servers, empty_store
from tests.helpers import Tripwire, wait_until

pytestmark = pytest.mark.slow

EXAMPLE = ROOT / "examples" / "django_app"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _call(base: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def _answers(base: str) -> bool:
    try:
        return _call(base, "/tasks/none/")[0] == 200
    except OSError:
        return False


class Processes:
    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp, self.env = tmp, env
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *command: str) -> None:
        self.running[name] = subprocess.Popen(
            [sys.executable, *command],
            cwd=EXAMPLE,
            env=self.env,
            stdout=(self.tmp / f"{name}.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def logs(self) -> str:
        return "\n".join(
            f"--- {name}\n{(self.tmp / f'{name}.log').read_text()[-3000:]}" for name in self.running
        )

    def stop_all(self) -> dict[str, int]:
        for process in self.running.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        return {name: process.wait(60) for name, process in self.running.items()}


@pytest.fixture
def shop(servers: Servers, tmp_path: Path) -> Iterator[tuple[str, Processes, JobStore, Tripwire]]:
    pytest.importorskip("django")
    url = servers.url("postgresql")
    store = empty_store(url)
    with store.engine.begin() as conn:
        # Django's tables and the job store's from an earlier run on this database: migrate
        # makes them afresh (celery_ratchet.contrib.django makes the store's).
        conn.execute(text("DROP TABLE IF EXISTS orders_order"))
        conn.execute(text("DROP TABLE IF EXISTS django_migrations"))
        for table in reversed(metadata.sorted_tables):
            conn.execute(text(f"DROP TABLE IF EXISTS {table.name} CASCADE"))
    wire = Tripwire()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    env.update(
        SHOP_DATABASE_URL=url,
        PYTHONPATH=os.pathsep.join([str(EXAMPLE), str(ROOT)]),
        CELERY_BROKER_URL=f"amqp://guest:guest@127.0.0.1:{wire.port}//",
    )
    migrated = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert "Applying celery_ratchet.0001_job_store... OK" in migrated.stdout
    processes = Processes(tmp_path, env)
    port = _free_port()
    processes.start("worker", "-m", "celery", "-A", "shop", "worker", "-P", "ratchet", "-c", "2")
    processes.start("web", "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(base), 60, "the example's web server")
        yield base, processes, store, wire
    finally:
        codes = processes.stop_all()
        wire.close()
        assert codes["worker"] == 0, processes.logs()


def test_the_views_job_runs_a_refused_order_leaves_no_job_and_the_status_view_says_success(
    shop: tuple[str, Processes, JobStore, Tripwire],
) -> None:
    base, processes, store, wire = shop

    status, placed = _call(base, "/orders/", {"item": "book", "quantity": 2})
    assert status == 201, processes.logs()

    def succeeded() -> bool:
        return _call(base, f"/tasks/{placed['task_id']}/")[1]["state"] == "SUCCESS"

    wait_until(succeeded, 60, f"the job of order {placed['order_id']}\n{processes.logs()}")
    assert _call(base, f"/tasks/{placed['task_id']}/")[1]["result"] == "shipped 2 x book"
    assert _call(base, f"/orders/{placed['order_id']}/")[1]["shipped"] is True

    status, refused = _call(base, "/orders/", {"item": "piano", "quantity": 50})
    assert status == 409 and refused["task_id"]
    with store.engine.connect() as conn:
        jobs = conn.execute(
            text("SELECT count(*) FROM scheduler_job WHERE job_id = :id"),
            {"id": refused["task_id"]},
        ).scalar_one()
        orders = conn.execute(text("SELECT item FROM orders_order")).scalars().all()
    assert jobs == 0  # sent in the rolled-back transaction: never stored
    assert orders == ["book"]
    assert _call(base, f"/tasks/{refused['task_id']}/")[1]["state"] == "PENDING"
    assert wire.connections == 0  # no broker was ever contacted
