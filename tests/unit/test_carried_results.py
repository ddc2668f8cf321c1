"""A prefork pool process's success carried back to the worker's main process
(celery_ratchet/celery/results/carried.py), and the result backend's choice of channel in a
pool process."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery, states
from celery.app.trace import TraceInfo, trace_ok_t

from celery_ratchet.celery.results import backend as backend_module
from celery_ratchet.celery.results import carried
from celery_ratchet.celery.results.backend import (
    HANDED_OVER_RESULT_MAX,
    RatchetBackend,
    carry_back,
)
from celery_ratchet.celery.results.carried import CarriedResult
from celery_ratchet.celery.send.sender import BEFORE_KEYED_SEND
from celery_ratchet.domain.job import JobStatus, Settlement, StoredResult

STORED = StoredResult("42", "builtins.int", None)


class FakeStore:
    def __init__(self) -> None:
        self.outcomes: list[tuple[str, str, JobStatus, Any, dict[str, Any]]] = []

    def store_outcome(
        self, job_id: str, token: str, status: JobStatus, part: Any = None, **values: Any
    ) -> bool:
        self.outcomes.append((job_id, token, status, part, values))
        return True


class FakeRuntime:
    def __init__(self) -> None:
        self.reported: list[Settlement] = []

    def report_result(self, settlement: Settlement) -> None:
        self.reported.append(settlement)


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> FakeStore:
    found = FakeStore()
    monkeypatch.setattr(RatchetBackend, "store", property(lambda self: found))
    return found


@pytest.fixture
def pool_store(store: FakeStore, monkeypatch: pytest.MonkeyPatch) -> FakeStore:
    """The store as the end of a trace in a pool process reaches it (the app's)."""
    monkeypatch.setattr(backend_module, "ratchet_state", lambda app: SimpleNamespace(store=store))
    return store


@pytest.fixture
def backend(store: FakeStore, monkeypatch: pytest.MonkeyPatch) -> RatchetBackend:
    """The backend as a pool process sees it: no runtime of the node here."""
    app = Celery("carried", set_as_current=False)
    app.conf.ratchet_url = "sqlite://"
    made = RatchetBackend(app=app)
    monkeypatch.setattr(made, "_runtime_here", lambda: None)
    return made


@pytest.fixture(autouse=True)
def nothing_kept() -> Iterator[None]:
    yield
    carried._kept.clear()


def _request(token: str = "tok", **extra: Any) -> SimpleNamespace:
    return SimpleNamespace(id="job-1", task="t.add", children=[], ratchet_claim=token, **extra)


# -- the carrier ------------------------------------------------------------------------------


def test_a_carried_result_is_its_text_to_celery_and_keeps_the_result_through_pickle() -> None:
    text = CarriedResult("42", "job-1", "tok", STORED)
    assert text == "42" and isinstance(text, str)
    copy = pickle.loads(pickle.dumps(text))
    assert isinstance(copy, CarriedResult)
    assert (copy, copy.job_id, copy.token, copy.stored) == ("42", "job-1", "tok", STORED)
    assert type(copy.plain()) is str and copy.plain() == "42"


# -- the backend in a pool process ------------------------------------------------------------


def test_a_plain_success_of_a_trace_opened_here_is_kept_not_written(
    backend: RatchetBackend, store: FakeStore
) -> None:
    carried.open_for("job-1", "tok")
    backend.store_result("job-1", 42, states.SUCCESS, request=_request())
    assert store.outcomes == []
    assert carried.close("job-1", "tok") == StoredResult("42", "builtins.int", None)


def test_a_success_of_a_trace_not_opened_here_is_written_as_before(
    backend: RatchetBackend, store: FakeStore
) -> None:
    backend.store_result("job-1", 42, states.SUCCESS, request=_request())
    assert [(o[0], o[1], o[2]) for o in store.outcomes] == [("job-1", "tok", JobStatus.SUCCEEDED)]


def test_failures_chord_parts_and_results_too_large_are_written_by_the_pool_process(
    backend: RatchetBackend, store: FakeStore
) -> None:
    carried.open_for("job-1", "tok")
    backend.store_result("job-1", RuntimeError("no"), states.FAILURE, request=_request())
    part = _request(group="g-1", chord={"task": "t.body"}, group_index=0)
    backend.store_result("job-1", 42, states.SUCCESS, request=part)
    large = "x" * (HANDED_OVER_RESULT_MAX + 1)
    backend.store_result("job-1", large, states.SUCCESS, request=_request())
    written = [(o[2], o[3] is not None) for o in store.outcomes]
    assert written == [
        (JobStatus.FAILED, False),
        (JobStatus.SUCCEEDED, True),
        (JobStatus.SUCCEEDED, False),
    ]
    assert carried.close("job-1", "tok") is None


def test_the_first_outcome_kept_wins_over_later_ones(
    backend: RatchetBackend, store: FakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    warned: list[str] = []
    monkeypatch.setattr(backend_module.logger, "warning", lambda text, *a: warned.append(text))
    carried.open_for("job-1", "tok")
    backend.store_result("job-1", 42, states.SUCCESS, request=_request())
    backend.store_result("job-1", 43, states.SUCCESS, request=_request())
    backend.store_result("job-1", RuntimeError("late"), states.FAILURE, request=_request())
    assert store.outcomes == []
    assert carried.close("job-1", "tok") == StoredResult("42", "builtins.int", None)
    assert len(warned) == 2 and all("an earlier outcome" in text for text in warned)


def test_progress_is_written_by_the_pool_process(
    backend: RatchetBackend, store: FakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    progress: list[str] = []
    monkeypatch.setattr(
        FakeStore, "store_progress", lambda self, *a, **k: progress.append(a[0]), raising=False
    )
    carried.open_for("job-1", "tok")
    backend.store_result("job-1", {"done": 1}, "PROGRESS", request=_request())
    assert progress == ["job-1"] and carried.close("job-1", "tok") is None


# -- the end of the trace in the pool process -------------------------------------------------


def _success(text: str = "42") -> Any:
    return trace_ok_t(42, None, 0.1, text)


def test_a_successful_trace_carries_its_kept_result_in_its_returns_text(
    pool_store: FakeStore,
) -> None:
    carried.open_for("job-1", "tok")
    carried.keep("job-1", "tok", STORED)
    traced = carry_back(object(), "job-1", "tok", _success())
    text = traced[3]
    assert isinstance(text, CarriedResult) and text == "42"
    assert (text.job_id, text.token, text.stored) == ("job-1", "tok", STORED)
    assert traced[:3] == (42, None, 0.1)
    assert pool_store.outcomes == [] and not carried.opened("job-1", "tok")


def test_a_trace_with_nothing_kept_is_returned_as_it_is(pool_store: FakeStore) -> None:
    carried.open_for("job-1", "tok")
    traced = _success()
    assert carry_back(object(), "job-1", "tok", traced) is traced
    assert pool_store.outcomes == []


@pytest.mark.parametrize("ended", ["failed", "raised"])
def test_a_result_kept_for_a_trace_that_did_not_end_in_success_is_written_there(
    pool_store: FakeStore, ended: str
) -> None:
    carried.open_for("job-1", "tok")
    carried.keep("job-1", "tok", STORED)
    traced = (
        trace_ok_t(None, TraceInfo(states.FAILURE, RuntimeError("after")), 0.1, None)
        if ended == "failed"
        else None
    )
    assert carry_back(object(), "job-1", "tok", traced) is traced
    assert [(o[0], o[2], o[4]["job_result"]) for o in pool_store.outcomes] == [
        ("job-1", JobStatus.SUCCEEDED, "42")
    ]


# -- in the worker's main process -------------------------------------------------------------


def test_the_main_process_hands_a_carried_result_to_its_settler(
    backend: RatchetBackend, store: FakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = FakeRuntime()
    monkeypatch.setattr(backend, "_runtime_here", lambda: runtime)
    backend.settle_carried(CarriedResult("42", "job-1", "tok", STORED))
    assert runtime.reported == [Settlement("job-1", "tok", JobStatus.SUCCEEDED, result=STORED)]
    assert store.outcomes == []


def test_a_node_that_closed_writes_a_carried_result_at_once(
    backend: RatchetBackend, store: FakeStore
) -> None:
    backend.settle_carried(CarriedResult("42", "job-1", "tok", STORED))
    assert [(o[0], o[1], o[2], o[4]["job_result"]) for o in store.outcomes] == [
        ("job-1", "tok", JobStatus.SUCCEEDED, "42")
    ]


def test_a_keyed_send_from_the_success_handlers_writes_the_kept_result_first(
    pool_store: FakeStore,
) -> None:
    """A success not written still holds its business key: a keyed send from the task's
    own success handlers would be taken for its duplicate."""
    carried.open_for("job-1", "tok")
    carried.keep("job-1", "tok", STORED)
    for hook in BEFORE_KEYED_SEND:
        hook(SimpleNamespace(store=pool_store))
    assert [(o[0], o[2], o[4]["job_result"]) for o in pool_store.outcomes] == [
        ("job-1", JobStatus.SUCCEEDED, "42")
    ]
    traced = _success()
    assert carry_back(object(), "job-1", "tok", traced) is traced  # nothing left to carry
    assert not carried.opened("job-1", "tok") and len(pool_store.outcomes) == 1
