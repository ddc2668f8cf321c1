"""``task.delay_on_commit()`` under Django on PostgreSQL: the job is stored when Django's
transaction commits, and never when it rolls back (Celery's Django task behaviour, kept
for ratchet tasks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from sqlalchemy import select

from celery_ratchet.store.schema import scheduler_job
from tests.conftest import Servers, empty_store

ROOT = Path(__file__).resolve().parents[2]

SETTINGS = """
import os
from urllib.parse import urlsplit

_db = urlsplit(os.environ["SHOP_DB"])
SECRET_KEY = "test-only"
INSTALLED_APPS = []
USE_TZ = True
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.path.lstrip("/"),
        "USER": _db.username,
        "HOST": _db.hostname,
        "PORT": _db.port,
    }
}
CELERY_RATCHET_URL = os.environ["SHOP_DB"]
CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:1//"
"""

APP = """
from celery_ratchet import Celery

app = Celery("shop")
app.config_from_object("django.conf:settings", namespace="CELERY")


@app.task(name="shop.charge")
def charge(order_id, note=""):
    return order_id
"""

CLIENT = """
import json
import django

django.setup()
from django.db import connection, transaction

import shopapp
from celery_ratchet.celery.state import ratchet_state
store = ratchet_state(shopapp.app).store

def stored():
    with store.engine.connect() as conn:
        return conn.exec_driver_sql(
            "SELECT job_id FROM scheduler_job WHERE task_name = 'shop.charge'"
        ).all()

with transaction.atomic():
    shopapp.charge.delay_on_commit(1, note="committed")
    shopapp.charge.apply_async_on_commit((2,), countdown=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    inside = stored()

try:
    with transaction.atomic():
        shopapp.charge.delay_on_commit(3)
        raise RuntimeError("roll back")
except RuntimeError:
    pass

print(json.dumps({"inside": len(inside)}))
"""


@pytest.mark.parametrize("dialect", ["postgresql"])
def test_delay_on_commit_stores_the_job_only_when_djangos_transaction_commits(
    servers: Servers, dialect: str, tmp_path: Path
) -> None:
    pytest.importorskip("django")
    url = servers.url(dialect)
    store = empty_store(url)
    (tmp_path / "shopsettings.py").write_text(SETTINGS)
    (tmp_path / "shopapp.py").write_text(textwrap.dedent(APP))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "DJANGO_SETTINGS_MODULE": "shopsettings",
        "SHOP_DB": url,
    }
    assert urlsplit(url).scheme == "postgresql"
    done = subprocess.run(
        [sys.executable, "-c", CLIENT],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])

    assert seen["inside"] == 0  # before the commit, no job exists
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(scheduler_job.c.job_id).where(scheduler_job.c.task_name == "shop.charge")
        ).all()
    assert len(rows) == 2  # the two sent in the committed block; none from the rolled-back one
