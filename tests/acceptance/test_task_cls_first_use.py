"""Apps made with ``celery.Celery("shop", task_cls="celery_ratchet:RatchetTask")`` and nothing
else of celery_ratchet: each client is a fresh process whose first call is a send by name, a
result read, a worker ping or Celery's testing worker, with ``broker_url`` on a socket that
counts connections (none may arrive), and again on a closed port (the issue's own check).
Every answer can only have come through the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from celery_ratchet import Celery as RatchetCelery
from tests.acceptance.conftest import Worker
from tests.conftest import Servers, empty_store
from tests.helpers import Tripwire

ROOT = Path(__file__).resolve().parents[2]

WORKER_APP = """
from celery import Celery

app = Celery("shop", task_cls="celery_ratchet:RatchetTask")
app.conf.ratchet_poll_interval = 0.2


@app.task(name="shop.double")
def double(n):
    return n * 2
"""

# The client's app module imports nothing of celery_ratchet: its task class is a string.
CLIENT_APP = """
import os
from celery import Celery

app = Celery("shop", task_cls=os.environ.get("SHOP_TASK_CLS", "celery_ratchet:RatchetTask"))
app.conf.broker_url = os.environ["SHOP_BROKER"]
"""

# A task class of the user's own, named by a string: its module is imported only when
# Celery (or ratchet) first needs to know the class.
CLIENT_BASE = """
from celery_ratchet import RatchetTask


class ShopTask(RatchetTask):
    pass
"""

FIRST_CALLS = {
    "send_task": """
        result = app.send_task("shop.double", args=(21,))
        answer = {"value": result.get(timeout=60), "id": result.id}
    """,
    "AsyncResult.get": """
        answer = {"value": app.AsyncResult(os.environ["SHOP_TASK_ID"]).get(timeout=60)}
    """,
    "inspect.ping": """
        # A reply window a loaded machine can miss: asked again until the worker answers.
        ping, deadline = None, time.monotonic() + 60
        while not ping and time.monotonic() < deadline:
            ping = app.control.inspect(timeout=5).ping()
        answer = {"ping": sorted(name.partition("@")[0] for name in ping or {})}
    """,
    "testing worker": """
        # The module's worker consumes only the default queue: this job can only be run by
        # the testing worker, in this process.
        import celery.contrib.testing.tasks  # noqa: F401  (the ping task start_worker checks)
        from celery.contrib.testing.worker import start_worker

        @app.task(name="shop.triple")
        def triple(n):
            return n * 3

        with start_worker(app, pool="solo", queues=["testing"], perform_ping_check=False):
            result = app.send_task("shop.triple", args=(14,), queue="testing")
            answer = {"value": result.get(timeout=60)}
    """,
}

CLIENT = """
import json, os, sys, time
from shopclient import app

{first_call}
answer["ratchet_installed"] = bool(app.__dict__.get("_ratchet_installed"))
print(json.dumps(answer))
"""


@dataclass
class Shop:
    url: str
    tmp: Path
    wire: Tripwire
    worker: Worker

    def client(self, first_call: str, **env: str) -> dict[str, object]:
        code = CLIENT.format(first_call=textwrap.dedent(FIRST_CALLS[first_call]))
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=self.tmp,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(self.tmp), str(ROOT)]),
                "RATCHET_URL": self.url,
                "SHOP_BROKER": self.wire.url,
                **env,
            },
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr[-3000:] + self.worker.log.read_text()[-3000:]
        answer: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
        return answer


@pytest.fixture(scope="module")
def shop(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    url = servers.url("postgresql")
    empty_store(url)
    tmp = tmp_path_factory.mktemp("shop")
    (tmp / "shopworker.py").write_text(textwrap.dedent(WORKER_APP))
    (tmp / "shopclient.py").write_text(textwrap.dedent(CLIENT_APP))
    (tmp / "shopbase.py").write_text(textwrap.dedent(CLIENT_BASE))
    wire = Tripwire()
    worker = Worker(
        url,
        "taskcls",
        tmp / "worker.log",
        concurrency=1,
        app_module="shopworker",
        PYTHONPATH=os.pathsep.join([str(tmp), str(ROOT)]),
        CELERY_BROKER_URL=wire.url,
    )
    try:
        yield Shop(url, tmp, wire, worker)
    finally:
        assert worker.stop() == 0, worker.log.read_text()[-3000:]
        wire.close()


@pytest.mark.slow
@pytest.mark.parametrize("task_cls", ["celery_ratchet:RatchetTask", "shopbase:ShopTask"])
def test_send_by_name_first_writes_the_job_to_the_store(shop: Shop, task_cls: str) -> None:
    answer = shop.client("send_task", SHOP_TASK_CLS=task_cls)
    assert (answer["value"], answer["ratchet_installed"]) == (42, True)
    assert shop.wire.connections == 0


@pytest.mark.slow
def test_reading_a_result_first_reads_it_from_the_store(shop: Shop) -> None:
    sender = RatchetCelery("shop", set_as_current=False)
    sender.conf.ratchet_url = shop.url
    try:
        task_id = sender.send_task("shop.double", args=(21,)).id
    finally:
        sender.close()
    # A new process's first call reads that job's result (waiting for it if need be).
    answer = shop.client("AsyncResult.get", SHOP_TASK_ID=task_id)
    assert answer == {"value": 42, "ratchet_installed": True}
    assert shop.wire.connections == 0


@pytest.mark.slow
def test_pinging_workers_first_reaches_them_through_the_store(shop: Shop) -> None:
    answer = shop.client("inspect.ping")
    assert answer == {"ping": ["taskcls"], "ratchet_installed": True}
    assert shop.wire.connections == 0


@pytest.mark.slow
def test_celerys_testing_worker_first_runs_from_the_store(shop: Shop) -> None:
    answer = shop.client("testing worker")
    assert answer == {"value": 42, "ratchet_installed": True}
    assert shop.wire.connections == 0


#: A broker URL no server answers (port 1 is never listened on here): a process that fell back
#: to it would fail with Connection refused, as the issue's first reports did.
CLOSED_BROKER = "amqp://guest:guest@127.0.0.1:1//"


@pytest.mark.slow
@pytest.mark.parametrize("first_call", ["send_task", "AsyncResult.get", "inspect.ping"])
def test_each_first_call_works_with_the_broker_url_on_a_closed_port(
    shop: Shop, first_call: str
) -> None:
    env = {"SHOP_BROKER": CLOSED_BROKER}
    if first_call == "AsyncResult.get":
        sender = RatchetCelery("shop", set_as_current=False)
        sender.conf.ratchet_url = shop.url
        try:
            env["SHOP_TASK_ID"] = sender.send_task("shop.double", args=(21,)).id
        finally:
            sender.close()
    answer = shop.client(first_call, **env)
    assert answer["ratchet_installed"] is True
    if first_call == "inspect.ping":
        assert answer["ping"] == ["taskcls"]
    else:
        assert answer["value"] == 42
