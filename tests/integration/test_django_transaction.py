"""Jobs written in Django's transaction, through Django's own connection, so that they exist if
and only if it commits; PostgreSQL's wake-up is delivered at that commit. Explicitly with
``celery_ratchet.transaction(django.db.connection)`` inside ``transaction.atomic()``, or for
every send with ``CELERY_RATCHET_DJANGO_CONNECTION``. Another database than the store's, and
an explicit block outside atomic(), are refused naming what to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

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
elif _db.scheme == "mysql":
    import pymysql

    pymysql.install_as_MySQLdb()  # Django's MySQL backend on PyMySQL
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": _db.path.lstrip("/"),
            "USER": _db.username or "root",
            "HOST": _db.hostname,
            "PORT": _db.port,
        }
    }
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
CELERY_RATCHET_DJANGO_CONNECTION = os.environ.get("SHOP_JOIN") or None
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

PRELUDE = """
import json
import django

django.setup()
from celery import chord, group
from django.db import connection, connections, transaction

import celery_ratchet
import shopapp
from celery_ratchet.celery.state import ratchet_state
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

def notified(timeout):
    if listener is None:
        return None
    return len(list(listener.notifies(timeout=timeout, stop_after=1)))
"""

CLIENT = (
    PRELUDE
    + """
with transaction.atomic():
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO shop_order (id) VALUES (1)")
    with celery_ratchet.transaction(connection):
        shopapp.ship.delay(1)
        group(shopapp.ship.s(10), shopapp.ship.s(11)).apply_async()
    seen["inside"] = stored()
    seen["notified_inside"] = notified(0.2)
    with connection.cursor() as cursor:  # Django's transaction is still usable
        cursor.execute("SELECT count(*) FROM shop_order")
        seen["orders_inside"] = cursor.fetchone()[0]
seen["after_commit"] = stored()
seen["notified_after"] = notified(5)

with transaction.atomic():
    with celery_ratchet.transaction(connection):
        taken = shopapp.ship.delay(5).id
        try:
            shopapp.ship.apply_async((6,), task_id=taken)
        except celery_ratchet.DuplicateJob:
            seen["duplicate"] = True
    with connection.cursor() as cursor:  # still usable, and it commits the first send
        cursor.execute("INSERT INTO shop_order (id) VALUES (5)")
seen["after_duplicate"] = stored()

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
)


JOINING_CLIENT = (
    PRELUDE
    + """
with transaction.atomic():
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO shop_order (id) VALUES (1)")
    shopapp.ship.delay(1)
    group(shopapp.ship.s(10), shopapp.ship.s(11)).apply_async()
    seen["inside"] = stored()
    seen["notified_inside"] = notified(0.2)
seen["after_commit"] = stored()
seen["notified_after"] = notified(5)

def batches():
    with store.engine.connect() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM scheduler_batch").scalar()

batches_before = batches()
try:
    with transaction.atomic():
        shopapp.ship.delay(2)
        chord([shopapp.ship.s(20), shopapp.ship.s(21)])(shopapp.ship.si(22))
        seen["chord_batches_inside"] = batches() - batches_before
        raise RuntimeError("roll back")
except RuntimeError:
    pass
seen["after_rollback"] = stored()
seen["chord_batches_after_rollback"] = batches() - batches_before

shopapp.ship.delay(3)  # autocommit: stored at once
seen["autocommit"] = stored()

# Both spellings: with a namespace, older Celery reads the prefixed one first.
shopapp.app.conf.update(
    ratchet_django_connection="other", CELERY_RATCHET_DJANGO_CONNECTION="other"
)
ratchet_state(shopapp.app).reset()
store = ratchet_state(shopapp.app).store
try:
    shopapp.ship.delay(4)
except celery_ratchet.RatchetError as exc:
    seen["other_database"] = str(exc)

# Both spellings: with a namespace, older Celery reads the prefixed one first.
shopapp.app.conf.update(
    ratchet_django_connection="missing", CELERY_RATCHET_DJANGO_CONNECTION="missing"
)
ratchet_state(shopapp.app).reset()
store = ratchet_state(shopapp.app).store
try:
    shopapp.ship.delay(7)
except celery_ratchet.RatchetError as exc:
    seen["unknown_alias"] = str(exc)
seen["at_end"] = stored()
print(json.dumps(seen))
"""
)


def _run(tmp_path: Path, url: str, client: str, **env: str) -> dict[str, Any]:
    (tmp_path / "shopsettings.py").write_text(SETTINGS)
    (tmp_path / "shopapp.py").write_text(textwrap.dedent(APP))
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")},
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "DJANGO_SETTINGS_MODULE": "shopsettings",
        "SHOP_DB": url,
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-c", client],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


