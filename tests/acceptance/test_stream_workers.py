"""Streaming batches with real processes, on PostgreSQL and MariaDB: a producer process
streams, ``celery worker`` processes run the children. 200,000 items are measured by
bench/stream.py; here smaller counts, the same paths."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import func, select

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.batch import BatchKind, BatchState
from celery_ratchet.store.schema import scheduler_job
from tests.acceptance.conftest import ROOT, Cluster, Worker, side_effects
from tests.helpers import wait_until

pytestmark = pytest.mark.slow

APP = "tests.acceptance.stream_app"
TIMEOUT = 240


def produce(url: str, count: int, *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", APP, str(count), *options],
        cwd=ROOT,
        env={**os.environ, "RATCHET_URL": url, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def produced(url: str, count: int, *options: str) -> dict[str, Any]:
    process = produce(url, count, *options)
    out, err = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0, err
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return report


def start_workers(cluster: Cluster, count: int) -> None:
    for i in range(count):
        name = f"stream{i}"
        cluster.workers.append(
            Worker(cluster.url, name, cluster.tmp / f"{name}.log", app_module=APP)
        )


def rows_of(app: Celery, batch_id: str) -> int:
    with ratchet_state(app).store.engine.connect() as conn:
        stmt = select(func.count()).where(scheduler_job.c.group_id == batch_id)
        return int(conn.execute(stmt).scalar_one())


def outcomes(app: Celery, prefix: str) -> list[str]:
    return [key for key, _ in side_effects(ratchet_state(app).store) if key.startswith(prefix)]


@pytest.mark.parametrize("chunked", [False, True], ids=["one-child-per-item", "chunked"])
def test_every_item_of_a_stream_runs_once_and_the_batch_succeeds_once(
    server_app: Celery, server_cluster: Cluster, chunked: bool
) -> None:
    count = 20_000 if chunked else 3_000
    start_workers(server_cluster, 2)
    options = ("--chunk-size", "500", *(("--chunked",) if chunked else ()))
    report = produced(server_cluster.url, count, *options)
    assert (report["items"], report["children"]) == (count, count // 500 if chunked else count)
    wait_until(lambda: outcomes(server_app, "done:"), TIMEOUT, "the success callback")
    items = Counter(outcomes(server_app, "item-"))
    assert len(items) == count and set(items.values()) == {1}, server_cluster.logs()
    children = report["children"]
    assert outcomes(server_app, "done:") == [f"done:{children}:{children}:0"]
    summary = ratchet_state(server_app).batches.summaries(batch_id=report["batch_id"])[0]
    assert (summary.state, summary.total, summary.done) == (
        BatchState.SUCCEEDED,
        children,
        children,
    )


def test_the_producers_memory_does_not_grow_with_the_stream(server_app: Celery) -> None:
    url = server_app.conf.ratchet_url
    small = produced(url, 2_000)
    large = produced(url, 20_000)  # no worker runs: the children stay in the store
    assert rows_of(server_app, large["batch_id"]) == 20_000
    grown = large["peak_rss_kb"] - small["peak_rss_kb"]
    # One chunk is held at a time; ten times the items may not cost a chunk's worth more.
    assert grown < 8 * 1024, (small, large)


def test_a_producer_killed_mid_stream_leaves_a_failed_batch_with_the_count(
    server_app: Celery, server_cluster: Cluster
) -> None:
    start_workers(server_cluster, 1)  # its housekeeping finds the lease run out
    batches = ratchet_state(server_app).batches
    producer = produce(
        server_cluster.url, 0, "--chunk-size", "100", "--pace", "0.002", "--lease", "3"
    )

    found: list[str] = []

    def streaming() -> bool:
        for s in batches.summaries(state=BatchState.OPEN, limit=10):
            if s.kind is BatchKind.STREAM and s.written >= 300:
                found.append(s.batch_id)
                return True
        return False

    try:
        wait_until(streaming, TIMEOUT, "three chunks to be written")
    finally:
        producer.send_signal(signal.SIGKILL)
        producer.communicate(timeout=60)
    batch_id = found[0]
    wait_until(
        lambda: batches.summaries(batch_id=batch_id)[0].state is BatchState.FAILED,
        TIMEOUT,
        "the abandoned stream to be failed",
    )
    failed = batches.summaries(batch_id=batch_id)[0]
    written = rows_of(server_app, batch_id)
    assert failed.total is None and failed.written == written >= 300
    wait_until(lambda: outcomes(server_app, "failed:"), TIMEOUT, "the failure callback")
    assert outcomes(server_app, "failed:") == [f"failed:{written}:None"]
    # The children that were written still run, each once.
    wait_until(lambda: len(outcomes(server_app, "item-")) >= written, TIMEOUT, "the children")
    assert Counter(outcomes(server_app, "item-")) == Counter(f"item-{n}" for n in range(written))
