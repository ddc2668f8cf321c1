"""Broadcasts and replies in the job store, on each database: what ``celery inspect`` and
``celery control`` travel on without a broker."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import inspect as sql_inspect
from sqlalchemy import text

from celery_ratchet.domain.control import CONTROL_WAKEUP
from celery_ratchet.store.control import control_store
from celery_ratchet.store.ddl import bring_up_to_date
from celery_ratchet.store.jobstore import JobStore
from tests.conftest import Servers, empty_store
from tests.contract.test_wakeup_announcements import Listener
from tests.helpers import wait_until


def test_commands_are_read_from_their_time_on_until_they_expire(store: JobStore) -> None:
    control = control_store(store)
    start = control.clock()
    control.broadcast("ping", "{}", ttl_seconds=60)
    (earlier,) = control.commands_since(start)
    # SQLite's clock counts milliseconds: a node started in the same one reads it too.
    since = earlier.created_at + timedelta(microseconds=1)
    wait_until(lambda: control.clock() >= since, 5, "the database clock to move on")
    assert control.commands_since(since) == [], "a command sent before is not read"
    control.broadcast("stats", '{"a": 1}', destination='["w1@h"]', ticket="t1", ttl_seconds=60)
    control.broadcast("gone", "{}", ttl_seconds=-1)
    (command,) = control.commands_since(since)
    assert (command.command, command.arguments, command.destination, command.ticket) == (
        "stats",
        '{"a": 1}',
        '["w1@h"]',
        "t1",
    )
    assert command.expires_at > command.created_at


def test_replies_are_read_in_order_then_dropped(store: JobStore) -> None:
    control = control_store(store)
    since = control.clock()
    control.broadcast("ping", "{}", ticket="t2", ttl_seconds=60)
    (command,) = control.commands_since(since)
    control.reply(command, "w1@h", '{"w1@h": {"ok": "pong"}}')
    control.reply(command, "w2@h", '{"w2@h": {"ok": "pong"}}')
    first, second = control.replies("t2")
    assert (first.hostname, second.hostname) == ("w1@h", "w2@h")
    assert control.replies("t2", after=first.id) == [second]
    assert control.replies("other") == []
    assert control.drop_replies("t2") == 2
    assert control.replies("t2") == []


def test_expired_rows_are_deleted_by_the_next_broadcast(store: JobStore) -> None:
    control = control_store(store)
    since = control.clock()
    control.broadcast("old", "{}", ticket="t3", ttl_seconds=-120)
    with store.engine.connect() as conn:
        conn.execute(text("UPDATE scheduler_control SET created_at = expires_at"))
    control.broadcast("new", "{}", ttl_seconds=60)
    assert control.count() == (1, 0)
    assert [c.command for c in control.commands_since(since)] == ["new"]


def test_an_older_database_gets_the_control_tables(store: JobStore) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("DROP TABLE scheduler_control_reply"))
        conn.execute(text("DROP TABLE scheduler_control"))
    with store.engine.connect() as conn:
        added = bring_up_to_date(conn)
        tables = set(sql_inspect(conn).get_table_names())
    assert {"scheduler_control", "scheduler_control_reply"} <= set(added)
    assert {"scheduler_control", "scheduler_control_reply"} <= tables
    control_store(store).broadcast("ping", "{}", ttl_seconds=60)


def test_a_broadcast_is_announced_on_postgresql(servers: Servers) -> None:
    url = servers.url("postgresql")
    empty_store(url)
    listener = Listener(url)
    try:
        control_store(JobStore(url, notify=True)).broadcast("ping", "{}", ttl_seconds=60)
        assert CONTROL_WAKEUP in listener.until(CONTROL_WAKEUP)
    finally:
        listener.conn.close()
