"""``celery_ratchet.transaction(django.db.connection)``: inside ``transaction.atomic()`` the
jobs are written through Django's own connection, so they exist if and only if Django's
transaction commits; PostgreSQL's wake-up is delivered at that commit. Another database than
the store's, and a block outside atomic(), are refused naming what to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import Servers, empty_store

ROOT = Path(__file__).resolve().parents[2]

SETTINGS = """
import os
from urllib.parse import urlsplit

SECRET_KEY = "test-only"
INSTALLED_APPS = []
USE_TZ = True
_db = urlsplit(os.environ["SHOP_DB"])
if _db.scheme == "sqlite":
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": _db.path[1:]}}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _db.path.lstrip("/"),
            "USER": _db.username,
            "HOST": _db.hostname,
            "PORT": _db.port,
        }
    }
DATABASES["other"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": "other.sqlite3"}
CELERY_RATCHET_URL = os.environ["SHOP_DB"]
CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:1//"
"""

APP = """
from celery_ratchet import Celery

app = Celery("shop")
app.config_from_object("django.conf:settings", namespace="CELERY")


@app.task(name="shop.ship")
def ship(order_id):
    return order_id
"""

CLIENT = """
import json
import django

django.setup()
from celery import group
from django.db import connection, connections, transaction

import celery_ratchet
import shopapp
from celery_ratchet.celery.app import ratchet_state

store = ratchet_state(shopapp.app).store
seen = {}

def stored():
    with store.engine.connect() as conn:
        return sorted(
            json.loads(r[0])[0][0] for r in conn.exec_driver_sql(
                "SELECT payload FROM scheduler_job WHERE task_name = 'shop.ship'"
            ).all()
        )

with connection.cursor() as cursor:
    cursor.execute("CREATE TABLE shop_order (id integer PRIMARY KEY)")

listener = None
if connection.vendor == "postgresql":
    import psycopg
    listener = psycopg.connect(store.url, autocommit=True)
    listener.execute("LISTEN ratchet_jobs")

with transaction.atomic():
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO shop_order (id) VALUES (1)")
    with celery_ratchet.transaction(connection):
        shopapp.ship.delay(1)
        group(shopapp.ship.s(10), shopapp.ship.s(11)).apply_async()
    seen["inside"] = stored()
    if listener is not None:
        seen["notified_inside"] = len(list(listener.notifies(timeout=0.2, stop_after=1)))
    with connection.cursor() as cursor:  # Django's transaction is still usable
        cursor.execute("SELECT count(*) FROM shop_order")
        seen["orders_inside"] = cursor.fetchone()[0]
seen["after_commit"] = stored()
if listener is not None:
    seen["notified_after"] = len(list(listener.notifies(timeout=5, stop_after=1)))

try:
    with transaction.atomic():
        with celery_ratchet.transaction(connection):
            shopapp.ship.delay(2)
        raise RuntimeError("roll back")
except RuntimeError:
    pass
seen["after_rollback"] = stored()

try:
    with celery_ratchet.transaction(connection):
        shopapp.ship.delay(3)
except celery_ratchet.RatchetError as exc:
    seen["outside_atomic"] = str(exc)

try:
    with transaction.atomic(using="other"):
        with celery_ratchet.transaction(connections["other"]):
            shopapp.ship.delay(4)
except celery_ratchet.RatchetError as exc:
    seen["other_database"] = str(exc)
seen["at_end"] = stored()
print(json.dumps(seen))
"""


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_jobs_sent_in_djangos_transaction_exist_iff_it_commits(
    servers: Servers, dialect: str, tmp_path: Path
) -> None:
    pytest.importorskip("django")
    url = servers.url(dialect)
    empty_store(url)
    (tmp_path / "shopsettings.py").write_text(SETTINGS)
    (tmp_path / "shopapp.py").write_text(textwrap.dedent(APP))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "DJANGO_SETTINGS_MODULE": "shopsettings",
        "SHOP_DB": url,
    }
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

    assert seen["inside"] == []  # written in Django's transaction: invisible before its commit
    assert seen["orders_inside"] == 1
    assert seen["after_commit"] == [1, 10, 11]
    assert seen["after_rollback"] == [1, 10, 11]  # the rolled-back block left no job
    if dialect == "postgresql":
        assert seen["notified_inside"] == 0
        assert seen["notified_after"] == 1  # the wake-up arrives with the commit
    assert "outside transaction.atomic()" in seen["outside_atomic"]
    refusal = seen["other_database"]
    assert "Django's database 'other'" in refusal
    assert "CELERY_RATCHET_URL" in refusal
    assert "delay_on_commit()" in refusal
    assert seen["at_end"] == [1, 10, 11]
