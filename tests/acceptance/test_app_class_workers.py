"""A real worker on a ``celery_ratchet.Celery`` app, fed by a client process that binds no
task: it sends by name, waits for the result and pings the worker, all through the store,
with ``broker_url`` on a socket that counts connections (none may arrive)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.acceptance.conftest import Worker
from tests.conftest import Servers, empty_store
from tests.helpers import Tripwire

ROOT = Path(__file__).resolve().parents[2]

WORKER_APP = """
from celery_ratchet import Celery

app = Celery("shop")
app.conf.ratchet_poll_interval = 0.2


@app.task(name="shop.double")
def double(n):
    return n * 2
"""

CLIENT_APP = """
import os
from celery_ratchet import Celery

app = Celery("shop")
app.config_from_object({"broker_url": os.environ["SHOP_BROKER"]})
"""

CLIENT = """
import json, time
from shopclient import app

result = app.send_task("shop.double", args=(21,))
value = result.get(timeout=60)
# A reply window a loaded machine can miss: asked again until the worker answers.
ping, deadline = None, time.monotonic() + 60
while not ping and time.monotonic() < deadline:
    ping = app.control.inspect(timeout=5).ping()
print(json.dumps({"value": value, "state": app.AsyncResult(result.id).state, "ping": ping}))
"""


@pytest.mark.slow
def test_client_that_binds_no_task_reaches_a_real_worker_through_the_store(
    servers: Servers, dialect: str, tmp_path: Path
) -> None:
    url = servers.url(dialect)
    empty_store(url)
    (tmp_path / "shopworker.py").write_text(textwrap.dedent(WORKER_APP))
    (tmp_path / "shopclient.py").write_text(textwrap.dedent(CLIENT_APP))
    path = os.pathsep.join([str(tmp_path), str(ROOT)])
    wire = Tripwire()
    worker = Worker(
        url,
        "byname",
        tmp_path / "worker.log",
        concurrency=1,
        app_module="shopworker",
        PYTHONPATH=path,
        CELERY_BROKER_URL=f"amqp://guest:guest@127.0.0.1:{wire.port}//",
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", CLIENT],
            cwd=tmp_path,
            env={
                **os.environ,
                "PYTHONPATH": path,
                "RATCHET_URL": url,
                "SHOP_BROKER": f"amqp://guest:guest@127.0.0.1:{wire.port}//",
            },
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:] + worker.log.read_text()[-3000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert seen["value"] == 42
        assert seen["state"] == "SUCCESS"
        assert [name.partition("@")[0] for name in seen["ping"]] == ["byname"]
        assert wire.connections == 0
    finally:
        assert worker.stop() == 0, worker.log.read_text()[-3000:]
        wire.close()
