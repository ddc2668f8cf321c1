"""Pieces of the dashboard that need no store: the workers' replies as kombu encodes them,
tracebacks read into frames, errors, durations, the charts."""

from __future__ import annotations

import re

from celery_ratchet.web import charts
from celery_ratchet.web.failures import exception_of, traceback_of
from celery_ratchet.web.templating import duration
from celery_ratchet.web.workers import decode


def test_a_workers_reply_keeps_the_values_kombu_tagged() -> None:
    reply = '{"w1@h": {"ok": "pool will grow", "at": {"__type__": "datetime", "__value__": "x"}}}'
    assert decode(reply) == {"w1@h": {"ok": "pool will grow", "at": "x"}}


def test_a_traceback_is_its_frames_with_the_libraries_set_apart() -> None:
    found = traceback_of(
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.11/site-packages/celery/app/trace.py", line 453, in trace\n'
        "    R = fun()\n"
        '  File "/srv/shop/tasks.py", line 12, in charge\n'
        "    raise ValueError('declined')\n"
        "ValueError: declined\n"
    )
    assert found is not None
    [library, own] = found.frames
    assert library.library and not own.library
    assert (own.file, own.line, own.where, own.code) == (
        "/srv/shop/tasks.py",
        12,
        "charge",
        ["raise ValueError('declined')"],
    )
    assert found.parts[-1] == "ValueError: declined"
    assert traceback_of(None) is None


def test_an_error_record_is_its_type_and_message() -> None:
    shown = exception_of('{"exc_type": "KeyError", "exc_message": ["x"], "exc_module": "builtins"}')
    assert shown is not None and (shown.kind, shown.message, shown.module) == (
        "KeyError",
        "x",
        None,
    )
    plain = exception_of("not json at all")
    assert plain is not None and plain.message == "not json at all"


def test_durations_read_as_a_person_says_them() -> None:
    assert [duration(s) for s in (None, 0.421, 12.34, 252, 7500, 200000)] == [
        "",
        "0.42 s",
        "12.3 s",
        "4 min 12 s",
        "2 h 05 min",
        "2.3 d",
    ]


def test_stacked_bars_scale_to_the_tallest_stack_of_counts_only() -> None:
    spans = [
        charts.Span("a", {"succeeded": 3, "failed": 1, "run_avg": 900.0}),
        charts.Span("b", {"succeeded": 1}),
    ]
    svg = charts.stacked_bars(spans, label="ended", unit="/min")
    assert "max 4 /min" in svg
    assert re.findall(r'data-succeeded="(\d+)"', svg) == ["3", "1"]
