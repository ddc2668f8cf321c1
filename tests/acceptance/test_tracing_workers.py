"""docs/tracing.md's set-up on a real prefork worker (``-P ratchet``): the sender's send span and
the run span a pool process wrote to its file are in one trace, the context carried in the job
row; a retried job's attempts too; each recurring tick, fired by the worker's main process, is
a trace of its own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import format_trace_id

from celery_ratchet.celery.state import ratchet_state
from tests.acceptance.conftest import Worker
from tests.acceptance.traced_app import app
from tests.conftest import Servers, empty_store
from tests.helpers import wait_until

pytestmark = pytest.mark.slow
TIMEOUT = 60


@pytest.fixture
def sender() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield exporter
    finally:
        instrumentor.uninstrument()


def _written(spans_dir: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in spans_dir.glob("spans-*.jsonl")
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def _runs(spans_dir: Path, task_id: str) -> list[dict[str, Any]]:
    return [
        s
        for s in _written(spans_dir)
        if s["name"].startswith("run/") and s["attributes"].get("messaging.message.id") == task_id
    ]


def _ticks(spans_dir: Path) -> list[dict[str, Any]]:
    return [s for s in _written(spans_dir) if s["name"] == "run/traced.tick"]


@pytest.mark.parametrize("dialect", ["postgresql"])
def test_a_prefork_worker_runs_each_send_in_the_senders_trace(
    servers: Servers, dialect: str, sender: InMemorySpanExporter, tmp_path: Path
) -> None:
    url = empty_store(servers.url(dialect)).url
    app.conf.ratchet_url = url
    ratchet_state(app).reset()
    spans_dir = tmp_path / "spans"
    spans_dir.mkdir()
    worker = Worker(
        url,
        "traced",
        tmp_path / "worker.log",
        app_module="tests.acceptance.traced_app",
        concurrency=2,
        TRACED_SPANS_DIR=str(spans_dir),
    )
    try:
        added = app.tasks["traced.add"].delay(2, 3)
        retried = app.tasks["traced.flaky"].delay(1)
        assert added.get(timeout=TIMEOUT) == 5
        assert retried.get(timeout=TIMEOUT) == 1
        wait_until(
            lambda: _runs(spans_dir, added.id) and len(_runs(spans_dir, retried.id)) == 2,
            TIMEOUT,
            "the pool processes' run spans",
        )
        sent = {
            (s.attributes or {}).get("messaging.message.id"): format_trace_id(s.context.trace_id)
            for s in sender.get_finished_spans()
            if s.name.startswith("apply_async/") and s.context is not None
        }
        for task_id in (added.id, retried.id):
            traces = {r["context"]["trace_id"] for r in _runs(spans_dir, task_id)}
            assert traces == {"0x" + sent[task_id]}, (task_id, traces, sent)
        # A tick fired before the main process was instrumented (worker_ready) has no send
        # span: its run is the root of its trace. The later ones are children of their own.
        wait_until(
            lambda: len([t for t in _ticks(spans_dir) if t["parent_id"] is not None]) >= 2,
            TIMEOUT,
            "two ticks' run spans, each under its send span",
        )
        ticks = _ticks(spans_dir)
        assert len({t["context"]["trace_id"] for t in ticks}) == len(ticks), "ticks share a trace"
    finally:
        assert worker.stop() == 0, worker.log.read_text()[-4000:]
