"""The claim's rows come straight from the driver: their fields must be the statement's
columns, in its order, and its two timestamps read as the store's type reads them."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from sqlalchemy.dialects import postgresql, sqlite

from celery_ratchet.store.claim_sql import RETURNED, _ClaimedRow, to_claimed


def test_the_row_fields_are_the_claim_statements_columns_in_order() -> None:
    assert _ClaimedRow._fields == (*(n.strip() for n in RETURNED.split(",")), "claimed_now")


def _row(scheduled: object, claimed_now: object) -> list[object]:
    values: list[object] = [None] * len(_ClaimedRow._fields)
    values[_ClaimedRow._fields.index("scheduled_time")] = scheduled
    values[_ClaimedRow._fields.index("claimed_now")] = claimed_now
    return values


def test_timestamps_read_as_aware_utc_from_each_driver() -> None:
    due = datetime(2026, 12, 3, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    on_postgres = _ClaimedRow.of(_row(due, None), postgresql.dialect())
    assert on_postgres.scheduled_time == due
    assert on_postgres.scheduled_time.tzinfo == timezone.utc
    assert on_postgres.claimed_now is None
    on_sqlite = _ClaimedRow.of(
        _row("2026-12-03 10:00:00.000000", "2026-12-03 10:00:01"), sqlite.dialect()
    )
    assert on_sqlite.scheduled_time == datetime(2026, 12, 3, 10, 0, tzinfo=timezone.utc)
    assert on_sqlite.claimed_now == datetime(2026, 12, 3, 10, 0, 1, tzinfo=timezone.utc)


def test_a_claim_stamped_with_its_fence_is_the_same_claim_with_that_fence() -> None:
    job = to_claimed(_full_row(), "tok")
    assert job.decoded_headers == {"id": "j1", "task": "t"}
    stamped = job.with_fence("node:3")
    assert stamped == replace(job, fence="node:3")
    assert (stamped.fence, job.fence) == ("node:3", None)
    assert stamped.decoded_headers is job.decoded_headers


def _full_row() -> _ClaimedRow:
    values = dict.fromkeys(_ClaimedRow._fields)
    values.update(
        id=1, job_id="j1", task_name="t", queue="celery", priority=4, attempts=0, claims=1,
        scheduled_time=datetime(2026, 12, 3, tzinfo=timezone.utc), payload=b"[]",
        content_type="application/json", content_encoding="utf-8",
        headers='{"id": "j1", "task": "t"}', properties="{}", job_type="SINGLE",
    )  # fmt: skip
    return _ClaimedRow(**values)
