"""Business keys through Celery's own calls, with an in-process worker on each database:
``apply_async``/``delay``, groups, ``bulk()``, ``celery_ratchet.transaction()``, chords,
retries. A send whose key an active job holds returns that job's result (or raises)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery import Celery, chain, chord, group, signals
from sqlalchemy import create_engine, text

import celery_ratchet
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.errors import DuplicateJob, InvalidJob, PayloadTooLarge
from celery_ratchet.store.engine import normalize_url
from tests.helpers import wait_until

#: A queue the worker does not consume: jobs sent there stay PENDING, holding their keys.
PARKED = "parked"


def key() -> str:
    return f"order-{uuid.uuid4().hex[:8]}"


def jobs_of(app: Celery, business_key: str) -> list[tuple[str, str]]:
    with ratchet_state(app).store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT job_id, status FROM scheduler_job WHERE business_key = :k ORDER BY id"),
            {"k": business_key},
        )
        return [(r.job_id, r.status) for r in rows]


def send(app: Celery, k: str, queue: str = PARKED, **ratchet: Any) -> Any:
    return app.tasks["t.add"].apply_async(
        (1, 2), queue=queue, ratchet={"business_key": k, **ratchet}
    )


def test_a_second_send_returns_the_result_of_the_active_job(worker_app: Celery) -> None:
    k = key()
    first = send(worker_app, k)
    again = send(worker_app, k)
    assert again.id == first.id
    assert jobs_of(worker_app, k) == [(first.id, "PENDING")]
    with pytest.raises(DuplicateJob) as raised:
        send(worker_app, k, on_duplicate="raise")
    assert raised.value.job_id == first.id
    assert jobs_of(worker_app, k) == [(first.id, "PENDING")]


def test_an_unknown_on_duplicate_is_refused(worker_app: Celery) -> None:
    with pytest.raises(InvalidJob, match="on_duplicate"):
        send(worker_app, key(), on_duplicate="replace")


def test_once_the_job_has_run_the_key_takes_a_new_job(worker_app: Celery) -> None:
    k = key()
    first = send(worker_app, k, queue="celery")
    assert first.get(timeout=30) == 3
    second = send(worker_app, k, queue="celery")
    assert second.id != first.id
    assert second.get(timeout=30) == 3
    assert [status for _, status in jobs_of(worker_app, k)] == ["SUCCEEDED", "SUCCEEDED"]


def test_a_job_waiting_for_its_retry_still_holds_its_key(worker_app: Celery) -> None:
    k = key()
    options = {"backoff": "fixed", "backoff_param": 60, "max_retries": 3}
    first = worker_app.tasks["t.fail"].apply_async(
        ("boom",), ratchet={"business_key": k, **options}
    )

    def retried() -> bool:
        record = ratchet_state(worker_app).store.result(first.id)
        return record is not None and record.status == "PENDING" and record.attempts >= 1

    wait_until(retried, 30, "the failed job rescheduled for its retry")
    assert send(worker_app, k).id == first.id
    assert jobs_of(worker_app, k) == [(first.id, "PENDING")]
    first.revoke()


def test_group_members_of_a_held_key_point_at_its_job(worker_app: Celery) -> None:
    k, fresh = key(), key()
    holder = send(worker_app, k)
    add = worker_app.tasks["t.add"]
    members = [
        add.s(1, 1).set(queue=PARKED, ratchet={"business_key": k}),
        add.s(2, 2).set(queue=PARKED, ratchet={"business_key": fresh}),
        add.s(3, 3).set(queue=PARKED, ratchet={"business_key": fresh}),
        add.s(4, 4).set(queue=PARKED),
    ]
    result = group(members).apply_async()
    ids = [r.id for r in result.results]
    assert ids[0] == holder.id
    assert ids[2] == ids[1]
    assert jobs_of(worker_app, fresh) == [(ids[1], "PENDING")]
    assert ratchet_state(worker_app).store.result(ids[3]) is not None


def test_bulk_points_results_at_the_holder_when_the_block_ends(worker_app: Celery) -> None:
    k = key()
    holder = send(worker_app, k)
    add = worker_app.tasks["t.add"]
    with celery_ratchet.bulk(worker_app) as producer:
        results = [
            add.apply_async((i, i), queue=PARKED, producer=producer, ratchet={"business_key": k})
            for i in range(3)
        ]
    assert {r.id for r in results} == {holder.id}
    assert jobs_of(worker_app, k) == [(holder.id, "PENDING")]


def test_in_a_transaction_a_held_key_leaves_the_transaction_usable(worker_app: Celery) -> None:
    k = key()
    holder = send(worker_app, k)
    engine = create_engine(normalize_url(ratchet_state(worker_app).store.url))
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE IF NOT EXISTS bk_note (id VARCHAR(64))"))
        with engine.begin() as conn:
            with celery_ratchet.transaction(conn):
                again = send(worker_app, k)
            conn.execute(text("INSERT INTO bk_note (id) VALUES (:i)"), {"i": again.id})
        assert again.id == holder.id
        with engine.connect() as conn:
            noted = conn.execute(text("SELECT id FROM bk_note")).scalars().all()
        assert holder.id in noted
    finally:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE bk_note"))
        engine.dispose()


def test_a_chord_member_whose_key_is_held_refuses_the_whole_chord(worker_app: Celery) -> None:
    k = key()
    send(worker_app, k)
    add = worker_app.tasks["t.add"]
    header = [add.s(5, 5).set(queue=PARKED, ratchet={"business_key": k}), add.s(6, 6)]
    before = _rows(worker_app)
    with pytest.raises(DuplicateJob):
        chord(header)(worker_app.tasks["t.tsum"].s())
    assert len(jobs_of(worker_app, k)) == 1
    # Nothing of the refused chord is left: no member, no body, no open batch.
    assert _rows(worker_app) == before


def _rows(app: Celery) -> tuple[int, list[tuple[str, str]]]:
    """Jobs, and open batches (kind, id), in the store."""
    with ratchet_state(app).store.engine.connect() as conn:
        jobs = conn.execute(text("SELECT COUNT(*) FROM scheduler_job")).scalar_one()
        batches = conn.execute(
            text("SELECT kind, batch_id FROM scheduler_batch WHERE state = 'OPEN'")
        ).all()
    return int(jobs), sorted((b.kind, b.batch_id) for b in batches)


def test_a_refused_send_leaves_the_chords_sent_before_it_alone(worker_app: Celery) -> None:
    """Only the send that opened a chord's row can take it back: a chord whose header has no
    row of its own id yet (chains start with no group id) is kept when a later send in the
    same thread is refused."""
    k = key()
    send(worker_app, k)
    add = worker_app.tasks["t.add"]
    header = [chain(add.s(1, 1), add.s(1)).set(queue=PARKED) for _ in range(2)]
    result = chord(header)(worker_app.tasks["t.tsum"].s().set(queue=PARKED))
    chord_id = result.parent.id
    raising = {"business_key": k, "on_duplicate": "raise"}
    with pytest.raises(DuplicateJob):
        add.apply_async((2, 2), ratchet=raising)
    with pytest.raises(DuplicateJob):
        group(add.s(3, 3).set(queue=PARKED), add.s(4, 4).set(ratchet=raising)).apply_async()
    assert ("CHORD", chord_id) in _rows(worker_app)[1]


def test_a_chord_whose_header_cannot_be_built_leaves_no_open_chord(worker_app: Celery) -> None:
    add = worker_app.tasks["t.add"]
    too_large = "x" * 200_000  # over ratchet_max_payload_kb (100)
    before = _rows(worker_app)
    with pytest.raises(PayloadTooLarge):
        chord([add.s(1, 1).set(queue=PARKED), add.s(too_large, "")])(worker_app.tasks["t.tsum"].s())
    assert _rows(worker_app) == before


@pytest.mark.parametrize("members", [2, 12])  # 12: sent from the first one's message
def test_a_chord_whose_member_fails_its_argument_check_leaves_no_open_chord(
    worker_app: Celery, members: int
) -> None:
    """Celery checks each member's arguments against the task's signature as it sends it:
    a member that does not fit raises TypeError, and nothing of the chord is written."""
    add = worker_app.tasks["t.add"]
    header = [add.s(i, i).set(queue=PARKED) for i in range(members)]
    header[members // 2] = add.s(1).set(queue=PARKED)
    before = _rows(worker_app)
    with pytest.raises(TypeError):
        chord(header)(worker_app.tasks["t.tsum"].s())
    assert _rows(worker_app) == before


def test_a_task_resending_its_own_key_from_its_success_handler_makes_a_new_job(
    worker_app: Celery,
) -> None:
    """The worker writes a success's result with its next batch of outcomes; until then the
    job is active and holds its key. A send of that key from the task's own success handler
    waits for that write instead of being taken for a duplicate of the finished job."""
    k = key()
    add = worker_app.tasks["t.add"]
    ids: list[str] = []

    def send(n: int) -> None:
        # The id is listed before the send: the job may run, and succeed, before the send
        # returns.
        ids.append(str(uuid.uuid4()))
        add.apply_async((n, 1), task_id=ids[-1], ratchet={"business_key": k})

    def again(sender: Any = None, result: Any = None, **_: Any) -> None:
        if sender is add and sender.request.id in ids and len(ids) < 4:
            send(result)

    signals.task_success.connect(again, weak=False)
    try:
        send(0)
        wait_until(
            lambda: len(ids) == 4 and len(jobs_of(worker_app, k)) == 4
            and all(status == "SUCCEEDED" for _, status in jobs_of(worker_app, k)),
            30,
            "four jobs of one key, each sent by the one before it as it succeeded",
        )  # fmt: skip
    finally:
        signals.task_success.disconnect(again)
    assert [job_id for job_id, _ in jobs_of(worker_app, k)] == ids
    assert worker_app.AsyncResult(ids[-1]).get(timeout=10) == 4


@pytest.mark.parametrize(
    "value",
    [
        "nul\x00inside",
        "unicode: żółć 日本 🚀 and a lone surrogate \ud800",
        float("nan"),
        {"nested": [1.5, None, True, "é"]},
    ],
    ids=["nul", "unicode", "nan", "nested"],
)
def test_results_at_the_limits_read_back_as_returned(worker_app: Celery, value: Any) -> None:
    """A success's result goes to the worker's batch of outcomes, or (too large, or one
    some database could refuse) is written by its thread: either way it reads back whole."""
    got = worker_app.tasks["t.identity"].delay(value).get(timeout=30)
    if isinstance(value, float):
        assert got != got  # NaN
    else:
        assert got == value


def test_a_result_over_what_the_batch_takes_is_written_by_its_thread(worker_app: Celery) -> None:
    assert worker_app.tasks["t.big"].delay(300_000).get(timeout=30) == "x" * 300_000
