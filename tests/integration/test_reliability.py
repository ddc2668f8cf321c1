"""Retries with backoff, the dead-letter queue, permits, breakers: in-process worker, each db."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

import celery_ratchet
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.breaker import BreakerState
from celery_ratchet.domain.job import JobStatus
from celery_ratchet.errors import ConfigurationError
from tests.conftest import Servers, empty_store
from tests.helpers import wait_until
from tests.integration.conftest import BrokerTrap, make_app, worker_running

TIMEOUT = 30
RUNS: dict[str, list[Any]] = defaultdict(list)
FIXED: set[str] = set()
_lock = threading.Lock()


@celery_ratchet.do_not_retry
class InvalidCard(ValueError):
    pass


class OnlyTimeouts(celery_ratchet.RetryPolicy):
    def should_retry(self, attempt: int, exc: BaseException) -> bool:
        return isinstance(exc, TimeoutError)


def _register(app: Celery) -> None:
    @app.task(name="r.flaky", shared=False, bind=True)
    def flaky(self: Any, key: str, failures: int) -> str:
        with _lock:
            RUNS[key].append((self.request.retries, time.monotonic()))
        if key not in FIXED and self.request.retries < failures:
            raise ConnectionError(f"attempt {self.request.retries + 1}")
        return f"ok after {self.request.retries}"

    @app.task(name="r.invalid", shared=False, bind=True, backoff="none", max_retries=5)
    def invalid(self: Any, key: str, explicit: bool) -> None:
        RUNS[key].append(self.request.retries)
        if explicit:
            raise self.retry(exc=InvalidCard("card refused"))
        raise InvalidCard("card refused")

    @app.task(name="r.picky", shared=False, ratchet_retry_policy=OnlyTimeouts(), backoff="none")
    def picky(key: str, kind: str) -> None:
        RUNS[key].append(kind)
        raise TimeoutError("slow") if kind == "timeout" and len(RUNS[key]) < 2 else KeyError(kind)

    @app.task(name="r.pay", shared=False, resource="payments")
    def pay(key: str) -> None:
        with _lock:
            RUNS[key].append(("start", time.monotonic()))
        time.sleep(0.2)
        with _lock:
            RUNS[key].append(("end", time.monotonic()))

    @celery_ratchet.circuit_breaker("partner", window=4, minimum_calls=2, open_seconds=1.5)
    @app.task(name="r.partner", shared=False)
    def partner(key: str, fail: bool) -> str:
        RUNS[key].append(fail)
        if fail:
            raise ConnectionError("partner down")
        return "ok"


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "mysql"])
def app(
    request: pytest.FixtureRequest, servers: Servers, broker_trap: BrokerTrap
) -> Iterator[Celery]:
    url = empty_store(servers.url(request.param)).url
    app = make_app(url, broker_trap.url, ratchet_resources={"payments": 1})
    _register(app)
    with worker_running(app):
        yield app


def record(app: Celery, task_id: str) -> Any:
    found = ratchet_state(app).store.result(task_id)
    assert found is not None
    return found


def fast(backoff: str = "fixed", **more: Any) -> dict[str, Any]:
    return {"ratchet": {"backoff": backoff, "backoff_param": 0.05, **more}}


def test_a_failure_is_retried_with_backoff_until_it_succeeds(app: Celery) -> None:
    key = uuid.uuid4().hex
    result = app.tasks["r.flaky"].apply_async((key, 2), **fast("exponential", max_retries=3))
    assert result.get(timeout=TIMEOUT) == "ok after 2"
    assert [retries for retries, _ in RUNS[key]] == [0, 1, 2]
    assert (record(app, result.id).status, record(app, result.id).attempts) == (
        JobStatus.SUCCEEDED, 2,
    )  # fmt: skip


def test_plain_celery_tasks_are_not_retried_by_ratchet(app: Celery) -> None:
    key = uuid.uuid4().hex
    result = app.tasks["r.flaky"].delay(key, 1)
    with pytest.raises(ConnectionError):
        result.get(timeout=TIMEOUT)
    assert len(RUNS[key]) == 1


def test_exhausted_retries_land_in_the_dlq_and_a_dlq_retry_runs_it_again(app: Celery) -> None:
    key = uuid.uuid4().hex
    result = app.tasks["r.flaky"].apply_async((key, 99), **fast(max_retries=2))
    with pytest.raises(ConnectionError, match="attempt 3"):
        result.get(timeout=TIMEOUT)
    dlq = celery_ratchet.dlq(app)
    assert result.id in {j.job_id for j in dlq.list(task_name="r.flaky", limit=500)}
    letter = dlq.show(result.id)
    assert letter is not None
    assert (letter.args, letter.attempts) == ([key, 99], 2)
    assert letter.exception == "ConnectionError: attempt 3" and "ConnectionError" in (
        letter.traceback or ""
    )
    FIXED.add(key)
    assert dlq.retry(result.id) == 1
    assert app.AsyncResult(result.id).get(timeout=TIMEOUT) == "ok after 0"  # attempts: 0
    assert dlq.show(result.id) is None


def test_do_not_retry_failures_skip_every_retry(app: Celery) -> None:
    for explicit in (False, True):
        key = uuid.uuid4().hex
        result = app.tasks["r.invalid"].delay(key, explicit)
        with pytest.raises(InvalidCard):
            result.get(timeout=TIMEOUT)
        assert RUNS[key] == [0], "a do-not-retry failure ran again"
        assert record(app, result.id).status is JobStatus.FAILED


def test_a_retry_policy_decides_which_failures_retry(app: Celery) -> None:
    retried, refused = uuid.uuid4().hex, uuid.uuid4().hex
    ok = app.tasks["r.picky"].delay(retried, "timeout")
    bad = app.tasks["r.picky"].delay(refused, "other")
    with pytest.raises(KeyError):
        ok.get(timeout=TIMEOUT)  # the timeout was retried; its second run raised KeyError
    with pytest.raises(KeyError):
        bad.get(timeout=TIMEOUT)
    assert (RUNS[retried], RUNS[refused]) == (["timeout", "timeout"], ["other"])


def test_permits_let_one_payment_run_at_a_time(app: Celery) -> None:
    keys = [uuid.uuid4().hex for _ in range(4)]
    results = [app.tasks["r.pay"].delay(k) for k in keys]
    for r in results:
        r.get(timeout=TIMEOUT)
    spans = sorted((RUNS[k][0][1], RUNS[k][1][1]) for k in keys)
    overlaps = [a for a, b in itertools.pairwise(spans) if b[0] < a[1]]
    assert overlaps == [], "two jobs held the single payments permit at once"


def test_an_unknown_resource_is_refused_at_send(app: Celery) -> None:
    with pytest.raises(ConfigurationError, match="ratchet_resources"):
        app.tasks["r.pay"].apply_async(("x",), ratchet={"resource": "nope"})
    with pytest.raises(ValueError, match="unknown ratchet option"):
        app.tasks["r.pay"].apply_async(("x",), ratchet={"resorce": "payments"})


def test_named_priorities_are_stored_on_celerys_scale(app: Celery) -> None:
    result = app.tasks["r.flaky"].apply_async((uuid.uuid4().hex, 0), priority="HIGH")
    result.get(timeout=TIMEOUT)
    with ratchet_state(app).store.engine.connect() as conn:
        from sqlalchemy import text

        sql = "SELECT priority FROM scheduler_job WHERE job_id = :j"
        assert conn.execute(text(sql), {"j": result.id}).scalar_one() == 6


def test_an_open_breaker_defers_jobs_without_failing_them(app: Celery) -> None:
    partner = app.tasks["r.partner"]
    failing = [partner.delay(uuid.uuid4().hex, True) for _ in range(2)]
    for r in failing:
        with pytest.raises(ConnectionError):
            r.get(timeout=TIMEOUT)
    runtime = ratchet_state(app).runtime

    # The worker records an outcome with the breaker after the result is stored.
    def state() -> BreakerState | None:
        breaker = runtime.breakers.get("partner")
        return None if breaker is None else breaker.state

    wait_until(lambda: state() is BreakerState.OPEN, TIMEOUT, "the breaker to open")
    later = [partner.delay(uuid.uuid4().hex, False) for _ in range(3)]
    assert [r.get(timeout=TIMEOUT) for r in later] == ["ok"] * 3
    rows = [record(app, r.id) for r in later]
    assert {(r.status, r.attempts) for r in rows} == {(JobStatus.SUCCEEDED, 0)}
    wait_until(lambda: state() is BreakerState.CLOSED, TIMEOUT, "the breaker to close")
    ids = {r.id for r in later}
    jobs = ratchet_state(app).store.list_jobs(task_name="r.partner", limit=500)
    waits = [(j.scheduled_time - j.created_at).total_seconds() for j in jobs if j.job_id in ids]
    assert max(waits) > 0.5, "the jobs ran while the breaker was open"


def test_tags_and_business_keys_are_stored_and_filterable(app: Celery) -> None:
    key = uuid.uuid4().hex
    options = {"tags": ["billing", "eu"], "business_key": f"order-{key}"}
    result = app.tasks["r.flaky"].apply_async((key, 0), ratchet=options)
    result.get(timeout=TIMEOUT)
    store = ratchet_state(app).store
    assert [j.job_id for j in store.list_jobs(business_key=f"order-{key}")] == [result.id]
    assert result.id in {j.job_id for j in store.list_jobs(tag="eu", limit=500)}
    with pytest.raises(ValueError, match="no comma"):
        app.tasks["r.flaky"].apply_async((key, 0), ratchet={"tags": ["a,b"]})
