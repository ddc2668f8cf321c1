"""Messages of a broker as jobs (protocol 2 and 1, refusals) and the mover's exactly-once
write, on each database; a real Redis and real workers are in
tests/acceptance/test_broker_import.py."""

from __future__ import annotations

import bz2
import json
import pickle
import time
import zlib
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from kombu.utils import json as kjson

from celery_ratchet.celery.broker_import.chords import ChordState
from celery_ratchet.celery.broker_import.convert import (
    BrokerMessage,
    Converter,
    Decode,
    Moved,
    Refused,
)
from celery_ratchet.celery.broker_import.mover import Item, Mover
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.batch import BatchKind
from celery_ratchet.store.jobstore import JobStore
from tests.conftest import IN_CI, _reachable
from tests.integration.conftest import BrokerTrap, make_app
from tests.private_postgres import free_port

STOCK = Celery("stock", broker="memory://", set_as_current=False)


def message(
    name: str = "t.add", args: Sequence[Any] = (1, 2), queue: str = "celery", **options: Any
) -> BrokerMessage:
    """A protocol 2 message as stock Celery builds it, JSON-encoded as kombu sends it."""
    task_id = options.pop("task_id", None) or f"id-{name}-{args!r}"
    properties = {"priority": options.pop("priority", 0), "correlation_id": task_id,
                  "delivery_tag": "tag", "body_encoding": "base64"}  # fmt: skip
    extra = options.pop("headers", {})
    headers, _, body, _ = STOCK.amqp.as_task_v2(task_id, name, args=args, **options)
    headers.update(extra)  # as send_task_message adds them
    return BrokerMessage(
        kjson.dumps(body).encode(), "application/json", "utf-8", headers, properties, queue
    )


@pytest.fixture
def app(store: JobStore, broker_trap: BrokerTrap) -> Celery:
    return make_app(store.url, broker_trap.url)


def test_a_protocol_2_message_keeps_its_id_arguments_times_retries_and_headers(
    app: Celery,
) -> None:
    eta = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    sent = message(
        "t.add", (4, 5), queue="reports", task_id="m-1", eta=eta, retries=2,
        expires=eta + timedelta(hours=1), headers={"tenant": "acme"}, priority=7,
    )  # fmt: skip
    moved = Converter(app).convert(sent)
    assert isinstance(moved, Moved)
    job = moved.job
    assert (job.job_id, job.task_name, job.queue, job.priority) == ("m-1", "t.add", "reports", 7)
    assert (job.due, job.expires_at, job.attempts) == (eta, eta + timedelta(hours=1), 2)
    assert json.loads(job.message.payload)[:2] == [[4, 5], {}]
    headers = json.loads(job.message.headers)
    assert headers["tenant"] == "acme" and headers["id"] == "m-1"
    assert "delivery_tag" not in job.message.properties
    # kombu's priority 0 is "none given": the job gets the default, as a send without one.
    assert Converter(app).convert(message(task_id="m-2")).job.priority == 4  # type: ignore[union-attr]


def test_a_protocol_1_message_becomes_protocol_2(app: Celery) -> None:
    body = {"task": "t.add", "id": "old-1", "args": [1, 2], "kwargs": {}, "retries": 1,
            "eta": None, "expires": None, "callbacks": None, "errbacks": None}  # fmt: skip
    moved = Converter(app).convert(
        BrokerMessage(json.dumps(body).encode(), "application/json", "utf-8", {}, {}, "celery")
    )
    assert isinstance(moved, Moved)
    assert (moved.job.job_id, moved.job.task_name, moved.job.attempts) == ("old-1", "t.add", 1)
    assert json.loads(moved.job.message.payload)[:2] == [[1, 2], {}]
    assert json.loads(moved.job.message.headers)["task"] == "t.add"


