"""OpenTelemetry's own Celery instrumentation, unchanged, on a ratchet app: the span of a
send and the span of the run it caused are in one trace, the context carried in the job
row's stored headers; so are retries, chain steps and a group's members; each recurring
tick is a trace of its own. An in-process worker, spans kept in memory."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, chain, group
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import celery_ratchet
from tests.conftest import Servers, empty_store
from tests.helpers import wait_until
from tests.integration.conftest import BrokerTrap, make_app, worker_running
from tests.integration.tasks import RUNS

TIMEOUT = 30
SEND = trace.SpanKind.PRODUCER
RUN = trace.SpanKind.CONSUMER


class Traced:
    def __init__(self, app: Celery, provider: TracerProvider) -> None:
        self.app = app
        self.exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = provider.get_tracer("tests")

    def spans(self, task_id: str) -> list[ReadableSpan]:
        """Every finished span of ``task_id`` (its sends and its runs), oldest first."""
        found = [
            s
            for s in self.exporter.get_finished_spans()
            if (s.attributes or {}).get("messaging.message.id") == task_id
        ]
        return sorted(found, key=lambda s: s.start_time or 0)

    def runs(self, task_name: str) -> list[ReadableSpan]:
        return [
            s
            for s in self.exporter.get_finished_spans()
            if s.kind is RUN and s.name == f"run/{task_name}"
        ]


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "mysql"])
def traced(
    request: pytest.FixtureRequest, servers: Servers, broker_trap: BrokerTrap
) -> Iterator[Traced]:
    provider = TracerProvider()
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        app = make_app(
            empty_store(servers.url(request.param)).url,
            broker_trap.url,
            ratchet_poll_interval=0.1,
        )
        key = f"traced-tick-{request.param}"

        @celery_ratchet.recurring(cron="* * * * * ?", id=key)
        @app.task(name="t.traced_tick", bind=True, shared=False)
        def traced_tick(self: Any) -> None:
            RUNS[key].append(self.request.id)

        @app.task(name="t.traced_flaky", bind=True, shared=False)
        def traced_flaky(self: Any, failures: int) -> str:
            if self.request.retries == 0:
                SENT[self.request.id].wait(TIMEOUT)
            if self.request.retries < failures:
                raise self.retry(countdown=0.1, exc=RuntimeError(f"try {self.request.retries}"))
            return f"done after {self.request.retries}"

        app.conf.tick_key = key
        traced = Traced(app, provider)
        # One slot: OpenTelemetry's instrumentation keeps one open span per task id, so a
        # retry that starts on a second slot before the try that raised it has sent
        # task_postrun (its countdown is 0.1 s; a busy machine stalls a thread longer)
        # replaces that try's span and both are lost. Stock Celery has the same race.
        with worker_running(app, concurrency=1):
            yield traced
    finally:
        instrumentor.uninstrument()


def _trace_ids(spans: list[ReadableSpan]) -> set[int]:
    return {s.context.trace_id for s in spans if s.context is not None}


def _parent_of(span: ReadableSpan, among: list[ReadableSpan]) -> ReadableSpan:
    assert span.parent is not None, f"{span.name} has no parent"
    [parent] = [s for s in among if s.context and s.context.span_id == span.parent.span_id]
    return parent


def test_delay_and_its_run_are_one_trace(traced: Traced) -> None:
    result = traced.app.tasks["t.add"].delay(2, 3)
    assert result.get(timeout=TIMEOUT) == 5
    wait_until(lambda: len(traced.spans(result.id)) == 2, TIMEOUT, "the send and run spans")
    sent, ran = traced.spans(result.id)
    assert (sent.kind, sent.name) == (SEND, "apply_async/t.add")
    assert (ran.kind, ran.name) == (RUN, "run/t.add")
    assert ran.context.trace_id == sent.context.trace_id
    assert ran.parent is not None and ran.parent.span_id == sent.context.span_id


def test_a_send_inside_a_span_joins_the_callers_trace(traced: Traced) -> None:
    with traced.tracer.start_as_current_span("web request") as outer:
        result = traced.app.tasks["t.add"].delay(1, 1)
    assert result.get(timeout=TIMEOUT) == 2
    wait_until(lambda: len(traced.spans(result.id)) == 2, TIMEOUT, "the send and run spans")
    assert _trace_ids(traced.spans(result.id)) == {outer.get_span_context().trace_id}


#: Set once the test's send of a task id has returned. OpenTelemetry's instrumentation keeps
#: one open send span per task id, closed by after_task_publish in the sending thread: a
#: retry sent (same id) by the worker before that would take the slot over, and the test
#: thread's send span would stay current for every test after it.
SENT: dict[str, threading.Event] = {}


def test_each_retry_runs_in_the_trace_of_the_first_send(traced: Traced) -> None:
    task_id = uuid.uuid4().hex
    SENT[task_id] = threading.Event()
    result = traced.app.tasks["t.traced_flaky"].apply_async((2,), task_id=task_id)
    SENT[task_id].set()
    assert result.get(timeout=TIMEOUT) == "done after 2"
    wait_until(lambda: len(traced.spans(result.id)) >= 6, TIMEOUT, "three sends, three runs")
    spans = traced.spans(result.id)
    assert [s.kind for s in spans] == [SEND, RUN, SEND, RUN, SEND, RUN]
    assert len(_trace_ids(spans)) == 1
    # Each run is the child of the send that scheduled it; each retry's send, of the run
    # that raised Retry.
    for i in (1, 3, 5):
        assert _parent_of(spans[i], spans) is spans[i - 1]
    for i in (2, 4):
        assert _parent_of(spans[i], spans) is spans[i - 1]


def test_a_chain_is_one_trace(traced: Traced) -> None:
    add = traced.app.tasks["t.add"]
    result = chain(add.s(1, 1), add.s(10), add.s(100)).delay()
    assert result.get(timeout=TIMEOUT) == 112
    ids = [result.parent.parent.id, result.parent.id, result.id]
    wait_until(
        lambda: all(any(s.kind is RUN for s in traced.spans(i)) for i in ids),
        TIMEOUT,
        "a run span of each step",
    )
    spans = [s for i in ids for s in traced.spans(i)]
    assert len(_trace_ids(spans)) == 1
    first_send = min(spans, key=lambda s: s.start_time or 0)
    assert first_send.kind is SEND and first_send.parent is None


@pytest.mark.parametrize("members", ["list", "generator"])
def test_a_group_is_one_trace_and_leaves_no_span_current(traced: Traced, members: str) -> None:
    add = traced.app.tasks["t.add"]
    signatures = (add.s(i, i) for i in range(4))
    with traced.tracer.start_as_current_span("fan out") as outer:
        result = group(list(signatures) if members == "list" else signatures).apply_async()
        # The members' send spans are over once the group is stored: none stays current.
        assert trace.get_current_span() is outer
    assert trace.get_current_span() is trace.INVALID_SPAN
    assert result.get(timeout=TIMEOUT) == [0, 2, 4, 6]
    ids = [r.id for r in result.results]
    wait_until(lambda: all(len(traced.spans(i)) == 2 for i in ids), TIMEOUT, "each member's spans")
    for member in ids:
        sent, ran = traced.spans(member)
        assert _parent_of(sent, [outer]) is outer, "each member's send is the caller's child"
        assert _parent_of(ran, [sent]) is sent
    assert _trace_ids([s for i in ids for s in traced.spans(i)]) == {
        outer.get_span_context().trace_id
    }


def test_each_recurring_tick_is_a_trace_of_its_own(traced: Traced) -> None:
    key = traced.app.conf.tick_key
    wait_until(lambda: len(RUNS.get(key, [])) >= 3, TIMEOUT, "three ticks")
    wait_until(lambda: len(traced.runs("t.traced_tick")) >= 3, TIMEOUT, "their run spans")
    ticks = traced.runs("t.traced_tick")
    assert len(_trace_ids(ticks)) == len(ticks), "two ticks share a trace"
    # Each tick's run is the child of the tick's own send, made where the worker fired it
    # (as beat's sends are), which begins its trace: not the schedule's registration.
    for run in ticks:
        sent = _parent_of(run, traced.spans((run.attributes or {})["messaging.message.id"]))
        assert (sent.kind, sent.name, sent.parent) == (SEND, "apply_async/t.traced_tick", None)


def test_registering_a_schedule_leaves_no_span_current(traced: Traced) -> None:
    key = f"registered-{uuid.uuid4().hex[:6]}"
    celery_ratchet.schedule_recurring(
        traced.app, "0 0 0 1 1 ?", "UTC", traced.app.tasks["t.mark"].si(key), business_key=key
    )
    try:
        assert trace.get_current_span() is trace.INVALID_SPAN
    finally:
        celery_ratchet.cancel_recurring(traced.app, key)
