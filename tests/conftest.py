"""Databases for the tests: SQLite always; PostgreSQL and MariaDB when reachable.

Each test run creates its own databases on the servers (``ratchet_t<pid>``) and drops them at
the end, so two runs never share rows. An unreachable server skips its tests, except under
``CI=true``, where it fails them: CI must never pass by skipping.
"""

from __future__ import annotations

import gc
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from sqlalchemy import create_engine, text

from celery_ratchet.store.engine import engine_for
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.schema import metadata

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
PG_HOST = os.environ.get("RATCHET_TEST_PG", "postgres@127.0.0.1:5432")
MYSQL_HOST = os.environ.get("RATCHET_TEST_MYSQL", "root@127.0.0.1:3306")
DB_NAME = f"ratchet_t{os.getpid()}"
ALL_DIALECTS = ("sqlite", "postgresql", "mysql")
#: RATCHET_TEST_DIALECTS=sqlite,postgresql runs only those databases' tests (a CI matrix leg);
#: the others' are skipped, in CI too, because they were left out on purpose.
DIALECTS = tuple(
    d.strip()
    for d in os.environ.get("RATCHET_TEST_DIALECTS", ",".join(ALL_DIALECTS)).split(",")
    if d.strip()
)
if not DIALECTS or not set(DIALECTS) <= set(ALL_DIALECTS):
    raise pytest.UsageError(
        f"RATCHET_TEST_DIALECTS={os.environ.get('RATCHET_TEST_DIALECTS')!r}: "
        f"name some of {', '.join(ALL_DIALECTS)}, separated by commas"
    )


# Property tests check what holds, never how fast: on a machine shared with other runs, the
# per-example deadline and the too-slow check of input generation failed them at random.
settings.register_profile("ratchet", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ratchet")

ACCEPTANCE = Path(__file__).parent / "acceptance"
#: Fixtures that start a server of the test's own.
PRIVATE_SERVERS = {
    "private_postgres",
    "private_mariadb",
    "pair",
    "bouncer",
    "galera",
    "private_redis",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``./dev test`` leaves out what is marked slow or infra, so a mark forgotten would put a
    slow test into the fast tier: real worker processes (tests/acceptance) must be marked
    slow, and a test on a private server both slow and infra."""
    unmarked = []
    for item in items:
        marks = {mark.name for mark in item.iter_markers()}
        fixtures = set(getattr(item, "fixturenames", ()))
        if item.path.is_relative_to(ACCEPTANCE) and "slow" not in marks:
            unmarked.append(f"{item.nodeid}: mark it slow (it runs worker processes)")
        if fixtures & PRIVATE_SERVERS and not {"slow", "infra"} <= marks:
            unmarked.append(f"{item.nodeid}: mark it slow and infra (it starts a private server)")
    if unmarked:
        raise pytest.UsageError("tests without their tier's mark:\n  " + "\n  ".join(unmarked))


def pytest_collection_finish() -> None:
    """What is loaded by now (Celery, SQLAlchemy, Django, every test module) lives as long as
    the process: Python's full collections, which the tests' garbage keeps starting, need not
    walk it each time."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure() -> None:
    """As the process ends, Python's last garbage collection walks every object the run left
    behind: 3 to 8 s for each of the fast tier's processes, all at the same time, with
    nothing to gain. Frozen objects are left out of it."""
    gc.freeze()


def _reachable(hostport: str) -> bool:
    host, _, port = hostport.rpartition("@")[2].partition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


class Servers:
    """Creates the run's databases on first use; drops them when the run ends."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.created: dict[str, str] = {}

    def url(self, dialect: str) -> str:
        if dialect not in DIALECTS:
            pytest.skip(f"{dialect} is not in RATCHET_TEST_DIALECTS")
        if dialect == "sqlite":
            return f"sqlite:///{self.tmp / 'ratchet.db'}"
        if dialect not in self.created:
            self.created[dialect] = self._create(dialect)
        return self.created[dialect]

    def _create(self, dialect: str) -> str:
        hostport = PG_HOST if dialect == "postgresql" else MYSQL_HOST
        if not _reachable(hostport):
            message = f"{dialect} is not reachable at {hostport}"
            if IN_CI:
                pytest.fail(f"{message}: CI requires it (start it with ../shared/services.sh)")
            pytest.skip(message)
        if dialect == "postgresql":
            admin = create_engine(
                f"postgresql+psycopg://{hostport}/postgres", isolation_level="AUTOCOMMIT"
            )
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{DB_NAME}"'))
                conn.execute(text(f'CREATE DATABASE "{DB_NAME}"'))
            admin.dispose()
            return f"postgresql://{hostport}/{DB_NAME}"
        admin = create_engine(f"mysql+pymysql://{hostport}/", isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{DB_NAME}`"))
            conn.execute(text(f"CREATE DATABASE `{DB_NAME}` CHARACTER SET utf8mb4"))
        admin.dispose()
        return f"mysql://{hostport}/{DB_NAME}"

    def drop_all(self) -> None:
        for dialect in self.created:
            engine_for(self.created[dialect]).dispose()
            if dialect == "postgresql":
                admin = create_engine(
                    f"postgresql+psycopg://{PG_HOST}/postgres", isolation_level="AUTOCOMMIT"
                )
                sql = f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)'
            else:
                admin = create_engine(
                    f"mysql+pymysql://{MYSQL_HOST}/", isolation_level="AUTOCOMMIT"
                )
                sql = f"DROP DATABASE IF EXISTS `{DB_NAME}`"
            with admin.connect() as conn:
                conn.execute(text(sql))
            admin.dispose()


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    found = Servers(tmp_path_factory.mktemp("db"))
    yield found
    found.drop_all()


def empty_store(url: str) -> JobStore:
    """A store on ``url`` with its schema present and every table empty."""
    store = JobStore(url)
    store.ensure_schema()
    with store.engine.connect() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    return store


@pytest.fixture(params=DIALECTS)
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(servers: Servers, dialect: str) -> str:
    return servers.url(dialect)


@pytest.fixture
def store(db_url: str) -> JobStore:
    return empty_store(db_url)


@pytest.fixture(params=[d for d in DIALECTS if d != "sqlite"])
def server_dialect(request: pytest.FixtureRequest) -> str:
    """PostgreSQL and MariaDB only: for tests of concurrency across processes and hosts."""
    return str(request.param)


@pytest.fixture
def server_store(servers: Servers, server_dialect: str) -> JobStore:
    return empty_store(servers.url(server_dialect))
