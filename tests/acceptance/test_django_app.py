"""celery_ratchet.contrib.django in a Django project of its own, on PostgreSQL, MariaDB and
SQLite: with no CELERY_RATCHET_URL the job store is DATABASES["default"], ``manage.py migrate``
makes its tables there, a send inside ``atomic()`` is written in that transaction (a rollback
leaves no job), one outside it is stored at once, and ``manage.py check`` names what is
misconfigured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from tests.conftest import MYSQL_HOST, PG_HOST, Servers
from tests.integration.test_django_transaction import APP

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # manage.py and Django in processes of their own

SETTINGS = """
import os
from urllib.parse import urlsplit

SECRET_KEY = "test-only"
USE_TZ = True
INSTALLED_APPS = ["celery_ratchet.contrib.django"]
_db = urlsplit(os.environ["PROJECT_DB"])
if _db.scheme == "sqlite":
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": _db.path[1:]}}
else:
    if _db.scheme == "mysql":
        import pymysql

        pymysql.install_as_MySQLdb()  # Django's MySQL backend on PyMySQL
    DATABASES = {
        "default": {
            "ENGINE": f"django.db.backends.{_db.scheme}",
            "NAME": _db.path.lstrip("/"),
            "USER": _db.username or "",
            "HOST": _db.hostname,
            "PORT": _db.port,
        }
    }
