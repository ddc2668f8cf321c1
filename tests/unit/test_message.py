"""Celery messages become job rows and back without losing what Celery needs."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kombu.exceptions import DecodeError, EncodeError
from kombu.message import Message as KombuMessage
from kombu.serialization import dumps, register, register_yaml
from kombu.serialization import loads as kombu_loads
from kombu.utils import json as kjson

from celery_ratchet.celery.execution.job_message import JobMessage
from celery_ratchet.celery.send import message as message_module
from celery_ratchet.celery.send.message import (
    CLAIM_HEADER,
    check_serializer,
    job_from_message,
    parse_time,
    safe_accept,
)
from celery_ratchet.domain.job import ClaimedJob, JobStatus
from celery_ratchet.errors import MessageTooLarge, PayloadTooLarge, SerializerNotAllowed

UTC = timezone.utc


def _job(**overrides):  # type: ignore[no-untyped-def]
    headers = {
        "id": "abc",
        "task": "shop.charge",
        "eta": None,
        "expires": None,
        "retries": 2,
        "root_id": "root",
        "parent_id": "parent",
        "group": "g",
        CLAIM_HEADER: "stale",
    }
    options = dict(
        headers=headers,
        properties={"correlation_id": "abc"},
        body=((1, "a"), {"k": "v"}, {"callbacks": None}),
        queue="payments",
        serializer="json",
        compression=None,
        default_priority=4,
        max_payload_kb=100,
        allow_pickle=False,
        timezone_=UTC,
    )
    options.update(overrides)
    return job_from_message(**options)


def test_a_message_becomes_a_row() -> None:
    job = _job()
    assert (job.job_id, job.task_name, job.queue, job.priority, job.attempts) == (
        "abc",
        "shop.charge",
        "payments",
        4,
        2,
    )
    assert (job.root_id, job.parent_id, job.group_id, job.due) == ("root", "parent", "g", None)
    assert json.loads(job.message.payload) == [[1, "a"], {"k": "v"}, {"callbacks": None}]
    assert CLAIM_HEADER not in json.loads(job.message.headers)
    # The row has the default; the message keeps what the sender gave (none), as stock's.
    assert json.loads(job.message.properties).get("priority") is None


def test_eta_and_expires_are_stored_as_utc() -> None:
    eta = datetime(2026, 3, 29, 1, 30, tzinfo=ZoneInfo("Europe/Paris"))
    job = _job(
        headers={"id": "x", "task": "t", "eta": eta.isoformat(), "expires": "2026-03-29T02:00:00"},
        timezone_=ZoneInfo("Europe/Paris"),
    )
    assert job.due == datetime(2026, 3, 29, 0, 30, tzinfo=UTC)
    # A naive time is read in the app's time zone, as Celery's worker reads it.
    assert job.expires_at == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    assert parse_time(None, UTC) is None


def test_too_large_payload_says_size_and_limit() -> None:
    with pytest.raises(PayloadTooLarge) as info:
        _job(body=(("x" * 3000,), {}, {}), max_payload_kb=2)
    assert "shop.charge" in str(info.value) and "2 KB" in str(info.value)
    assert info.value.size_bytes > 2048


def test_the_workflow_celery_embeds_does_not_count_towards_the_payload_limit() -> None:
    # A chain to a chord of 1,000 carries the whole header in its first message.
    header = [{"task": "t.add", "args": [i], "kwargs": {}, "options": {}} for i in range(100)]
    chain = [
        {
            "task": "celery.chord",
            "subtask_type": "chord",
            "kwargs": {"header": header},
            "options": {},
        }
    ]
    job = _job(body=((1,), {}, {"chain": chain}), max_payload_kb=2)
    assert len(job.message.payload) > 2048


@pytest.mark.parametrize(
    "embed",
    [
        {"chain": [{"task": "t.later", "args": [], "kwargs": {"pad": "y" * 5000}, "options": {}}]},
        {"callbacks": [{"task": "t.later", "args": ["y" * 5000], "kwargs": {}, "options": {}}]},
        {
            "chain": [
                {
                    "task": "celery.chord",
                    "subtask_type": "chord",
                    "kwargs": {
                        "header": {
                            "subtask_type": "group",
                            "kwargs": {"tasks": [{"task": "t.later", "args": ["y" * 5000]}]},
                        },
                        "body": {"task": "t.sum", "args": []},
                    },
                    "options": {},
                }
            ]
        },
    ],
    ids=["chain-step", "callback", "chord-member"],
)
def test_a_later_step_over_the_limit_is_refused_at_submission_naming_it(
    embed: dict[str, object],
) -> None:
    # Refused only when its turn came, it would fail after the tasks before it had run.
    with pytest.raises(PayloadTooLarge, match=r"'t\.later'"):
        _job(body=((1,), {}, embed), max_payload_kb=2)


@pytest.mark.parametrize("compression", [None, "zlib"])
def test_arguments_over_the_limit_are_refused_with_their_own_size(
    compression: str | None,
) -> None:
    data = random.Random(7).randbytes(2400).hex()  # does not compress below 2 KB
    arguments = ((data,), {}, {"chain": [{"task": "t", "args": ["y" * 5000]}]})
    with pytest.raises(PayloadTooLarge) as info:
        _job(body=arguments, max_payload_kb=2, compression=compression)
    assert info.value.size_bytes < 4900  # the arguments, not the whole message


def test_a_message_larger_than_a_row_holds_is_refused_naming_the_workflow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(message_module, "MAX_MESSAGE_BYTES", 4096)
    chain = [{"task": "t", "args": ["y" * 5000]}]
    with pytest.raises(MessageTooLarge, match=r"rest of a chain.*send a large chord on its own"):
        _job(body=((1,), {}, {"chain": chain}))


def test_pickle_needs_explicit_permission() -> None:
    with pytest.raises(SerializerNotAllowed):
        _job(serializer="pickle")
    assert _job(serializer="pickle", allow_pickle=True).message.content_type == (
        "application/x-python-serialize"
    )


@pytest.mark.parametrize("priority", [-1, "urgent", 2.5])
def test_invalid_priority_is_refused(priority: object) -> None:
    with pytest.raises(ValueError, match="priority"):
        _job(properties={"priority": priority})


def test_level_names_are_accepted_and_broker_sized_priorities_capped() -> None:
    assert _job(properties={"priority": "high"}).priority == 6
    assert _job(properties={"priority": 200}).priority == 9


def test_compressed_bodies_are_decompressed_for_the_worker() -> None:
    job = _job(compression="zlib")
    claimed = _claimed(job)
    message = JobMessage(claimed, accept={"application/json"}, on_end=lambda *a: None)
    assert message.decode() == [[1, "a"], {"k": "v"}, {"callbacks": None}]


def _claimed(job, token: str = "tok", claims: int = 1) -> ClaimedJob:  # type: ignore[no-untyped-def]
    return ClaimedJob(
        id=7,
        job_id=job.job_id,
        task_name=job.task_name,
        queue=job.queue,
        priority=job.priority,
        attempts=job.attempts,
        claims=claims,
        token=token,
        scheduled_time=datetime.now(UTC) - timedelta(seconds=1),
        message=job.message,
    )


def test_a_claimed_row_becomes_a_delivered_message() -> None:
    ends: list[tuple[str, JobStatus | None]] = []
    message = JobMessage(
        _claimed(_job(), claims=2),
        accept={"application/json"},
        on_end=lambda job, status, error, tb, failed: ends.append((job.job_id, status)),
    )
    assert message.headers[CLAIM_HEADER] == "tok"
    assert message.delivery_info == {
        "exchange": "",
        "routing_key": "payments",
        "priority": 4,
        "redelivered": True,
    }
    message.ack()
    assert ends == []
    message.reject(requeue=True)
    message.end(JobStatus.SUCCEEDED)  # a second report of the same execution is ignored
    assert ends == [("abc", JobStatus.PENDING)]
    assert kjson.loads(message.body) == [[1, "a"], {"k": "v"}, {"callbacks": None}]


def test_the_claims_decoding_is_kombus_where_no_typed_value_is_in_it() -> None:
    """The message reuses what the claim decoded, but never where kombu's decoder would
    give something else (a value kombu marks with its type), and never shares the dict."""
    job = _job(headers={"id": "abc", "task": "shop.charge", "stamp": "plain"})
    decoded = json.loads(job.message.headers)
    claimed = replace(_claimed(job), decoded_headers=decoded, decoded_properties={"x": 1})
    message = JobMessage(claimed, accept={"application/json"}, on_end=lambda *a: None)
    assert message.headers == {**decoded, CLAIM_HEADER: "tok"}
    assert CLAIM_HEADER not in decoded
    assert message.properties == {"x": 1, "priority": 4}
    assert claimed.decoded_properties == {"x": 1}

    moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    typed = _job(headers={"id": "abc", "task": "shop.charge", "stamp": moment})
    claimed = replace(_claimed(typed), decoded_headers=json.loads(typed.message.headers))
    message = JobMessage(claimed, accept={"application/json"}, on_end=lambda *a: None)
    assert message.headers["stamp"] == moment


def test_code_running_serializers_are_taken_out_of_accept_lists() -> None:
    kept, refused = safe_accept(["json", "pickle", "msgpack", "yaml"], allow_pickle=False)
    assert kept == {"application/json", "application/x-msgpack", "application/x-yaml"}
    assert refused == ["pickle"]
    kept, refused = safe_accept(["application/x-python-serialize"], allow_pickle=False)
    assert (kept, refused) == (set(), ["pickle"])
    kept, refused = safe_accept(["json", "pickle"], allow_pickle=True)
    assert kept == {"application/json", "application/x-python-serialize"} and refused == []
    assert safe_accept(None, allow_pickle=False) == ({"application/json"}, [])


def test_yaml_with_a_decoder_other_than_kombus_safe_one_is_refused() -> None:
    def full_load(data: object) -> object:  # stands for yaml.load with a code-running loader
        return data

    register("yaml", str, full_load, content_type="application/x-yaml")
    try:
        assert safe_accept(["json", "yaml"], allow_pickle=False)[1] == ["yaml"]
        with pytest.raises(SerializerNotAllowed):
            check_serializer("yaml", allow_pickle=False)
    finally:
        register_yaml()
    assert safe_accept(["yaml"], allow_pickle=False)[1] == []


def test_headers_are_written_as_kombus_json_writes_them() -> None:
    from decimal import Decimal
    from uuid import UUID

    headers = {
        "when": datetime(2026, 12, 4, 1, 2, 3, tzinfo=UTC),
        "id": UUID(int=7),
        "amount": Decimal("1.50"),
        "raw": b"\x00\xff",
        "nested": {"list": [1, "two", None]},
    }
    assert message_module._to_json(headers, "t", "headers") == kjson.dumps(headers)
    with pytest.raises(ValueError, match="cannot be stored as JSON"):
        message_module._to_json({"x": object()}, "t", "headers")


def _message_of(body: bytes, content_type: str = "application/json") -> JobMessage:
    job = _claimed(_job())
    job = replace(job, message=replace(job.message, payload=body, content_type=content_type))
    return JobMessage(job, accept={"application/json"}, on_end=lambda *a: None)


_MOMENT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    "body",
    [
        ((1, "a"), {"k": "v"}, {"callbacks": None}),
        (("caf\u00e9", "\u4e2d"), {"emoji": "\U0001f600"}, {}),
        ((_MOMENT,), {"when": _MOMENT}, {"chain": None}),  # typed: kombu's hook decodes it
        ((), {"__type__": "not a mark", "x": 1}, {}),
        ((1.5, 10**30, -0.0, None, True), {}, {}),
    ],
)
def test_a_body_decodes_as_kombu_decodes_it(body: object) -> None:
    encoded = kjson.dumps(body).encode()
    assert _message_of(encoded).payload == kjson.loads(encoded)


def test_a_type_mark_spelt_with_escapes_is_decoded_as_kombu_decodes_it() -> None:
    spelt = b'[[{"\\u005f_type__": "datetime", "__value__": "2026-01-02T03:04:05+00:00"}], {}, {}]'
    assert _message_of(spelt).payload == [[_MOMENT], {}, {}]


def test_a_body_kombu_cannot_decode_fails_as_kombus_decoding_fails() -> None:
    with pytest.raises(Exception) as ours:
        _ = _message_of(b"[1, 2").payload
    with pytest.raises(Exception) as kombus:
        KombuMessage(b"[1, 2", content_type="application/json", content_encoding="utf-8").decode()
    assert type(ours.value) is type(kombus.value)


def test_a_json_decoder_an_app_registered_is_the_one_used() -> None:
    decoded: list[bytes] = []

    def loads(data: bytes) -> object:
        decoded.append(data)
        return ["custom"]

    register("json", kjson.dumps, loads, "application/json", "utf-8")
    try:
        assert _message_of(b"[[1], {}, {}]").payload == ["custom"]
    finally:
        register("json", kjson.dumps, kjson.loads, "application/json", "utf-8")
    assert decoded == [b"[[1], {}, {}]"]


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(args=st.lists(_JSON_VALUES, max_size=4), kwargs=st.dictionaries(st.text(), _JSON_VALUES))
def test_any_json_body_decodes_as_kombu_decodes_it(args: list[object], kwargs: dict) -> None:  # type: ignore[type-arg]
    encoded = kjson.dumps((args, kwargs, {"callbacks": None})).encode()
    assert _message_of(encoded).payload == kjson.loads(encoded)


@given(args=st.lists(_JSON_VALUES, max_size=4), kwargs=st.dictionaries(st.text(), _JSON_VALUES))
def test_a_body_is_encoded_as_kombus_json_encodes_it(args: list[object], kwargs: dict) -> None:  # type: ignore[type-arg]
    body = (args, kwargs, {"callbacks": None, "chain": None})
    content_type, encoding, data = dumps(body, serializer="json")
    job = _job(body=body)
    assert (job.message.content_type, job.message.content_encoding) == (content_type, encoding)
    assert job.message.payload == data.encode(encoding)


def test_a_body_kombu_cannot_encode_fails_as_kombus_encoding_fails() -> None:
    with pytest.raises(EncodeError):
        _job(body=((object(),), {}, {}))
    with pytest.raises(EncodeError):
        _job(body=((float("nan"), {1, 2}), {}, {}))


def test_a_json_encoder_an_app_registered_is_the_one_used() -> None:
    register("json", lambda value: '["custom"]', kjson.loads, "application/json", "utf-8")
    try:
        assert _job().message.payload == b'["custom"]'
    finally:
        register("json", kjson.dumps, kjson.loads, "application/json", "utf-8")
    assert (
        _job().message.payload == kjson.dumps(((1, "a"), {"k": "v"}, {"callbacks": None})).encode()
    )


@pytest.mark.parametrize(
    "body",
    [
        b"\xef\xbb\xbf[[1], {}, {}]",
        "[[1], {}, {}]".encode("utf-16"),
        b'[["\xed\xa0\x80"], {}, {}]',
        b"[" * 5000 + b"]" * 5000,
    ],
)
def test_a_body_the_plain_decoder_refuses_is_decoded_as_kombu_decodes_it(body: bytes) -> None:
    # What kombu does with these depends on the Python (3.13's decoder takes 5,000-deep
    # nesting that 3.12's refuses): the decoding must be kombu's, whichever it is.
    try:
        expected = kombu_loads(body, "application/json", "utf-8", accept={"application/json"})
    except DecodeError:
        with pytest.raises(DecodeError):
            _ = _message_of(body).payload
    else:
        assert _message_of(body).payload == expected
