"""Paused queues on the three databases: pausing twice keeps the first pause, resuming wakes
the queue's listeners, and bad names and reasons are refused with nothing written."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text

from celery_ratchet.errors import InvalidArgument, SchemaMissing
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.metrics_reads import MetricsReads
from celery_ratchet.store.schema import scheduler_queue_pause


def test_a_pause_is_kept_until_resumed(store: JobStore) -> None:
    assert store.paused_queues() == {}
    assert store.pause_queue("emails", "smtp down, ops") is True
    first = store.paused_queues()["emails"]
    assert (first.queue, first.reason) == ("emails", "smtp down, ops")
    now = store.database_time() or datetime.now(timezone.utc)
    assert abs(first.paused_at - now) < timedelta(seconds=30)

    # Paused again: the first pause and its reason stand.
    assert store.pause_queue("emails", "another reason") is False
    assert store.paused_queues() == {"emails": first}

    assert store.pause_queue("reports") is True
    assert sorted(store.paused_queues()) == ["emails", "reports"]
    assert store.paused_queues()["reports"].reason is None

    assert store.resume_queue("emails") is True
    assert store.resume_queue("emails") is False
    assert sorted(store.paused_queues()) == ["reports"]


@pytest.mark.parametrize(
    ("queue", "reason", "field"),
    [
        ("", None, "queue"),
        ("   ", None, "queue"),
        ("q" * 256, None, "queue"),
        ("bad\x00name", None, "queue"),
        ("emails", "r" * 256, "reason"),
        ("emails", "nul\x00reason", "reason"),
    ],
)
def test_bad_names_and_reasons_are_refused_and_nothing_is_written(
    store: JobStore, queue: str, reason: str | None, field: str
) -> None:
    with pytest.raises(InvalidArgument) as refused:
        store.pause_queue(queue, reason)
    assert refused.value.field == field
    assert "\x00" not in str(refused.value) and "r" * 256 not in str(refused.value)
    assert store.paused_queues() == {}


def test_the_longest_name_and_reason_and_any_script_are_kept(store: JobStore) -> None:
    name = "очередь-" + "名" * 247
    reason = "paused by Zoë 🛑 " + "x" * (255 - len("paused by Zoë 🛑 "))
    assert len(name) == 255 and len(reason) == 255
    assert store.pause_queue(name, reason)
    kept = store.paused_queues()[name]
    assert kept.reason == reason
    assert store.resume_queue(name)


def test_tables_of_a_version_before_pauses_have_none_and_say_how_to_add_them(
    store: JobStore,
) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("DROP TABLE scheduler_queue_pause"))
    try:
        assert store.paused_queues() == {}
        reading = MetricsReads(store).read(window_seconds=60, limit=10, bounds=(1.0,))
        assert reading.paused == {}
        with pytest.raises(SchemaMissing, match="schema apply"):
            store.pause_queue("emails")
    finally:
        with store.engine.begin() as conn:
            scheduler_queue_pause.create(conn)