DATABASES["elsewhere"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": "elsewhere.sqlite3"}
CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:1//"
if os.environ.get("PROJECT_STORE_ALIAS"):
    CELERY_RATCHET_DATABASE = os.environ["PROJECT_STORE_ALIAS"]
if os.environ.get("PROJECT_STORE_URL"):
    CELERY_RATCHET_URL = os.environ["PROJECT_STORE_URL"]
if os.environ.get("PROJECT_JOIN"):
    CELERY_RATCHET_DJANGO_CONNECTION = os.environ["PROJECT_JOIN"]
"""

MANAGE = """
import os, sys
from django.core.management import execute_from_command_line

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
execute_from_command_line(sys.argv)
"""

SENDS = """
import json, os
import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
django.setup()
from django.db import connection, transaction
from project.celery import app, ship

with connection.cursor() as cursor:
    cursor.execute("CREATE TABLE IF NOT EXISTS project_order (item VARCHAR(20))")


class Refused(Exception):
    pass


try:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO project_order (item) VALUES ('piano')")
        rolled_back = ship.delay("piano").id
        raise Refused
except Refused:
    pass
with transaction.atomic():
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO project_order (item) VALUES ('book')")
    committed = ship.delay("book").id
outside = ship.delay("pen").id


def stored(task_id):
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM scheduler_job WHERE job_id = %s", [task_id])
        return cursor.fetchone()[0]


with connection.cursor() as cursor:
    cursor.execute("SELECT item FROM project_order")
    orders = sorted(row[0] for row in cursor.fetchall())
settings = __import__("celery_ratchet.celery.state", fromlist=["x"]).ratchet_state(app).settings
print(json.dumps({
    "rolled_back": stored(rolled_back), "committed": stored(committed),
    "outside": stored(outside), "orders": orders, "joins": settings.django_connection,
}))
"""


class Project:
    def __init__(self, tmp: Path, db_url: str) -> None:
        self.dir = tmp / "site"
        (self.dir / "project").mkdir(parents=True)
        (self.dir / "project" / "__init__.py").write_text("")
        (self.dir / "project" / "settings.py").write_text(SETTINGS)
        (self.dir / "project" / "celery.py").write_text(APP)  # the standard celery.py
        (self.dir / "manage.py").write_text(MANAGE)
        (self.dir / "sends.py").write_text(SENDS)
        self.db_url = db_url

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
        environment.pop("DJANGO_SETTINGS_MODULE", None)
        environment.update(
            PROJECT_DB=self.db_url, PYTHONPATH=os.pathsep.join([str(self.dir), str(ROOT)]), **env
        )
        return subprocess.run(
            [sys.executable, *args], cwd=self.dir, env=environment, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip

    def tables(self) -> set[str]:
        engine = create_engine(_driver_url(self.db_url))
        try:
            return set(inspect(engine).get_table_names())
        finally:
            engine.dispose()


def _driver_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://").replace(
        "mysql://", "mysql+pymysql://"
    )


@pytest.fixture
def project(servers: Servers, dialect: str, tmp_path: Path) -> Iterator[Project]:
    """A Django project on a database of its own (made here, dropped after): nothing of the
    job store is in it before ``migrate``."""
    pytest.importorskip("django")
    servers.url(dialect)  # skips what is unreachable or left out
    name = f"ratchet_django_{os.getpid()}"
    if dialect == "sqlite":
        yield Project(tmp_path, f"sqlite:///{tmp_path / 'site.sqlite3'}")
        return
    host = PG_HOST if dialect == "postgresql" else MYSQL_HOST
    server = f"{dialect}://{host}"
    admin_url = _driver_url(f"{server}/postgres" if dialect == "postgresql" else f"{server}/")
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    quote = '"' if dialect == "postgresql" else "`"
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {quote}{name}{quote}"))
        conn.execute(text(f"CREATE DATABASE {quote}{name}{quote}"))
    try:
        yield Project(tmp_path, f"{server}/{name}")
    finally:
        force = " WITH (FORCE)" if dialect == "postgresql" else ""
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {quote}{name}{quote}{force}"))
        admin.dispose()


def test_migrate_makes_the_store_in_djangos_database_and_sends_join_its_transactions(
    project: Project,
) -> None:
    assert "scheduler_job" not in project.tables()
    migrated = project.run("manage.py", "migrate", "--noinput")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert "Applying celery_ratchet.0001_job_store... OK" in migrated.stdout
    assert {"scheduler_job", "scheduler_node", "scheduler_batch"} <= project.tables()

    sent = project.run("sends.py")
    assert sent.returncode == 0, sent.stderr
    found = json.loads(sent.stdout.splitlines()[-1])
    assert found == {
        "rolled_back": 0,  # written in the transaction that rolled back: no job
        "committed": 1,
        "outside": 1,  # autocommit: stored at once
        "orders": ["book"],
        "joins": "default",
    }
    checked = project.run("manage.py", "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "celery_ratchet" not in checked.stdout + checked.stderr


def test_migrate_brings_the_store_up_to_date_and_leaves_other_databases_alone(
    project: Project,
) -> None:
    assert project.run("manage.py", "migrate", "--noinput").returncode == 0
    engine = create_engine(_driver_url(project.db_url))
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE scheduler_dlq_alert"))
    engine.dispose()
    # Migrated again from the start (a schema made by an older version, say): made whole.
    back = project.run("manage.py", "migrate", "celery_ratchet", "zero", "--noinput")
    assert back.returncode == 0, back.stderr
    again = project.run("manage.py", "migrate", "--noinput")
    assert again.returncode == 0, again.stderr
    assert "scheduler_dlq_alert" in project.tables()
    other = project.run("manage.py", "migrate", "--database", "elsewhere", "--noinput")
    assert other.returncode == 0, other.stderr
    elsewhere = create_engine(f"sqlite:///{project.dir / 'elsewhere.sqlite3'}")
    assert "scheduler_job" not in inspect(elsewhere).get_table_names()
    elsewhere.dispose()


def test_manage_py_check_says_what_is_misconfigured(project: Project) -> None:
    other = project.run(
        "manage.py", "check", PROJECT_STORE_URL=f"sqlite:///{project.dir / 'other.db'}"
    )
    assert other.returncode == 0, other.stderr
    assert "celery_ratchet.W001" in other.stderr and "is not DATABASES['default']" in other.stderr
    missing = project.run("manage.py", "check", PROJECT_STORE_ALIAS="jobs")
    assert missing.returncode == 1
    assert "celery_ratchet.E001" in missing.stderr and "no such alias" in missing.stderr
    joined = project.run("manage.py", "check", PROJECT_JOIN="elsewhere")
    assert "celery_ratchet.W002" in joined.stderr, joined.stderr
