"""A group of alike members is sent from its first member's message: the rows it writes are
the rows Celery's own member-by-member send writes, field by field, but for the ids."""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import Celery, chord, group, signals
from sqlalchemy import text

from celery_ratchet.celery.send import alike_groups
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.errors import InvalidJob
from tests.conftest import Servers, empty_store
from tests.integration.conftest import BrokerTrap, make_app

PARKED = "parked"  # no worker consumes it: the rows stay as written
MEMBERS = 12

_COLUMNS = (
    "job_id, task_name, queue, status, job_type, priority, attempts, root_id, parent_id, "
    "group_id, business_key, resource, tags, expires_at, payload, content_type, "
    "content_encoding, headers, properties"
)


@pytest.fixture
def client_app(servers: Servers, dialect: str, broker_trap: BrokerTrap) -> Celery:
    url = servers.url(dialect)
    empty_store(url)
    app = make_app(url, broker_trap.url, task_send_sent_event=True)

    @app.task(name="t.pair", shared=False)
    def pair(label: str, n: int, *, note: str = "") -> str:
        return f"{label}{n}{note}"

    @app.task(name="t.kept", shared=False, ignore_result=False, priority=3)
    def kept(n: int) -> int:
        return n

    @app.task(name="t.count", shared=False)
    def count(values: list[Any]) -> int:
        return len(values)

    return app


@contextmanager
def template_taken() -> Iterator[list[bool]]:
    """Whether each group sent meanwhile was sent from a template (True) or by Celery."""
    taken: list[bool] = []
    real = alike_groups._template_of

    def spy(*args: Any, **kwargs: Any) -> Any:
        found = real(*args, **kwargs)
        taken.append(found is not None)
        return found

    alike_groups._template_of = spy  # type: ignore[assignment]
    try:
        yield taken
    finally:
        alike_groups._template_of = real  # type: ignore[assignment]


def rows_of(app: Celery, group_id: str) -> list[dict[str, Any]]:
    """The group's rows in member order, every id replaced by its place (J0, J1, ... and G
    for the group), the JSON columns decoded."""
    engine = ratchet_state(app).store.engine
    with engine.connect() as conn:
        found = conn.execute(
            text(f"SELECT {_COLUMNS} FROM scheduler_job WHERE group_id = :g"), {"g": group_id}
        ).mappings()
        rows = [dict(r) for r in found]
    rows.sort(key=lambda r: json.loads(r["headers"])["group_index"])
    names = {r["job_id"]: f"J{i}" for i, r in enumerate(rows)}
    names[group_id] = "G"

    def placed(value: Any) -> Any:
        if isinstance(value, str):
            return names.get(value, value)
        if isinstance(value, dict):
            return {k: placed(v) for k, v in value.items()}
        if isinstance(value, list):
            return [placed(v) for v in value]
        return value

    normalized = []
    for row in rows:
        row = {**row, "payload": json.loads(bytes(row["payload"]))}
        row["headers"] = json.loads(row["headers"])
        row["properties"] = json.loads(row["properties"])
        row["origin_is_set"] = bool(row["headers"].pop("origin", None))
        normalized.append(placed(row))
    return normalized


def both_ways(
    app: Celery, monkeypatch: pytest.MonkeyPatch, send: Callable[[], Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[bool]]:
    """The rows of ``send()`` from a template, then as Celery sends each member."""
    with template_taken() as taken:
        lean = send()
    with monkeypatch.context() as m:
        m.setattr(alike_groups, "MIN_MEMBERS", 10**9)
        stock = send()
    for result in (lean, stock):
        assert len(result.results) == MEMBERS
    lean_rows, stock_rows = rows_of(app, lean.id), rows_of(app, stock.id)
    assert [r["job_id"] for r in lean_rows] == [f"J{i}" for i in range(MEMBERS)]
    assert [c.id for c in lean.results] == [
        json.loads(r.headers)["id"] for r in _raw_headers(app, lean.id)
    ]
    return lean_rows, stock_rows, taken


def _raw_headers(app: Celery, group_id: str) -> list[Any]:
    engine = ratchet_state(app).store.engine
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT headers FROM scheduler_job WHERE group_id = :g"), {"g": group_id}
        ).all()
    return sorted(found, key=lambda r: json.loads(r.headers)["group_index"])


