"""An app is a ratchet app from its configuration on, in a process that never binds a task.

Each case runs a fresh interpreter that imports an app module defining no task, then sends by
name, reads the result's state and pings the workers through the store, with ``broker_url``
pointing at a local socket that counts connections: nothing may reach it. The app is made
with ``celery_ratchet.Celery``, or with ``celery.Celery`` and only ``task_cls`` naming
``RatchetTask`` (or a subclass in a module nothing imported yet), importing no celery_ratchet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.schema import scheduler_control, scheduler_job
from tests.conftest import Servers, empty_store
from tests.helpers import Tripwire

ROOT = Path(__file__).resolve().parents[2]

CLIENT = """
import json, os, sys
import shopapp
if os.environ.get("DJANGO_SETTINGS_MODULE"):
    import django
    django.setup()
app = shopapp.app
result = app.send_task("shop.charge", args=(7,))
print(json.dumps({
    "id": result.id,
    "state": app.AsyncResult(result.id).state,
    "ping": app.control.inspect(timeout=1).ping(),
}))
"""

APPS = {
    "conf": """
        import os
        from celery_ratchet import Celery
        app = Celery("shop")
        app.conf.ratchet_url = os.environ["SHOP_DB"]
        app.conf.broker_url = os.environ["SHOP_BROKER"]
    """,
    "config_from_object": """
        from celery_ratchet import Celery
        app = Celery("shop")
        app.config_from_object("shopconfig")
    """,
    "django": """
        from celery_ratchet import Celery
        app = Celery("shop")
        app.config_from_object("django.conf:settings", namespace="CELERY")
    """,
}

#: The same apps with only the task class swapped: the switch is the same on every database,
#: so these run on SQLite only.
TASK_CLS_APPS = {
    "task_cls": """
        import os
        from celery import Celery
        app = Celery("shop", task_cls="celery_ratchet:RatchetTask")
        app.conf.ratchet_url = os.environ["SHOP_DB"]
        app.conf.broker_url = os.environ["SHOP_BROKER"]
    """,
    "task_cls django": """
        from celery import Celery
        app = Celery("shop", task_cls="celery_ratchet:RatchetTask")
        app.config_from_object("django.conf:settings", namespace="CELERY")
    """,
    "task_cls subclass": """
        from celery import Celery
        app = Celery("shop", task_cls="shopbase:ShopTask")
        app.config_from_object("shopconfig")
    """,
}

SHOPBASE = """
from celery_ratchet import RatchetTask
class ShopTask(RatchetTask):
    pass
"""

SHOPCONFIG = """
import os
ratchet_url = os.environ["SHOP_DB"]
broker_url = os.environ["SHOP_BROKER"]
"""

DJANGO_SETTINGS = """
import os
SECRET_KEY = "test-only"
INSTALLED_APPS = []
USE_TZ = True
CELERY_RATCHET_URL = os.environ["SHOP_DB"]
CELERY_BROKER_URL = os.environ["SHOP_BROKER"]
"""


@pytest.fixture
def tripwire() -> Iterator[Tripwire]:
    wire = Tripwire()
    yield wire
    wire.close()


def run_client(tmp_path: Path, variant: str, db_url: str, broker_port: int) -> dict[str, object]:
    (tmp_path / "shopapp.py").write_text(textwrap.dedent({**APPS, **TASK_CLS_APPS}[variant]))
    (tmp_path / "shopconfig.py").write_text(SHOPCONFIG)
    (tmp_path / "shopsettings.py").write_text(DJANGO_SETTINGS)
    (tmp_path / "shopbase.py").write_text(SHOPBASE)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "SHOP_DB": db_url,
        "SHOP_BROKER": f"amqp://guest:guest@127.0.0.1:{broker_port}//",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    if variant.endswith("django"):
        env["DJANGO_SETTINGS_MODULE"] = "shopsettings"
    done = subprocess.run(
        [sys.executable, "-c", CLIENT],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("variant", sorted(APPS))
def test_fresh_process_sends_reads_and_pings_through_the_store(
    tmp_path: Path, variant: str, db_url: str, store: JobStore, tripwire: Tripwire
) -> None:
    assert_sends_reads_and_pings_through_the_store(tmp_path, variant, db_url, store, tripwire)


@pytest.mark.parametrize("variant", sorted(TASK_CLS_APPS))
def test_fresh_process_with_only_the_task_class_swapped_uses_the_store_too(
    tmp_path: Path, variant: str, servers: Servers, tripwire: Tripwire
) -> None:
    url = servers.url("sqlite")
    assert_sends_reads_and_pings_through_the_store(
        tmp_path, variant, url, empty_store(url), tripwire
    )


def assert_sends_reads_and_pings_through_the_store(
    tmp_path: Path, variant: str, db_url: str, store: JobStore, tripwire: Tripwire
) -> None:
    seen = run_client(tmp_path, variant, db_url, tripwire.port)
    with store.engine.connect() as conn:
        row = conn.execute(
            select(scheduler_job.c.task_name, scheduler_job.c.status).where(
                scheduler_job.c.job_id == seen["id"]
            )
        ).one()
    assert row.task_name == "shop.charge"
    assert seen["state"] == "PENDING"
    # No worker runs here to answer; the ping went out as a broadcast row in the store (a
    # real worker's answer: tests/acceptance/test_app_class_workers.py).
    assert seen["ping"] is None
    with store.engine.connect() as conn:
        commands = conn.execute(select(scheduler_control.c.command)).scalars().all()
    assert commands == ["ping"]
    assert tripwire.connections == 0
