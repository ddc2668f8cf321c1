"""PostgreSQL URLs naming several hosts (the standby of a failover pair): every form libpq
knows reaches the job store, and the LISTEN connection reaches it too, trying the hosts in
order. The first host here is a port nothing listens on, as a primary that died."""

from __future__ import annotations

import pytest

from celery_ratchet.errors import ConfigurationError
from celery_ratchet.store.engine import EngineOptions, build_engine, libpq_conninfo
from celery_ratchet.store.jobstore import JobStore
from tests.conftest import PG_HOST, Servers
from tests.helpers import listening, new_job
from tests.private_postgres import free_port

FORMS = {
    "repeated host parameters": "postgresql://{user}@/{db}?host={dead}&host={live}",
    "one host parameter, comma-separated": "postgresql://{user}@/{db}?host={dead},{live}",
    "libpq's host list": "postgresql://{user}@{dead},{live}/{db}",
}


@pytest.fixture(params=sorted(FORMS))
def multi_host_url(request: pytest.FixtureRequest, servers: Servers) -> str:
    database = servers.url("postgresql").rpartition("/")[2]
    user, _, live = PG_HOST.rpartition("@")
    dead = f"127.0.0.1:{free_port()}"
    return FORMS[request.param].format(user=user, db=database, dead=dead, live=live)


def test_the_store_reaches_the_live_host_of_a_list(multi_host_url: str) -> None:
    store = JobStore(multi_host_url, engine=build_engine(multi_host_url), notify=True)
    try:
        store.enqueue(new_job())
        assert store.count_by_status().get("PENDING", 0) >= 1
    finally:
        store.engine.dispose()


def test_the_listen_connection_reaches_the_live_host_of_a_list(multi_host_url: str) -> None:
    store = JobStore(multi_host_url, engine=build_engine(multi_host_url), notify=True)
    try:
        with listening(store, multi_host_url) as (woken, heard):
            store.enqueue(new_job(queue="listed-hosts"))
            assert heard.wait(30), "no wake-up over a multi-host URL"
            assert "listed-hosts" in woken
    finally:
        store.engine.dispose()


def test_libpq_conninfo_keeps_the_host_list_and_drops_psycopg_arguments() -> None:
    url = "postgresql://u:p%40ss@/db?host=a:5432&host=b:5433&target_session_attrs=read-write"
    conninfo = libpq_conninfo(f"{url}&prepare_threshold=none", EngineOptions(pgbouncer=True))
    assert "host=a,b" in conninfo and "port=5432,5433" in conninfo
    assert "target_session_attrs=read-write" in conninfo
    assert "password=p@ss" in conninfo
    assert "prepare_threshold" not in conninfo and "%3A" not in conninfo


def test_a_prepare_threshold_that_is_not_a_number_is_a_clear_error() -> None:
    with pytest.raises(ConfigurationError, match="prepare_threshold"):
        build_engine("postgresql://u@h/db?prepare_threshold=often")


def test_a_connect_timeout_in_the_url_is_kept() -> None:
    url = "postgresql://u@/db?host=a:5432&host=b:5433&connect_timeout=2"
    assert "connect_timeout=2" in libpq_conninfo(url)
    assert "connect_timeout=10" in libpq_conninfo("postgresql://u@/db?host=a:5432&host=b:5433")


def test_a_direct_connection_keeps_server_side_prepares(servers: Servers) -> None:
    # The pooler check (store/engine.py) must find PostgreSQL itself here.
    engine = build_engine(servers.url("postgresql"))
    try:
        connection = engine.raw_connection()
        try:
            assert connection.driver_connection.prepare_threshold == 5  # psycopg's default
        finally:
            connection.close()
    finally:
        engine.dispose()
