"""Tasks of the integration app, and what they observed while running."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

from celery import Celery, chain, group, states
from celery.exceptions import Ignore

import celery_ratchet

#: What ran, by key: filled by the tasks in the (in-process) worker.
RUNS: dict[str, list[Any]] = defaultdict(list)
_lock = threading.Lock()
#: What ``t.held`` jobs wait for, by name: the test opens one to let its jobs end.
GATES: dict[str, threading.Event] = defaultdict(threading.Event)


def open_gate(gate: str) -> None:
    GATES[gate].set()


def record(key: str, value: Any) -> None:
    with _lock:
        RUNS[key].append(value)


class Unserialisable:
    pass


def register(app: Celery) -> None:
    register_canvas(app)
    register_repairable(app)

    @app.task(name="t.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="t.echo_request", shared=False, bind=True)
    def echo_request(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        r = self.request
        return {
            "id": r.id,
            "args": list(r.args),
            "kwargs": r.kwargs,
            "retries": r.retries,
            "eta": r.eta,
            "routing_key": r.delivery_info.get("routing_key"),
            "priority": r.delivery_info.get("priority"),
            "redelivered": r.delivery_info.get("redelivered"),
            "custom": getattr(r, "custom", None),
            "hostname": r.hostname,
        }

    @app.task(name="t.flaky", shared=False, bind=True, max_retries=5)
    def flaky(self: Any, key: str, failures: int) -> str:
        record(key, self.request.retries)
        if self.request.retries < failures:
            raise self.retry(countdown=0.1, exc=RuntimeError(f"attempt {self.request.retries}"))
        return f"done after {self.request.retries}"

    @app.task(name="t.fail", shared=False)
    def fail(message: str) -> None:
        raise ValueError(message)

    @app.task(name="t.mark", shared=False)
    def mark(key: str) -> str:
        record(key, time.time())
        return key

    @app.task(name="t.unserialisable", shared=False)
    def unserialisable() -> Unserialisable:
        return Unserialisable()

    @app.task(name="t.progress", shared=False, bind=True)
    def progress(self: Any, key: str) -> str:
        self.update_state(state="PROGRESS", meta={"step": 1})
        deadline = time.time() + 10
        while not RUNS.get(key) and time.time() < deadline:
            time.sleep(0.02)
        return "finished"

    @app.task(name="t.ignored", shared=False)
    def ignored() -> None:
        raise Ignore()

    @app.task(name="t.sleep", shared=False)
    def sleep(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @app.task(name="t.held", shared=False)
    def held(gate: str, seconds: float = 60.0) -> str:
        """Runs until the test opens ``gate`` (:func:`open_gate`), ``seconds`` at most."""
        GATES[gate].wait(seconds)
        return gate


def register_canvas(app: Celery) -> None:
    """Tasks for chains, chords, batches and workflows."""

    @app.task(name="t.tsum", shared=False)
    def tsum(values: list[int]) -> int:
        return sum(values)

    @app.task(name="t.collect", shared=False)
    def collect(value: Any, key: str) -> Any:
        record(key, value)
        return value

    @app.task(name="t.replace_with_add", shared=False, bind=True)
    def replace_with_add(self: Any, x: int) -> None:
        raise self.replace(app.tasks["t.add"].s(x, 1))

    @app.task(name="t.replace_with_chain_and_linger", shared=False, bind=True)
    def replace_with_chain_and_linger(self: Any, x: int) -> None:
        """Replaced by a chain whose last step takes this task's id, then still running
        until the chain's first step has ended (and sent that last step)."""
        replacement = chain(app.tasks["t.add"].s(x, 1), app.tasks["t.times"].s(2))
        try:
            raise self.replace(replacement)
        finally:
            first = app.AsyncResult(replacement.tasks[0].id)
            deadline = time.monotonic() + 20
            while first.state not in states.READY_STATES and time.monotonic() < deadline:
                time.sleep(0.05)

    @app.task(name="t.replace_with_group", shared=False, bind=True)
    def replace_with_group(self: Any, nums: list[int], val: int) -> None:
        raise self.replace(group(app.tasks["t.add"].s(n, val) for n in nums))

    @app.task(name="t.replace_with_group_and_linger", shared=False, bind=True)
    def replace_with_group_and_linger(self: Any, nums: list[int], val: int) -> None:
        """Replaced by a group whose chord body takes this task's id, then still running
        until every member has ended and that body has been sent, or 20 s."""
        replacement = group(app.tasks["t.add"].s(n, val) for n in nums)
        replacement.freeze()
        members = [app.AsyncResult(task.id) for task in replacement.tasks]
        try:
            raise self.replace(replacement)
        finally:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not (
                all(m.state in states.READY_STATES for m in members)
                and app.AsyncResult(self.request.id).state in states.READY_STATES
            ):
                time.sleep(0.05)

    @app.task(name="t.replace_with_chain_to_group", shared=False, bind=True)
    def replace_with_chain_to_group(self: Any, x: int) -> None:
        add = app.tasks["t.add"]
        raise self.replace(chain(add.s(x, 1), group(add.s(1), add.s(2))))

    @app.task(name="t.identity", shared=False)
    def identity(value: Any) -> Any:
        return value

    @app.task(name="t.times", shared=False)
    def times(x: int, factor: int) -> int:
        return x * factor


@celery_ratchet.predicate
def is_big(value: Any) -> bool:
    """A workflow predicate, allowed by the decorator."""
    return isinstance(value, int) and value > 100


def is_small(value: Any) -> bool:
    """Not a predicate: allowed only where ratchet_predicate_modules lists this package."""
    return isinstance(value, int) and value < 10


#: Keys whose t.fail_until_fixed task succeeds: set by tests (same process as the worker).
FIXED: set[str] = set()


def register_repairable(app: Celery) -> None:
    @app.task(name="t.fail_until_fixed", shared=False)
    def fail_until_fixed(key: str) -> str:
        if key not in FIXED:
            raise RuntimeError(f"{key} is broken")
        return f"{key} fixed"

    @app.task(name="t.big", shared=False)
    def big(size: int) -> str:
        return "x" * size
