"""Nodes whose clocks are off (libfaketime on a real process): a countdown, a retry's
countdown and a schedule's first fire time are reckoned on the database's clock, and a
worker whose clock is off says by how much."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import select

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.runtime.recurring import master_id
from celery_ratchet.store.db_clock import db_now
from celery_ratchet.store.job_rows import job
from tests.acceptance.app import RETRY_LATER_SECONDS, retried_later
from tests.acceptance.conftest import ROOT, Cluster
from tests.helpers import wait_until

pytestmark = pytest.mark.slow

#: Where the sitecustomize of a process under libfaketime is.
SITE = Path(__file__).resolve().parent / "faketime_site"

LIBFAKETIME = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)


@pytest.fixture
def faketime() -> Iterator[str]:
    """The libfaketime library (the faketime package); CI installs it, elsewhere its tests
    skip without it."""
    found = next((p for p in LIBFAKETIME if Path(p).exists()), None)
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("libfaketime is missing (apt-get install faketime): .ci/run installs it")
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    yield found


def skewed(library: str, offset: str) -> dict[str, str]:
    """The environment of a process whose wall clock is ``offset`` off ("-300", "+600"); its
    monotonic clock is left alone."""
    return {
        "PYTHONPATH": f"{SITE}{os.pathsep}{ROOT}",
        "LD_PRELOAD": library,
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def database_time(app: Celery) -> datetime:
    with ratchet_state(app).store.engine.connect() as conn:
        now: datetime = conn.execute(select(db_now())).scalar_one()
    return now


def due_time(app: Celery, job_id: str) -> datetime | None:
    with ratchet_state(app).store.engine.connect() as conn:
        due: datetime | None = conn.execute(
            select(job.c.scheduled_time).where(job.c.job_id == job_id)
        ).scalar_one_or_none()
    return due


def run_skewed(app: Celery, library: str, offset: str, *argv: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "tests.acceptance.skewed_node", *argv],
        cwd=ROOT,
        env={
            **os.environ,
            "RATCHET_URL": ratchet_state(app).settings.url,
            **skewed(library, offset),
        },
        check=True,
        timeout=120,
    )


def test_a_countdown_from_a_slow_client_counts_from_the_database_time(
    server_app: Celery, faketime: str
) -> None:
    before = database_time(server_app)
    run_skewed(server_app, faketime, "-300", "countdown", "slow-client", "60")
    due = due_time(server_app, "slow-client")
    assert due is not None
    # Its clock five minutes slow made it due four minutes before it was sent.
    assert due >= before + timedelta(seconds=60), (before, due)
    assert due <= database_time(server_app) + timedelta(seconds=60), (before, due)


@pytest.mark.parametrize(("offset", "every"), [("+600", "every"), ("-720", "cron")])
def test_a_schedule_registered_by_a_node_off_by_minutes_fires_next_on_the_database_time(
    server_app: Celery, faketime: str, offset: str, every: str
) -> None:
    before = database_time(server_app)
    schedule = "60" if every == "every" else "0 * * * * ?"
    run_skewed(server_app, faketime, offset, "schedule", "skewed", every, schedule)
    due = due_time(server_app, master_id("skewed"))
    assert due is not None
    # Ten minutes fast put the first tick ten minutes out; twelve minutes slow made twelve
    # past minutes' ticks due at once.
    assert before < due <= database_time(server_app) + timedelta(seconds=60), (before, due)


def test_a_slow_worker_retries_on_the_database_time_and_says_how_slow_it_is(
    server_app: Celery, server_cluster: Cluster, faketime: str
) -> None:
    worker = server_cluster.start("slow", pool="threads", concurrency=1, **skewed(faketime, "-300"))
    before = database_time(server_app)
    retried_later.apply_async(("slow-worker",), task_id="slow-worker")
    sent = due_time(server_app, "slow-worker")
    wait_until(
        lambda: due_time(server_app, "slow-worker") != sent, 60, "the retry rescheduled the job"
    )
    due = due_time(server_app, "slow-worker")
    assert due is not None
    assert due >= before + timedelta(seconds=RETRY_LATER_SECONDS), (before, due)
    warned = re.search(r"this node's clock is ([0-9.]+)s behind", server_cluster.whole_logs())
    assert warned is not None, server_cluster.logs()
    assert abs(float(warned.group(1)) - 300) < 5, warned.group(0)
    worker.stop()