@pytest.mark.parametrize(
    "scenario",
    ["plain", "group options", "keyword arguments", "member ids", "ratchet options", "kept"],
)
def test_alike_members_are_written_as_celery_writes_each(
    client_app: Celery, monkeypatch: pytest.MonkeyPatch, scenario: str
) -> None:
    pair, kept = client_app.tasks["t.pair"], client_app.tasks["t.kept"]
    quoted = ["it's", 'say "hi"', "back\\slash", "ünï", "x" * 500]
    runs = itertools.count()

    def send() -> Any:
        if scenario == "plain":
            return group([pair.s("a", i) for i in range(MEMBERS)]).apply_async(queue=PARKED)
        if scenario == "group options":
            return group([pair.s("b", i) for i in range(MEMBERS)]).apply_async(
                queue=PARKED, priority=7, headers={"tenant": "t1"}
            )
        if scenario == "keyword arguments":
            members = [
                pair.s(quoted[i % len(quoted)], i, note=quoted[-1 - i % len(quoted)])
                for i in range(MEMBERS)
            ]
            return group(members).apply_async(queue=PARKED)
        if scenario == "member ids":
            run = next(runs)
            members = [pair.s("c", i).set(task_id=f"given-{run}-{i}") for i in range(MEMBERS)]
            return group(members).apply_async(queue=PARKED)
        if scenario == "ratchet options":
            members = [
                pair.s("d", i).set(queue=PARKED, ratchet={"tags": ["bulk"], "timeout": 30})
                for i in range(MEMBERS)
            ]
            return group(members).apply_async()
        return group([kept.s(i) for i in range(MEMBERS)]).apply_async(queue=PARKED)

    lean, stock, taken = both_ways(client_app, monkeypatch, send)
    assert taken == [True]
    assert lean == stock