def test_a_chain_is_stored_ahead_and_a_chord_is_marked(app: Celery) -> None:
    chain = STOCK.signature("t.add", args=(1, 1)) | STOCK.signature("t.add", args=(2,))
    chain.freeze()
    tasks = chain.tasks
    sent = message("t.add", (1, 1), task_id=tasks[0].id, chain=[dict(tasks[1])])
    moved = Converter(app).convert(sent)
    assert isinstance(moved, Moved)
    assert [(s.job_id, s.depends_on) for s in moved.steps] == [(tasks[1].id, tasks[0].id)]
    body = dict(STOCK.signature("t.tsum"))
    member = message("t.add", (1, 1), task_id="c-1", group_id="chord-1", chord=body)
    marked = Converter(app).convert(member)
    assert isinstance(marked, Moved) and marked.chord is not None
    assert marked.chord.group_id == "chord-1"


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        (BrokerMessage(pickle.dumps(([1], {}, {})), "application/x-python-serialize", "binary",
                       {"task": "t.add", "id": "p-1"}, {}, "celery"), "not accepted here"),
        (BrokerMessage(b"{not json", "application/json", "utf-8", {"task": "t.add", "id": "x"},
                       {}, "celery"), "cannot be decoded"),
        (BrokerMessage(b'{"hello": 1}', "application/json", "utf-8", {}, {}, "celery"),
         "not a Celery task message"),
        (message("t.add", ("x" * 4000,), task_id="big"), "over the limit"),
    ],
)  # fmt: skip
def test_what_cannot_be_stored_is_refused_with_the_reason(
    app: Celery, broken: BrokerMessage, reason: str
) -> None:
    app.conf.ratchet_max_payload_kb = 2
    ratchet_state(app).reset()
    refused = Converter(app).convert(broken)
    assert isinstance(refused, Refused) and reason in refused.reason
    assert "xxxx" not in refused.reason  # never the arguments


def _compressed(sent: BrokerMessage, body: bytes, compression: str) -> BrokerMessage:
    headers = {**sent.headers, "compression": compression}
    return BrokerMessage(body, sent.content_type, "binary", headers, sent.properties, sent.queue)


def test_a_compressed_message_is_decompressed_within_the_bound_a_worker_reads(
    app: Celery,
) -> None:
    app.conf.ratchet_max_payload_kb = 2  # bound: 64 x 2 KB = 128 KB decompressed
    ratchet_state(app).reset()
    sent = message("t.add", (3, 4), task_id="zipped")
    zipped = Converter(app).convert(_compressed(sent, zlib.compress(sent.body), "zlib"))
    assert isinstance(zipped, Moved)
    assert json.loads(zipped.job.message.payload)[:2] == [[3, 4], {}]
    assert "compression" not in json.loads(zipped.job.message.headers)
    # 1 MB of blanks around the same arguments: a few hundred bytes of bzip2. kombu
    # decompressed it whole (an 800-byte one made the import take 2 GB) and moved it.
    squeezed = bz2.compress(b"[[3, 4], {}, {}" + b" " * 2**20 + b"]", 9)
    bomb = Converter(app).convert(_compressed(sent, squeezed, "application/x-bz2"))
    assert isinstance(bomb, Refused), bomb
    assert "decompresses to more than 128 KB" in bomb.reason and bomb.task_id == "zipped"


class ListSource:
    """A broker of a list of messages: what a run settles is taken out, refused kept."""

    def __init__(self, messages: list[BrokerMessage], members: dict[str, int] | None = None):
        self.held = list(messages)
        self.members = members
        self.given_back: list[Item] = []

    def batches(self, size: int, dry_run: bool) -> Iterator[list[Item]]:
        items = [Item(n, m.queue, m) for n, m in enumerate(self.held)]
        for start in range(0, len(items), size):
            yield items[start : start + size]

    def settle(self, batch: Sequence[Item], refused: Sequence[Item]) -> None:
        self.given_back.extend(refused)
        taken = {i.handle for i in batch} - {i.handle for i in refused}
        self.held = [m if n not in taken else None for n, m in enumerate(self.held)]  # type: ignore[misc]

    def chord_members(self, decode: Decode) -> dict[str, int] | None:
        return self.members


