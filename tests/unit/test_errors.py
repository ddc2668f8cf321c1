"""celery_ratchet's errors as a task's failure: stored by a result backend (Celery's JSON form,
or pickle) and rebuilt where the result is read, each is the same error with its own message."""

from __future__ import annotations

import json
import pickle

import pytest
from celery import Celery

from celery_ratchet import errors
from celery_ratchet.celery.results.backend import exception_record
from celery_ratchet.errors import (
    CompressedPayloadTooLarge,
    DuplicateJob,
    InvalidArgument,
    InvalidJob,
    MessageTooLarge,
    PayloadTooLarge,
    PredicateNotAllowed,
    RatchetError,
    SerializerNotAllowed,
    StreamAbandoned,
)
from celery_ratchet.runtime.dlq import exception_line as shown_in_dlq

ERRORS = {
    "duplicate id": DuplicateJob("job-1"),
    "held key": DuplicateJob("job-1", business_key="order-42"),
    "held key, reason": DuplicateJob("job-1", business_key="order-42", reason="send it later"),
    "payload": PayloadTooLarge("shop.charge", 70_000, 64),
    "message": MessageTooLarge("shop.charge", 20 * 2**20, 16 * 2**20),
    "compressed": CompressedPayloadTooLarge("shop.charge", 64 * 64 * 1024, 64),
    "serializer": SerializerNotAllowed("pickle"),
    "invalid": InvalidJob("queue", "queue name is over 200 characters"),
    "argument": InvalidArgument("queue", "the queue is 300 characters long; at most 255 are kept"),
    "predicate": PredicateNotAllowed("os:system"),
    "stream": StreamAbandoned("batch-1", 30.0),
    "plain": RatchetError("the store said no"),
}


def test_every_error_made_from_fields_is_tried_here() -> None:
    made_from_fields = {
        kind
        for kind in vars(errors).values()
        if isinstance(kind, type) and issubclass(kind, RatchetError) and "__init__" in vars(kind)
    }
    assert made_from_fields <= {type(exc) for exc in ERRORS.values()}


def celery_json_round_trip(exc: BaseException) -> BaseException:
    backend = Celery("errors", backend="cache+memory://", set_as_current=False).backend
    stored = json.loads(json.dumps(backend.prepare_exception(exc, "json")))
    rebuilt: BaseException = backend.exception_to_python(stored)
    return rebuilt


@pytest.mark.parametrize("name", sorted(ERRORS))
@pytest.mark.parametrize(
    "round_trip",
    [celery_json_round_trip, lambda exc: pickle.loads(pickle.dumps(exc))],
    ids=["celery json", "pickle"],
)
def test_a_stored_error_is_rebuilt_with_its_own_message(name: str, round_trip: object) -> None:
    exc = ERRORS[name]
    rebuilt = round_trip(exc)  # type: ignore[operator]
    assert type(rebuilt) is type(exc)
    assert str(rebuilt) == str(exc)
    assert rebuilt.args == exc.args


def test_a_duplicate_job_rebuilt_names_the_holder_and_not_its_business_key() -> None:
    exc = DuplicateJob("job-1", business_key="order-42")
    assert exc.business_key == "order-42"
    for rebuilt in (celery_json_round_trip(exc), pickle.loads(pickle.dumps(exc))):
        assert isinstance(rebuilt, DuplicateJob)
        assert rebuilt.job_id == "job-1"
        assert rebuilt.business_key is not None  # held by a key, which is not kept
        assert "order-42" not in repr(rebuilt) + str(rebuilt) + repr(rebuilt.__dict__)
    assert "order-42" not in exception_record(exc)
    assert DuplicateJob("job-1").business_key is None


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_the_store_keeps_a_failure_that_rebuilds_and_shows_its_own_message(name: str) -> None:
    exc = ERRORS[name]
    record = exception_record(exc)
    backend = Celery("errors", backend="cache+memory://", set_as_current=False).backend
    rebuilt = backend.exception_to_python(json.loads(record))
    assert (type(rebuilt), str(rebuilt)) == (type(exc), str(exc))
    assert shown_in_dlq(record) == f"{type(exc).__name__}: {exc}"