def test_a_chords_header_is_written_as_celery_writes_it_and_sized_once(
    client_app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair, count = client_app.tasks["t.pair"], client_app.tasks["t.count"]
    sized: list[tuple[str, int]] = []
    backend = client_app.backend
    real = backend.set_chord_size

    def set_chord_size(group_id: str, size: int) -> None:
        sized.append((group_id, size))
        real(group_id, size)

    monkeypatch.setattr(backend, "set_chord_size", set_chord_size)

    def send() -> Any:
        body = chord([pair.s("h", i) for i in range(MEMBERS)], count.s()).apply_async(queue=PARKED)
        return body.parent

    lean, stock, taken = both_ways(client_app, monkeypatch, send)
    assert taken == [True]
    for row in lean + stock:  # each chord has a body of its own
        row["payload"][2]["chord"]["options"]["task_id"] = "B"
    assert lean == stock
    assert [size for _, size in sized] == [MEMBERS, MEMBERS]


def test_signals_and_sent_events_come_once_a_member_with_its_own_message(
    client_app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = client_app.tasks["t.pair"]
    before: list[str] = []
    after: list[str] = []

    def stamp(headers: dict[str, Any], **_: Any) -> None:
        before.append(headers["id"])
        headers["stamped_by_receiver"] = f"for-{headers['id']}"

    signals.before_task_publish.connect(stamp, weak=False)
    signals.after_task_publish.connect(lambda headers, **_: after.append(headers["id"]), weak=False)
    try:
        with template_taken() as taken:
            result = group([pair.s("e", i) for i in range(MEMBERS)]).apply_async(queue=PARKED)
    finally:
        signals.before_task_publish.receivers = []
        signals.after_task_publish.receivers = []
    ids = [child.id for child in result.results]
    assert taken == [True]
    assert before == ids
    assert after == ids
    rows = _raw_headers(client_app, result.id)
    assert [json.loads(r.headers)["stamped_by_receiver"] for r in rows] == [f"for-{i}" for i in ids]


def test_members_are_built_with_the_collector_held_off_and_it_is_on_again_after(
    client_app: Celery,
) -> None:
    pair = client_app.tasks["t.pair"]
    collecting: list[bool] = []

    def seen(**_: Any) -> None:
        collecting.append(gc.isenabled())

    signals.before_task_publish.connect(seen, weak=False)
    try:
        assert gc.isenabled()
        with template_taken() as taken:
            group([pair.s("g", i) for i in range(MEMBERS)]).apply_async(queue=PARKED)
        with pytest.raises(InvalidJob), template_taken():
            group([pair.s("g", i) for i in range(MEMBERS)]).apply_async(
                queue=PARKED, ratchet={"priority": "no such level"}
            )
    finally:
        signals.before_task_publish.receivers = []
    assert taken == [True]
    assert collecting[:MEMBERS] == [False] * MEMBERS
    assert gc.isenabled()


@pytest.mark.parametrize("scenario", ["two tasks", "member options", "countdown", "few"])
def test_groups_that_are_not_alike_are_sent_by_celery(
    client_app: Celery, monkeypatch: pytest.MonkeyPatch, scenario: str
) -> None:
    pair, kept = client_app.tasks["t.pair"], client_app.tasks["t.kept"]
    members: list[Any] = [pair.s("f", i) for i in range(MEMBERS)]
    options: dict[str, Any] = {"queue": PARKED}
    if scenario == "two tasks":
        members[-1] = kept.s(1)
    elif scenario == "member options":
        members[-1] = members[-1].set(priority=9)
    elif scenario == "countdown":
        options["countdown"] = 60
    else:
        members = members[: alike_groups.MIN_MEMBERS - 1]
    with template_taken() as taken:
        result = group(members).apply_async(**options)
    assert taken == []
    assert len(_raw_headers(client_app, result.id)) == len(members)


def test_a_task_that_checks_its_arguments_refuses_a_bad_member_and_nothing_is_written(
    client_app: Celery,
) -> None:
    pair = client_app.tasks["t.pair"]
    members = [pair.s("g", i) for i in range(MEMBERS)]
    members[5] = pair.s("g")  # a missing argument
    with pytest.raises(TypeError):
        group(members).apply_async(queue=PARKED)
    assert ratchet_state(client_app).store.count_by_status() == {}


# -- what an adversarial reading found, each now sent as Celery sends it ---------------------


@pytest.mark.parametrize(
    "differ",
    [
        lambda sig, i: sig.set(priority=True if i % 2 else 1),  # 1 == True
        lambda sig, i: sig.set(time_limit=30.0 if i % 2 else 30),  # 30 == 30.0
        lambda sig, i: sig.set(headers={"a": 1, "b": 2} if i % 2 else {"b": 2, "a": 1}),
    ],
    ids=["bool for int", "float for int", "key order"],
)
def test_members_whose_options_are_equal_but_not_alike_are_sent_by_celery(
    client_app: Celery, differ: Callable[[Any, int], Any]
) -> None:
    pair = client_app.tasks["t.pair"]
    members = [differ(pair.s("i", i), i) for i in range(MEMBERS)]
    # Celery's own send refuses priority True
    with template_taken() as taken, contextlib.suppress(InvalidJob):
        group(members).apply_async(queue=PARKED)
    assert taken == []


def test_a_member_given_no_id_is_refused_as_celery_refuses_it(client_app: Celery) -> None:
    pair = client_app.tasks["t.pair"]
    members = [pair.s("j", i) for i in range(MEMBERS)]
    members[3] = members[3].set(task_id=None)
    with template_taken() as taken, pytest.raises(ValueError, match="valid id"):
        group(members).apply_async(queue=PARKED)
    assert taken == []
    assert ratchet_state(client_app).store.count_by_status() == {}


def test_a_send_wrapped_on_the_task_or_app_itself_sees_every_member(
    client_app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = client_app.tasks["t.pair"]
    calls: list[str] = []
    on_task, on_app = pair.apply_async, client_app.send_task

    @functools.wraps(on_task)
    def apply_async(*args: Any, **kwargs: Any) -> Any:
        calls.append("task")
        return on_task(*args, **kwargs)

    @functools.wraps(on_app)  # copies ratchet's mark: known by identity, not by the mark
    def send_task(*args: Any, **kwargs: Any) -> Any:
        calls.append("app")
        return on_app(*args, **kwargs)

    for target, name, wrapper in ((pair, "apply_async", apply_async),
                                  (client_app, "send_task", send_task)):  # fmt: skip
        with monkeypatch.context() as m:
            m.setattr(target, name, wrapper)
            calls.clear()
            with template_taken() as taken:
                group([pair.s("k", i) for i in range(MEMBERS)]).apply_async(queue=PARKED)
            assert taken == []
            assert len(calls) == MEMBERS


def test_a_receiver_changing_nested_headers_in_place_changes_its_own_member_only(
    client_app: Celery,
) -> None:
    pair = client_app.tasks["t.pair"]

    def first_seen(headers: dict[str, Any], body: Any, **_: Any) -> None:
        headers["stamps"].setdefault("first_seen", headers["id"])
        body[2]["errbacks"] = [*(body[2]["errbacks"] or []), headers["id"]]

    signals.before_task_publish.connect(first_seen, weak=False)
    try:
        with template_taken() as taken:
            result = group([pair.s("l", i) for i in range(MEMBERS)]).apply_async(queue=PARKED)
    finally:
        signals.before_task_publish.disconnect(first_seen)
    assert taken == [True]
    ids = [child.id for child in result.results]
    rows = _raw_headers(client_app, result.id)
    assert [json.loads(r.headers)["stamps"]["first_seen"] for r in rows] == ids


def test_a_root_given_is_every_members_root_even_when_it_is_the_first_members_id(
    client_app: Celery,
) -> None:
    pair = client_app.tasks["t.pair"]
    members = [pair.s("m", i).set(task_id=f"root-case-{i}") for i in range(MEMBERS)]
    result = group(members).apply_async(queue=PARKED, root_id="root-case-0")
    rows = _raw_headers(client_app, result.id)
    assert {json.loads(r.headers)["root_id"] for r in rows} == {"root-case-0"}