class Chords:
    def __init__(self, states: dict[str, ChordState]) -> None:
        self.states = states

    def of(self, group_id: str) -> ChordState:
        return self.states.get(group_id, ChordState(None, 0))


def test_a_message_moved_twice_is_written_once_and_counted_present(
    app: Celery, store: JobStore
) -> None:
    sent = [message("t.add", (n, n), task_id=f"twice-{n}") for n in range(7)]
    first = Mover(app, ListSource(sent), batch_size=3).run()
    assert (first.queues["celery"].moved, first.queues["celery"].present) == (7, 0)
    # A run cut off after its commit left them in the broker: the next finds them present.
    again = Mover(app, ListSource(sent), batch_size=3).run()
    assert (again.queues["celery"].moved, again.queues["celery"].present) == (0, 7)
    assert len(store.list_jobs(limit=100)) == 7
    assert Mover(app, ListSource(sent), dry_run=True).run().queues["celery"].present == 7


def test_a_message_whose_id_the_store_holds_for_another_task_is_left_in_the_broker(
    app: Celery, store: JobStore
) -> None:
    """A task id sent twice (a fleet's own ids, say): the store's job of that id is not this
    message moved before. It was counted present and taken out of the broker: dropped."""
    app.send_task("t.add", args=(9, 9), task_id="twice-sent")
    sent = [message("t.add", (1, 1), task_id="twice-sent"), message("t.add", (2, 2))]
    source = ListSource(sent)
    summary = Mover(app, source).run()
    counts = summary.queues["celery"]
    assert (counts.moved, counts.present, counts.refused) == (1, 0, 1)
    [((_, reason), _)] = summary.reasons.items()
    assert "another task or other arguments" in reason
    assert [i.handle for i in source.given_back] == [0]
    again = Mover(app, ListSource(sent[1:]), dry_run=True).run()  # moved before: present
    assert again.queues["celery"].present == 1


def test_a_chord_is_moved_only_whole(app: Celery, store: JobStore) -> None:
    body = dict(STOCK.signature("t.tsum"))
    whole = [message("t.add", (n, n), task_id=f"w-{n}", group_id="whole", group_index=n,
                     chord=body) for n in range(2)]  # fmt: skip
    partial = [message("t.add", (n, n), task_id=f"p-{n}", group_id="part", group_index=n,
                       chord=body) for n in range(2)]  # fmt: skip
    source = ListSource([*whole, *partial], members={"whole": 2, "part": 2})
    chords = Chords({"whole": ChordState(2, 0), "part": ChordState(3, 1)})
    summary = Mover(app, source, chord_states=chords).run()
    assert summary.queues["celery"].moved == 2 and summary.queues["celery"].refused == 2
    [(key, count)] = summary.reasons.items()
    assert count == 2 and "of whose 3 header tasks 1 returned" in key[1]
    assert [i.handle for i in source.given_back] == [2, 3]
    chord = ratchet_state(app).batches.get("whole")
    assert chord is not None and chord.kind is BatchKind.CHORD and chord.total == 2
    assert {j.job_id for j in store.list_jobs(limit=10)} == {"w-0", "w-1"}


def test_a_chord_is_refused_where_the_source_cannot_count_its_header(app: Celery) -> None:
    body = dict(STOCK.signature("t.tsum"))
    member = message("t.add", (1, 1), task_id="a-0", group_id="amqp", group_index=0, chord=body)
    summary = Mover(app, ListSource([member], members=None)).run()
    [(key, count)] = summary.reasons.items()
    assert count == 1 and "chords are moved from Redis brokers only" in key[1]