@pytest.mark.parametrize("dialect", ["postgresql", "mysql", "sqlite"])
def test_jobs_sent_in_djangos_transaction_exist_iff_it_commits(
    servers: Servers, dialect: str, tmp_path: Path
) -> None:
    pytest.importorskip("django")
    url = servers.url(dialect)
    _drop_orders(url)
    seen = _run(tmp_path, url, CLIENT)

    assert seen["inside"] == []  # written in Django's transaction: invisible before its commit
    assert seen["orders_inside"] == 1
    assert seen["after_commit"] == [1, 10, 11]
    assert seen["duplicate"] is True  # refused, and Django's transaction went on to commit
    assert seen["after_duplicate"] == [1, 5, 10, 11]
    assert seen["after_rollback"] == [1, 5, 10, 11]  # the rolled-back block left no job
    if dialect == "postgresql":
        assert seen["notified_inside"] == 0
        assert seen["notified_after"] == 1  # the wake-up arrives with the commit
    assert "outside transaction.atomic()" in seen["outside_atomic"]
    refusal = seen["other_database"]
    assert "Django's database 'other'" in refusal
    assert "CELERY_RATCHET_URL" in refusal
    assert "delay_on_commit()" in refusal
    assert seen["at_end"] == [1, 5, 10, 11]


@pytest.mark.parametrize("dialect", ["postgresql", "mysql", "sqlite"])
def test_with_the_setting_every_send_joins_djangos_open_transaction(
    servers: Servers, dialect: str, tmp_path: Path
) -> None:
    pytest.importorskip("django")
    url = servers.url(dialect)
    _drop_orders(url)
    seen = _run(tmp_path, url, JOINING_CLIENT, SHOP_JOIN="default")

    assert seen["inside"] == []
    assert seen["after_commit"] == [1, 10, 11]
    assert seen["after_rollback"] == [1, 10, 11]
    assert seen["chord_batches_inside"] == 0  # the chord's row too is in Django's transaction
    assert seen["chord_batches_after_rollback"] == 0
    if dialect == "postgresql":
        assert seen["notified_inside"] == 0
        assert seen["notified_after"] == 1
    assert seen["autocommit"] == [1, 3, 10, 11]
    refusal = seen["other_database"]
    assert "ratchet_django_connection = 'other'" in refusal
    assert "DATABASES['other'] is sqlite" in refusal
    assert "CELERY_RATCHET_URL" in refusal and "delay_on_commit()" in refusal
    assert "'missing'" in seen["unknown_alias"] and "DATABASES" in seen["unknown_alias"]
    assert seen["at_end"] == [1, 3, 10, 11]


def _drop_orders(url: str) -> None:
    store = empty_store(url)
    with store.engine.connect() as conn:
        conn.execute(text("DROP TABLE IF EXISTS shop_order"))


REDIS_CLIENT = (
    PRELUDE.replace("listener = None", "listener = None  # PostgreSQL only")
    + """
import redis

pubsub = redis.Redis.from_url(os.environ["RATCHET_EVENTS_URL"]).pubsub()
pubsub.subscribe("ratchet:jobs")
pubsub.get_message(timeout=5)  # the subscription's confirmation

def woken(timeout):
    message = pubsub.get_message(timeout=timeout, ignore_subscribe_messages=True)
    return None if message is None else message["data"].decode()

try:
    with transaction.atomic():
        shopapp.ship.delay(2)
        raise RuntimeError("roll back")
except RuntimeError:
    pass
seen["after_rollback"] = woken(0.5)
with transaction.atomic():
    shopapp.ship.delay(1)
    seen["inside"] = woken(0.5)
seen["after_commit"] = woken(5)
print(json.dumps(seen))
"""
)


def test_redis_wakes_workers_when_djangos_transaction_commits(
    servers: Servers, tmp_path: Path
) -> None:
    pytest.importorskip("django")
    from tests.integration.test_wakeups import REDIS, _redis_reachable

    _redis_reachable()
    url = servers.url("sqlite")
    _drop_orders(url)
    client = REDIS_CLIENT.replace("import json\n", "import json\nimport os\n", 1)
    seen = _run(tmp_path, url, client, SHOP_JOIN="default", RATCHET_EVENTS_URL=REDIS)

    assert seen["after_rollback"] is None  # a rolled-back job wakes nobody
    assert seen["inside"] is None
    assert seen["after_commit"] == "celery"
