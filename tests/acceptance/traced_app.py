"""A ratchet app traced as docs/tracing.md says: OpenTelemetry's Celery instrumentation in each
pool process once forked (worker_process_init) and in the main process once the pool is
(worker_ready); spans written to TRACED_SPANS_DIR, one JSON object a line, a file per process."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, signals
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

import celery_ratchet

app = Celery("traced", task_cls="celery_ratchet:RatchetTask")
app.conf.broker_url = "amqp://guest:guest@127.0.0.1:1//"
app.conf.ratchet_poll_interval = 0.2


def _one_line(span: ReadableSpan) -> str:
    return span.to_json(indent=None) + "\n"


def start_tracing() -> None:
    spans = open(  # noqa: SIM115  (the exporter writes to it for the process's life)
        os.path.join(os.environ["TRACED_SPANS_DIR"], f"spans-{os.getpid()}.jsonl"), "a"
    )
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(ConsoleSpanExporter(out=spans, formatter=_one_line))
    )
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument()


@signals.worker_process_init.connect(weak=False)
def trace_pool_process(**kwargs: Any) -> None:
    start_tracing()


@signals.worker_ready.connect(weak=False)
def trace_main_process(**kwargs: Any) -> None:
    start_tracing()


@app.task(name="traced.add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="traced.flaky", bind=True, max_retries=3)
def flaky(self: Any, failures: int) -> int:
    if self.request.retries < failures:
        raise self.retry(countdown=0.1)
    return int(self.request.retries)


@celery_ratchet.recurring(cron="* * * * * ?", id="traced-tick")
@app.task(name="traced.tick")
def tick() -> None:
    pass