def test_a_run_that_lost_its_redis_lock_changes_the_broker_no_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run stopped longer than its lock (Ctrl-Z, a paused VM, a network cut) while it held a
    batch in the staging list, and another run took over: when the first comes back, it must
    not trim the staging list, which now holds the new run's batch, not yet committed. It did,
    and that batch was lost when the new run was cut off in turn."""
    import uuid

    import redis

    from celery_ratchet.celery.broker_import import redis_source
    from celery_ratchet.celery.broker_import.redis_source import RedisSource
    from celery_ratchet.errors import RatchetError
    from tests.integration.test_wakeups import REDIS, _redis_reachable

    _redis_reachable()
    monkeypatch.setattr(redis_source, "LOCK_SECONDS", 0.3)
    prefix = f"ratchet-test-{uuid.uuid4().hex[:12]}:"
    options = {"global_keyprefix": prefix}
    client = redis.Redis.from_url(REDIS)
    sent = [message("t.add", (n, n), task_id=f"lock-{n}") for n in range(10)]
    for m in sent:
        properties = {k: v for k, v in m.properties.items() if k != "body_encoding"}
        envelope = {"body": m.body.decode(), "content-type": m.content_type,
                    "content-encoding": "utf-8", "headers": dict(m.headers),
                    "properties": properties}  # fmt: skip
        client.lpush(f"{prefix}celery", json.dumps(envelope))

    def held() -> int:  # in the queue or a staging list: still in the broker
        lists = [k for k in client.keys(f"{prefix}*") if client.type(k) == b"list"]
        return sum(int(client.llen(k)) for k in lists)

    first = RedisSource(REDIS, ["celery"], options, unacked="never")
    second = RedisSource(REDIS, ["celery"], options, unacked="never")
    try:
        first.lock()
        stalled = next(first.batches(4, False))  # staged; then the run stops, its lock lapses
        first._stop.set()
        assert first._renewing is not None
        first._renewing.join(5)
        wait_until_gone = time.monotonic() + 10
        while client.exists(first.lock_key) and time.monotonic() < wait_until_gone:
            time.sleep(0.05)
        second.lock()
        taking = second.batches(4, False)
        leftover = next(taking)  # the first run's batch, found staged: moved (or present)
        assert [i.handle[3] for i in leftover] == [i.handle[3] for i in stalled]
        second.settle(leftover, [])
        next(taking)  # the second run's own batch, staged, not committed yet
        assert held() == 6
        with pytest.raises(RatchetError, match="another run took over"):
            first.settle(stalled, [])  # it comes back
        assert held() == 6, "the run that lost its lock trimmed the new run's batch"
    finally:
        second.close()  # the second run is cut off before its commit
        first.client.close()
        for key in client.keys(f"{prefix}*"):
            client.delete(key)
        client.close()


def _import_broker(app: Celery, url: str) -> Any:
    from types import SimpleNamespace

    from click.testing import CliRunner

    from celery_ratchet.celery.broker_import.command import import_broker

    return CliRunner().invoke(import_broker, [url], obj=SimpleNamespace(app=app))


@pytest.mark.parametrize("scheme", ["redis", "amqp"])
def test_a_broker_that_cannot_be_reached_is_one_line(app: Celery, scheme: str) -> None:
    port = free_port()  # nothing listens there
    url = f"{scheme}://guest:s3cretpw@127.0.0.1:{port}/5"
    out = _import_broker(app, url)
    assert out.exit_code == 2, out.output
    assert out.output == (
        f"Error: cannot reach the broker at {scheme}://guest:***@127.0.0.1:{port}/5: "
        "connection refused; nothing was moved\n"
    )


def test_a_broker_that_refuses_the_login_is_one_line(app: Celery) -> None:
    if not _reachable("127.0.0.1:5672"):
        if IN_CI:
            pytest.fail("RabbitMQ is not reachable at 127.0.0.1:5672")
        pytest.skip("RabbitMQ is not reachable at 127.0.0.1:5672")
    out = _import_broker(app, "amqp://guest:wrongpw@127.0.0.1:5672//")
    assert out.exit_code == 2, out.output
    assert out.output == (
        "Error: cannot reach the broker at amqp://guest:***@127.0.0.1:5672//: the broker "
        "refused the login: check the user name and password in the URL; nothing was moved\n"
    )
