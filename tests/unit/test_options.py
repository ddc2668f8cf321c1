"""Ratchet's per-job options: validation, task-attribute defaults, their place in the message."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from celery_ratchet.celery.options import HEADER, apply_to_message, resolve
from celery_ratchet.errors import ConfigurationError
from celery_ratchet.settings import RatchetSettings

SETTINGS = RatchetSettings(resources={"payments": 2})
TASK = SimpleNamespace(resource="payments", backoff="Fixed", backoff_param=2, timeout=None)


def test_call_options_override_task_attributes_and_are_normalised() -> None:
    options = resolve("shop.pay", TASK, {"backoff_param": "5", "priority": "high"}, SETTINGS)
    assert options == {
        "resource": "payments", "backoff": "fixed", "backoff_param": 5.0, "priority": 6,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("given", "error"),
    [
        ({"resorce": "payments"}, "unknown ratchet option"),
        ({"backoff": "linear"}, "none, fixed, exponential"),
        ({"timeout": 0}, "timeout must be positive"),
        ({"priority": "urgent"}, "priority"),
        ({"resource": "ledger"}, "ratchet_resources"),
    ],
)
def test_bad_options_are_refused_with_what_to_do(given: dict[str, object], error: str) -> None:
    with pytest.raises((ValueError, ConfigurationError), match=error):
        resolve("shop.pay", None, given, SETTINGS)


def test_timeout_becomes_the_hard_time_limit_unless_one_was_given() -> None:
    headers: dict[str, object] = {"timelimit": [None, 3]}
    properties: dict[str, object] = {"priority": 4}
    apply_to_message({"timeout": 30.0, "priority": 8}, headers, properties)
    assert headers["timelimit"] == [30.0, 3] and properties["priority"] == 8
    assert headers[HEADER] == {"timeout": 30.0, "priority": 8}  # a retry copies them
    explicit: dict[str, object] = {"timelimit": [10, None]}
    apply_to_message({"timeout": 30.0}, explicit, {})
    assert explicit["timelimit"] == [10, None]
