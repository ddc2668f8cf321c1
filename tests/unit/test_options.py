"""Ratchet's per-job options: validation, task-attribute defaults, their place in the message."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from celery_ratchet.celery.send.options import HEADER, apply_to_message, resolve
from celery_ratchet.errors import ConfigurationError, InvalidJob
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
        ({"timeout": 0}, "timeout must be a finite number of seconds, more than 0"),
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


@pytest.mark.parametrize(
    ("given", "field", "error"),
    [
        ({"backoff_param": float("nan")}, "backoff_param", r"finite number of seconds.*nan"),
        ({"backoff_param": "inf"}, "backoff_param", "finite number of seconds"),
        ({"backoff_param": -1}, "backoff_param", "0 or more"),
        ({"timeout": float("nan")}, "timeout", r"finite number of seconds, more than 0.*nan"),
        ({"timeout": "soon"}, "timeout", "finite number of seconds"),
        ({"max_retries": -1}, "max_retries", "whole number, 0 or more; got -1"),
        ({"max_retries": 2.5}, "max_retries", "whole number"),
        ({"max_retries": float("nan")}, "max_retries", "whole number"),
        ({"tags": "abc"}, "tags", r"list of strings, got str 'abc'; write tags=\['abc'\]"),
        ({"tags": ["a,b"]}, "tags", "no comma"),
        ({"tags": [""]}, "tags", "non-empty"),
        ({"tags": [3]}, "tags", "non-empty string"),
        ({"priority": -1}, "priority", "0-9"),
    ],
)
def test_options_that_cannot_be_honoured_are_refused_naming_the_field(
    given: dict[str, object], field: str, error: str
) -> None:
    with pytest.raises(InvalidJob, match=error) as raised:
        resolve("shop.pay", None, given, SETTINGS)
    assert raised.value.field == field
    assert "shop.pay" in str(raised.value)


def test_good_counts_and_tags_pass() -> None:
    options = resolve(
        "shop.pay", None, {"max_retries": 0, "tags": ("a", "b"), "backoff_param": 0}, SETTINGS
    )
    assert options == {"max_retries": 0, "tags": ["a", "b"], "backoff_param": 0.0}
