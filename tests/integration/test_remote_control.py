"""``app.control`` and ``app.control.inspect()`` through the job store: the in-process worker
answers with Celery's own handlers, in the shapes stock Celery replies with."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import select

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.errors import ControlCommandRefused
from celery_ratchet.store.control import control_store
from celery_ratchet.store.schema import scheduler_job
from tests.helpers import wait_until
from tests.integration.tasks import open_gate

TIMEOUT = 30


def _node(app: Celery) -> str:
    replies = app.control.inspect(timeout=10, limit=1).ping()
    assert replies, "no worker replied to ping"
    return next(iter(replies))


def test_ping_is_answered_by_the_worker(worker_app: Celery) -> None:
    replies = worker_app.control.ping(timeout=2)
    assert len(replies) == 1
    ((node, reply),) = replies[0].items()
    assert reply == {"ok": "pong"}
    assert "@" in node


def test_inspect_commands_answer_in_stock_shapes(worker_app: Celery) -> None:
    node = _node(worker_app)
    inspect = worker_app.control.inspect(timeout=2, destination=[node])
    registered = inspect.registered()
    assert registered is not None and "t.add" in " ".join(registered[node])
    stats = inspect.stats()
    assert stats is not None
    assert {"pool", "total", "pid", "broker", "rusage"} <= set(stats[node])
    assert stats[node]["pool"]["max-concurrency"] == 4
    assert inspect.active() == {node: []}
    assert inspect.reserved() == {node: []}
    assert inspect.scheduled() == {node: []}
    queues = inspect.active_queues()
    assert queues is not None and [q["name"] for q in queues[node]] == ["celery"]
    conf = inspect.conf()
    assert conf is not None and conf[node]["task_default_queue"] == "celery"
    report = inspect.report()
    assert report is not None and "celery" in report[node]["ok"]
    assert inspect.query_task("no-such-task") == {node: {}}


def test_scheduled_lists_a_job_waiting_for_its_eta_as_stock(worker_app: Celery) -> None:
    node = _node(worker_app)
    eta = datetime.now(timezone.utc) + timedelta(hours=1)
    result = worker_app.tasks["t.add"].apply_async((1, 2), eta=eta)
    inspect = worker_app.control.inspect(timeout=2, destination=[node])
    try:
        assert inspect.scheduled() == {
            node: [
                {
                    "eta": eta.isoformat(),
                    "priority": 6,
                    "request": {
                        "id": result.id,
                        "name": "t.add",
                        "args": [1, 2],
                        "kwargs": {},
                        "type": "t.add",
                        "hostname": node,
                        "time_start": None,
                        "acknowledged": False,
                        "delivery_info": {
                            "exchange": "",
                            "routing_key": "celery",
                            "priority": 0,
                            "redelivered": False,
                        },
                        "worker_pid": None,
                    },
                }
            ]
        }
    finally:
        result.revoke()
    assert inspect.scheduled() == {node: []}


def test_active_lists_a_running_job(worker_app: Celery) -> None:
    node = _node(worker_app)
    gate = uuid.uuid4().hex
    result = worker_app.tasks["t.held"].delay(gate)
    inspect = worker_app.control.inspect(timeout=1, destination=[node])
    found: list[Any] = []

    def running() -> Any:
        active = inspect.active() or {}
        found[:] = [r for r in active.get(node, []) if r["id"] == result.id]
        return found

    try:
        wait_until(running, TIMEOUT, "the job to show in inspect active")
        (request,) = found
        assert request["name"] == "t.held" and request["args"] == [gate]
        assert request["hostname"] == node
        query = inspect.query_task(result.id)
        assert query is not None and query[node][result.id][0] == "active"
    finally:
        open_gate(gate)
    result.get(timeout=TIMEOUT)


def test_active_and_query_task_report_the_priority_the_message_carried(
    worker_app: Celery,
) -> None:
    """Stock reports the sender's priority, 0 where it set none; not the row's default (4)."""
    node = _node(worker_app)
    gate = uuid.uuid4().hex
    unset = worker_app.tasks["t.held"].delay(gate)
    given = worker_app.tasks["t.held"].apply_async((gate,), priority=6)
    inspect = worker_app.control.inspect(timeout=1, destination=[node])
    found: dict[str, Any] = {}

    def both_running() -> bool:
        for request in (inspect.active() or {}).get(node, []):
            found[request["id"]] = request["delivery_info"]["priority"]
        return {unset.id, given.id} <= set(found)

    try:
        wait_until(both_running, TIMEOUT, "both jobs to show in inspect active")
        assert (found[unset.id], found[given.id]) == (0, 6)
        query = inspect.query_task(unset.id, given.id) or {}
    finally:
        open_gate(gate)
    reported = {i: query[node][i][1]["delivery_info"]["priority"] for i in (unset.id, given.id)}
    assert reported == {unset.id: 0, given.id: 6}
    with ratchet_state(worker_app).store.engine.connect() as conn:
        row_priority = conn.execute(
            select(scheduler_job.c.priority).where(scheduler_job.c.job_id == unset.id)
        ).scalar_one()
    assert row_priority == 4  # the row keeps the default: claim order is unchanged
    unset.get(timeout=TIMEOUT)
    given.get(timeout=TIMEOUT)


def test_revoke_replies_and_is_listed_by_inspect_revoked(worker_app: Celery) -> None:
    node = _node(worker_app)
    result = worker_app.tasks["t.add"].apply_async((1, 2), countdown=600)
    replies = worker_app.control.revoke(result.id, reply=True, timeout=2, destination=[node])
    assert replies == [{node: {"ok": f"tasks {{'{result.id}'}} flagged as revoked"}}]
    assert result.state == "REVOKED"
    revoked = worker_app.control.inspect(timeout=2, destination=[node]).revoked()
    assert revoked is not None and result.id in revoked[node]


def test_control_commands_change_the_worker(worker_app: Celery) -> None:
    node = _node(worker_app)
    control = worker_app.control
    task = worker_app.tasks["t.add"]
    before = task.rate_limit
    try:
        assert control.rate_limit("t.add", "10/m", reply=True, timeout=2, destination=[node]) == [
            {node: {"ok": "new rate limit set successfully"}}
        ]
        assert task.rate_limit == "10/m"
        assert control.rate_limit("t.nope", "1/s", reply=True, timeout=2, destination=[node]) == [
            {node: {"error": "unknown task"}}
        ]
    finally:
        control.rate_limit("t.add", before, reply=True, timeout=2, destination=[node])
    assert control.time_limit(
        "t.add", soft=60, hard=120, reply=True, timeout=2, destination=[node]
    ) == [{node: {"ok": "time limits set successfully"}}]
    assert (task.soft_time_limit, task.time_limit) == (60, 120)


def test_unknown_command_replies_an_error_as_stock(worker_app: Celery) -> None:
    node = _node(worker_app)
    replies = worker_app.control.broadcast(
        "no_such_command", reply=True, timeout=2, destination=[node]
    )
    assert replies == [{node: {"error": "KeyError('no_such_command')"}}]


def test_destination_and_limit(worker_app: Celery) -> None:
    node = _node(worker_app)
    assert worker_app.control.inspect(timeout=0.5, destination=["nobody@nowhere"]).ping() is None
    started = time.monotonic()
    replies = worker_app.control.broadcast("ping", reply=True, timeout=30, limit=1)
    assert replies == [{node: {"ok": "pong"}}]
    assert time.monotonic() - started < 30, "the limit ends the wait"


def test_replies_are_deleted_once_gathered(worker_app: Celery) -> None:
    node = _node(worker_app)
    control = control_store(ratchet_state(worker_app).store)
    assert worker_app.control.inspect(timeout=1, destination=[node]).ping()
    commands, replies = control.count()
    assert commands >= 1, "a command stays for workers until it expires"
    assert replies == 0, "the replies were deleted once gathered"


def test_arguments_that_are_not_json_are_refused(worker_app: Celery) -> None:
    with pytest.raises(ControlCommandRefused, match="as JSON"):
        worker_app.control.broadcast("ping", arguments={"x": object()})


def test_add_and_cancel_consumer_change_the_queues_claimed_from(worker_app: Celery) -> None:
    node = _node(worker_app)
    control = worker_app.control
    store = ratchet_state(worker_app).store
    waiting = worker_app.tasks["t.add"].apply_async((2, 3), queue="extra")
    assert control.add_consumer("extra", reply=True, timeout=2, destination=[node]) == [
        {node: {"ok": "add consumer extra"}}
    ]
    try:
        assert waiting.get(timeout=TIMEOUT) == 5
        queues = control.inspect(timeout=1, destination=[node]).active_queues()
        assert queues is not None and {q["name"] for q in queues[node]} == {"celery", "extra"}
        assert any("extra" in n["queues"].split(",") for n in store.list_nodes())
    finally:
        assert control.cancel_consumer("extra", reply=True, timeout=2, destination=[node]) == [
            {node: {"ok": "no longer consuming from extra"}}
        ]
    queues = control.inspect(timeout=1, destination=[node]).active_queues()
    assert queues is not None and [q["name"] for q in queues[node]] == ["celery"]
    wait_until(
        lambda: all(n["queues"] == "celery" for n in store.list_nodes()),
        TIMEOUT,
        "the node to list its queues again",
    )
