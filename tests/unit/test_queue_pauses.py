"""A node's reading of the paused queues: read again only when older than its bound, kept
through an outage, and each change of its own queues said once."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import pytest

from celery_ratchet.domain.job import SCHEDULES_QUEUE
from celery_ratchet.domain.queue_pause import PausedQueue, checked_name, checked_reason, claimable
from celery_ratchet.errors import InvalidArgument, StorePermissionDenied, StoreUnavailable
from celery_ratchet.runtime.queue_pauses import PausedQueues

AT = datetime(2026, 12, 6, tzinfo=timezone.utc)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def monotonic(self) -> float:
        return self.t

    def now(self) -> datetime:
        return AT

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class Store:
    def __init__(self) -> None:
        self.paused: set[str] = set()
        self.reads = 0
        self.down = False

    def paused_queues(self) -> dict[str, PausedQueue]:
        self.reads += 1
        if self.down:
            raise StoreUnavailable("the job store is unreachable")
        return {q: PausedQueue(q, AT, None) for q in self.paused}


def test_claimable_keeps_the_nodes_order_less_the_paused() -> None:
    assert claimable(["a", "b", "c"], {"b", "z"}) == ["a", "c"]


def test_read_again_only_once_older_than_the_bound(caplog: pytest.LogCaptureFixture) -> None:
    store, clock = Store(), Clock()
    pauses = PausedQueues(store, clock, max_age=1.0)
    caplog.set_level(logging.INFO, "celery_ratchet.runtime.queue_pauses")
    pauses.refresh(["emails", "celery"])
    assert store.reads == 1 and pauses.claimable(["emails", "celery"]) == ["emails", "celery"]

    store.paused = {"emails", "elsewhere"}
    clock.t += 0.5
    pauses.refresh(["emails", "celery"])
    assert store.reads == 1  # still fresh: not read
    assert pauses.claimable(["emails", "celery"]) == ["emails", "celery"]

    clock.t += 0.6
    pauses.refresh(["emails", "celery"])
    assert store.reads == 2
    assert pauses.claimable(["emails", "celery"]) == ["celery"]
    assert pauses.holds_any_of(["emails"]) and not pauses.holds_any_of(["celery"])
    clock.t += 2
    pauses.refresh(["emails", "celery"])  # unchanged: said nothing more

    store.paused = set()
    clock.t += 2
    pauses.refresh(["emails", "celery"])
    assert pauses.claimable(["emails", "celery"]) == ["emails", "celery"]
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "ratchet: paused, not claiming from: emails",
        "ratchet: resumed, claiming again from: emails",
    ]


def test_an_outage_keeps_the_last_reading_and_reads_at_the_next_claim() -> None:
    store, clock = Store(), Clock()
    store.paused = {"emails"}
    pauses = PausedQueues(store, clock, max_age=1.0)
    pauses.refresh(["emails"])
    store.down = True
    clock.t += 5
    pauses.refresh(["emails"])
    assert pauses.claimable(["emails"]) == []
    store.down, store.paused = False, set()
    pauses.refresh(["emails"])  # the failed read did not count as one
    assert pauses.claimable(["emails"]) == ["emails"]


def test_the_schedules_queue_is_not_a_queue_to_pause() -> None:
    with pytest.raises(InvalidArgument, match="ratchet schedules pause"):
        checked_name(SCHEDULES_QUEUE)


class Refusing(Store):
    """A role without SELECT on the pause table."""

    def paused_queues(self) -> dict[str, PausedQueue]:
        self.reads += 1
        raise StorePermissionDenied("permission denied for table scheduler_queue_pause")


def test_before_a_first_reading_nothing_is_claimed_and_a_refusal_is_said_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, clock = Refusing(), Clock()
    pauses = PausedQueues(store, clock, max_age=1.0)
    caplog.set_level(logging.INFO, "celery_ratchet.runtime.queue_pauses")
    for _ in range(30):
        pauses.refresh(["emails"])
        assert pauses.claimable(["emails"]) == [] and pauses.holds_any_of(["emails"])
        clock.t += 2
    assert store.reads == 30
    # Once a minute: 60 s of the 30 refusals, 2 s apart.
    assert [r.getMessage() for r in caplog.records] == [
        "ratchet: the paused queues were not read: permission denied for table "
        "scheduler_queue_pause"
    ]


def test_a_first_reading_says_which_own_queues_are_paused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, clock = Store(), Clock()
    store.paused = {"emails"}
    caplog.set_level(logging.INFO, "celery_ratchet.runtime.queue_pauses")
    pauses = PausedQueues(store, clock, max_age=1.0)
    pauses.refresh(["emails", "celery"])
    assert [r.getMessage() for r in caplog.records] == [
        "ratchet: paused, not claiming from: emails"
    ]


@pytest.mark.parametrize("name", ["emails ", " emails", "emails\t", "bad\ud800"])
def test_names_no_worker_claims_from_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        checked_name(name)
    assert refused.value.field == "queue"


def test_a_reason_with_a_lone_surrogate_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="surrogate"):
        checked_reason("relay \udc00 down")
