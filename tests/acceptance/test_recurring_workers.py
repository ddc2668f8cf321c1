"""Recurring jobs across real worker processes on PostgreSQL and MariaDB."""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections import Counter
from datetime import timedelta

import pytest
from celery import Celery

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.runtime.recurring import master_id
from tests.acceptance.conftest import Cluster, fire_times, side_effects, wait_until

pytestmark = pytest.mark.slow

RUN_SECONDS = float(os.environ.get("RATCHET_ACCEPTANCE_SECONDS", "60"))


def test_three_workers_fire_a_per_second_schedule_once_per_tick(
    server_app: Celery, server_cluster: Cluster
) -> None:
    for name in ("w1", "w2", "w3"):
        server_cluster.start(
            name, pool="threads", concurrency=2, RATCHET_ACCEPTANCE_RECURRING="tick"
        )
    store = ratchet_state(server_app).store
    time.sleep(RUN_SECONDS)
    for worker in server_cluster.workers:
        worker.stop()
    keys = Counter(key for key, _ in side_effects(store) if key.startswith("tick@"))
    doubles = [key for key, n in keys.items() if n > 1]
    assert doubles == [], f"ticks that ran more than once: {doubles}"
    ticks = fire_times(store, "tick")
    assert len(ticks) >= RUN_SECONDS - 10, server_cluster.logs()
    gaps = [(a, b) for a, b in itertools.pairwise(ticks) if b - a != timedelta(seconds=1)]
    assert gaps == [], f"ticks missing between {gaps}"
    jobs = store.list_jobs(task_name="acc.tick", limit=1000)
    pickers = {job.picked_by.split("/")[0] for job in jobs if job.picked_by}
    assert len(pickers) >= 2, f"the ticks should spread over the workers: {pickers}"


def test_a_worker_stopped_ten_seconds_applies_each_misfire_policy(
    server_app: Celery, server_cluster: Cluster
) -> None:
    store = ratchet_state(server_app).store
    first = server_cluster.start(
        "m1", pool="threads", concurrency=4, RATCHET_ACCEPTANCE_RECURRING="misfire"
    )
    wait_until(
        lambda: all(len(fire_times(store, p)) >= 2 for p in ("catch_up", "fire_once", "skip")),
        60,
        "first ticks",
    )
    assert first.stop(signal.SIGTERM) == 0
    due = {m["business_key"]: m["scheduled_time"] for m in store.list_masters()}
    time.sleep(10)
    server_cluster.start(
        "m2", pool="threads", concurrency=4, RATCHET_ACCEPTANCE_RECURRING="misfire"
    )
    wait_until(
        lambda: all(
            any(t > due[f"acc-{p}"] + timedelta(seconds=10) for t in fire_times(store, p))
            for p in ("catch_up", "fire_once", "skip")
        ),
        60,
        "ticks after restart",
    )
    after = {
        p: [t for t in fire_times(store, p) if t >= due[f"acc-{p}"]]
        for p in ("catch_up", "fire_once", "skip")
    }
    start = {p: due[f"acc-{p}"] for p in after}
    one = timedelta(seconds=1)
    # CATCH_UP(3): the three oldest missed ticks, then the next future one.
    assert after["catch_up"][:3] == [start["catch_up"] + k * one for k in range(3)]
    assert after["catch_up"][3] - start["catch_up"] >= 8 * one
    # FIRE_ONCE: only the oldest missed tick.
    assert after["fire_once"][0] == start["fire_once"]
    assert after["fire_once"][1] - start["fire_once"] >= 8 * one
    # SKIP: none of them.
    assert after["skip"][0] - start["skip"] >= 8 * one
    assert master_id("acc-skip") in {m["job_id"] for m in store.list_masters()}


def test_exponential_backoff_of_a_recurring_task_keeps_its_milliseconds(
    server_app: Celery, server_cluster: Cluster
) -> None:
    """``@recurring(backoff_delay_ms=500)``: retries after 0.5, 1 and 2 s, not after 1, 2 and
    4 (Celery's autoretry counts its factor in whole seconds)."""
    store = ratchet_state(server_app).store

    def runs() -> dict[str, list[list[str]]]:
        found: dict[str, list[list[str]]] = {}
        for key, _ in side_effects(store):
            kind, _, rest = key.partition("|")
            found.setdefault(kind, []).append(rest.split("|"))
        return found

    def first_done() -> str | None:
        flaky = runs().get("flaky", [])
        done = [job_id for job_id, retries, *_ in flaky if retries == "3"]
        return done[0] if done else None

    server_cluster.start("b1", concurrency=2, RATCHET_ACCEPTANCE_RECURRING="backoff")
    wait_until(lambda: first_done() is not None, 90, "an occurrence retried three times")
    server_cluster.stop_all()
    job_id = first_done()
    countdowns = sorted(
        (int(retries), float(countdown))
        for found, retries, countdown in runs()["countdown"]
        if found == job_id
    )
    assert countdowns == [(0, 0.5), (1, 1.0), (2, 2.0)], server_cluster.logs()
    tries = sorted(
        (int(retries), eta, float(began))
        for found, retries, eta, began in runs()["flaky"]
        if found == job_id
    )
    assert [retries for retries, _, _ in tries] == [0, 1, 2, 3]
    # Each retry was due its delay after the run before it began, and not before.
    for (_, _, began), (retries, due, _) in itertools.pairwise(tries):
        assert float(due) - began >= 0.5 * 2 ** (retries - 1) - 0.001
