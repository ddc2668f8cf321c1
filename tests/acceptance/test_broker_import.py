"""``celery -A app ratchet import-broker redis://…``: what a stock Celery fleet left in a real
Redis (a private redis-server) moved into the store and run by ratchet workers, on PostgreSQL
and MariaDB; the ETA tasks a stock worker held when it was killed; a run killed with kill -9
and run again loses and doubles nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from sqlalchemy import func, select

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.store.batches import BatchStore
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.schema import scheduler_job
from tests.acceptance.conftest import ROOT, Cluster, group_members, side_effects
from tests.helpers import wait_until
from tests.private_servers import PrivateRedis

pytestmark = [pytest.mark.slow, pytest.mark.infra]


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    try:
        yield server
    finally:
        server.destroy()


def stock_sends(url: str, *request: str) -> dict[str, Any]:
    """What the fleet's stock senders send (tests/acceptance/stock_app.py), by task id."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.acceptance.stock_app", *request],
        cwd=ROOT, env={**os.environ, "STOCK_BROKER_URL": url, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return found


def import_broker(
    url: str, store_url: str, *extra: str, wait: bool = True
) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:
    command = [sys.executable, "-m", "celery", "-A", "tests.acceptance.app", "ratchet",
               "import-broker", url, *extra]  # fmt: skip
    env = {**os.environ, "RATCHET_URL": store_url, "PYTHONPATH": str(ROOT)}
    if not wait:
        return subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )  # fmt: skip
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def broker_keys(url: str) -> dict[str, int]:
    """Every key of the broker's database holding messages (lists, the unacked hash)."""
    client = redis.Redis.from_url(url)
    found = {}
    for key in client.keys("*"):
        kind = client.type(key)
        if kind == b"list":
            found[key.decode()] = int(client.llen(key))
        elif kind == b"hash":
            found[key.decode()] = int(client.hlen(key))
    return found


def stored(store: JobStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(scheduler_job)).scalar())


def test_a_stock_fleets_broker_is_moved_and_run_by_ratchet_workers(
    server_app: Celery, server_cluster: Cluster, private_redis: PrivateRedis, tmp_path: Path
) -> None:
    url = private_redis.url(2)
    # A stock worker takes three ETA tasks (it holds them unacknowledged until they are
    # due), and is killed: they stay in the transport's unacked hash.
    log = tmp_path / "stock.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.acceptance.stock_app", "worker",
             "-P", "solo", "-l", "info", "--without-mingle", "--without-gossip"],
            cwd=ROOT, env={**os.environ, "STOCK_BROKER_URL": url, "PYTHONPATH": str(ROOT)},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    client = redis.Redis.from_url(url)
    try:
        wait_until(lambda: b"ready" in log.read_bytes(), 60, "the stock worker to start")
        eta = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=1)
        held = stock_sends(url, "eta", eta.isoformat())["held"]
        wait_until(lambda: client.hlen("unacked") == 3, 60, "the stock worker to take them")
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(30)
        wait_until(lambda: not group_members(worker.pid), 30, "the stock worker's end")
    assert client.hlen("unacked") == 3
    sent = stock_sends(url, "fleet")
    plain, soon, urgent, retried = sent["plain"], sent["soon"], sent["urgent"], sent["retried"]
    expired, unknown = sent["expired"], sent["unknown"]

    store = ratchet_state(server_app).store
    dry = import_broker(url, store.url, "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert store.list_jobs(limit=10) == []
    assert "19 would move, 0 present" in dry.stderr and " moved," not in dry.stderr, dry.stderr
    done = import_broker(url, store.url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[1].split() == ["celery", "19", "0", "0"], (
        done.stdout + done.stderr + repr(broker_keys(url))
    )
    assert broker_keys(url) == {}, "the broker still holds messages"

    jobs = {j.job_id: j for j in store.list_jobs(limit=100)}
    for task_id in (*held, *plain, soon, urgent, retried, expired, unknown, sent["chained"]):
        assert task_id in jobs, task_id
    for task_id in held:  # the same ETA, still an hour away
        assert jobs[task_id].scheduled_time == eta
    assert jobs[urgent].priority == 7 and jobs[plain[0]].priority == 4
    assert jobs[retried].attempts == 2
    retried_job = store.result(retried)
    assert retried_job is not None and json.loads(retried_job.headers or "")["tenant"] == "acme"

    # An unknown task fails as any does; at once, not after the grace a rolling deploy gets.
    server_cluster.start("w1", pool="threads", concurrency=4,
                         RATCHET_UNKNOWN_TASK_GRACE_SECONDS="0")  # fmt: skip
    wait_until(
        lambda: (
            {"chain1:0", "chain1:1", "link1:6", "err1:0", "chord1"}
            <= {key for key, _ in side_effects(store)}
        ),
        120,
        f"the canvas to run\n{server_cluster.logs()}",
    )
    for task_id in (*plain, soon, urgent, retried):
        assert server_app.AsyncResult(task_id).get(timeout=60) is not None
    assert server_app.AsyncResult(sent["chorded"]).get(timeout=60) == 6
    assert server_app.AsyncResult(sent["chained"]).get(timeout=60) == 2
    assert server_app.AsyncResult(expired).state == "REVOKED"
    assert server_app.AsyncResult(unknown).state == "FAILURE"
    assert server_app.AsyncResult(sent["errback"]).state == "FAILURE"
    assert server_app.AsyncResult(sent["linked"]).get(timeout=60) == 6
    for task_id in held:  # not due for an hour: waiting in the store, not in a worker
        record = store.result(task_id)
        assert record is not None and record.status.value == "PENDING"  # type: ignore[union-attr]


def test_an_import_killed_with_kill_9_and_run_again_moves_each_message_once(
    servers: object, private_redis: PrivateRedis
) -> None:
    from tests.conftest import empty_store

    store: JobStore = empty_store(servers.url("postgresql"))  # type: ignore[attr-defined]
    url = private_redis.url(1)
    sent = set(stock_sends(url, "many", "20000")["sent"])

    first = import_broker(url, store.url, "--batch-size", "200", wait=False)
    assert isinstance(first, subprocess.Popen)
    wait_until(lambda: stored(store) >= 3000 or first.poll() is not None, 300, "the first batches")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(30)
    assert stored(store) < 20_000, "the run ended before it was killed: kill it earlier"
    left = sum(broker_keys(url).values())
    assert stored(store) + left >= 20_000, "messages were lost"

    again = import_broker(url, store.url, "--batch-size", "200")
    assert isinstance(again, subprocess.CompletedProcess)
    assert again.returncode == 0, again.stdout + again.stderr
    with store.engine.connect() as conn:
        ids = [r for r in conn.execute(select(scheduler_job.c.job_id)).scalars()]
    assert len(ids) == len(set(ids)) == 20_000
    assert set(ids) == sent
    assert broker_keys(url) == {}


def test_an_import_stopped_past_its_lock_stops_when_it_comes_back(
    servers: object, private_redis: PrivateRedis
) -> None:
    """Ctrl-Z on a run (SIGSTOP) for longer than its Redis lock lives; a second run takes
    over; the first, continued, renewed the lock as its own and went on beside the second,
    both trimming one staging list. Now it stops at its next change of the broker, and the
    second moves every message once."""
    from tests.conftest import empty_store

    store: JobStore = empty_store(servers.url("postgresql"))  # type: ignore[attr-defined]
    url = private_redis.url(4)
    sent = set(stock_sends(url, "many", "20000")["sent"])
    client = redis.Redis.from_url(url)

    first = import_broker(url, store.url, "--batch-size", "200", wait=False)
    assert isinstance(first, subprocess.Popen)
    wait_until(lambda: stored(store) >= 2000 or first.poll() is not None, 300, "the first batches")
    os.killpg(first.pid, signal.SIGSTOP)
    try:
        assert first.poll() is None, "the run ended before it was stopped: stop it earlier"
        holder = client.get("ratchet.import.lock")
        wait_until(lambda: client.get("ratchet.import.lock") != holder, 60, "the lock to lapse")
        second = import_broker(url, store.url, "--batch-size", "200", wait=False)
        assert isinstance(second, subprocess.Popen)
        wait_until(lambda: client.get("ratchet.import.lock") is not None, 60, "a second run")
        at = stored(store)
        wait_until(lambda: stored(store) > at + 1000 or second.poll() is not None, 300, "progress")
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    _, err = first.communicate(timeout=120)
    out, err2 = second.communicate(timeout=300)
    assert first.returncode != 0 and "lost its lock" in err, err
    assert second.returncode == 0, out + err2
    with store.engine.connect() as conn:
        ids = list(conn.execute(select(scheduler_job.c.job_id)).scalars())
    assert len(ids) == len(set(ids)) == 20_000
    assert set(ids) == sent
    assert broker_keys(url) == {}


def test_compressed_messages_are_read_within_the_bound_a_worker_reads_them_in(
    servers: object, private_redis: PrivateRedis
) -> None:
    """A chord sent compressed is counted whole and moved; a bzip2 bomb (a few hundred bytes
    that decompress to 64 MiB) is refused at the bound and stays in the broker. Before, the
    pre-scan read the compressed bodies as they were (the chord was refused, 'the queues hold
    0' of its header) and kombu decompressed the bomb whole (moved; at 1 GiB, 2 GB taken)."""
    import base64
    import bz2
    import uuid

    from tests.conftest import empty_store

    store: JobStore = empty_store(servers.url("postgresql"))  # type: ignore[attr-defined]
    url = private_redis.url(3)
    chord_id = stock_sends(url, "zipped")["group"]
    squeezer = bz2.BZ2Compressor(9)
    body = squeezer.compress(b"[[1], {}, {}")
    for _ in range(64):
        body += squeezer.compress(b" " * 2**20)
    body += squeezer.compress(b"]") + squeezer.flush()
    bomb = str(uuid.uuid4())
    redis.Redis.from_url(url).lpush("celery", json.dumps({
        "body": base64.b64encode(body).decode(), "content-type": "application/json",
        "content-encoding": "utf-8", "properties": {"body_encoding": "base64", "priority": 0},
        "headers": {"lang": "py", "task": "acc.double", "id": bomb, "root_id": bomb,
                    "compression": "application/x-bz2"},
    }))  # fmt: skip

    done = import_broker(url, store.url)
    assert isinstance(done, subprocess.CompletedProcess)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.splitlines()[1].split() == ["celery", "3", "0", "1"], done.stdout
    assert "decompresses to more than 6400 KB" in done.stdout and bomb in done.stdout
    assert broker_keys(url).get("celery") == 1, "the bomb stays in the broker"
    assert store.result(bomb) is None
    chord = BatchStore(store).get(chord_id)
    assert chord is not None and chord.total == 3


AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.fixture
def amqp_queue() -> Iterator[str]:
    """A queue of the shared RabbitMQ named for this test alone, deleted after it."""
    import uuid

    from kombu import Connection

    name = f"ratchet-import-{uuid.uuid4().hex[:12]}"
    try:
        with Connection(AMQP_URL, connect_timeout=5) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(f"RabbitMQ is not reachable at 127.0.0.1:5672: {exc}")
        pytest.skip(f"RabbitMQ is not reachable at 127.0.0.1:5672: {exc}")
    yield name
    with Connection(AMQP_URL) as conn:
        conn.default_channel.queue_delete(name)


def test_a_rabbitmq_queue_is_moved_acknowledged_only_after_the_commit(
    servers: object, amqp_queue: str
) -> None:
    from kombu import Connection, Consumer, Queue

    from tests.conftest import empty_store

    store: JobStore = empty_store(servers.url("postgresql"))  # type: ignore[attr-defined]
    sent = set(stock_sends(AMQP_URL, "many", "3000", amqp_queue)["sent"])
    eta = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=1)
    canvas = stock_sends(AMQP_URL, "canvas", amqp_queue, eta.isoformat())
    sent |= {canvas["urgent"], canvas["head"]}

    # A live consumer holds one message unacknowledged: it cannot be moved, and is named.
    held: list[object] = []
    with Connection(AMQP_URL) as conn:
        consumer = Consumer(
            conn.channel(), [Queue(amqp_queue, no_declare=True)], callbacks=[
                lambda body, message: held.append(message)
            ], prefetch_count=1,
        )  # fmt: skip
        consumer.consume()
        conn.drain_events(timeout=10)
        assert len(held) == 1
        first = import_broker(AMQP_URL, store.url, "--queue", amqp_queue, "--batch-size", "200",
                              wait=False)  # fmt: skip
        assert isinstance(first, subprocess.Popen)

        wait_until(
            lambda: stored(store) >= 600 or first.poll() is not None, 300, "the first batches"
        )
        os.killpg(first.pid, signal.SIGKILL)  # its unacknowledged messages go back
        first.wait(30)
        assert stored(store) < len(sent) - 1, "the run ended before it was killed: kill it earlier"
        again = import_broker(AMQP_URL, store.url, "--queue", amqp_queue)
        assert isinstance(again, subprocess.CompletedProcess)
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"{amqp_queue}: 1 consumers are attached" in again.stderr
        consumer.cancel()
    held_id = held[0].headers["id"]  # type: ignore[attr-defined]
    with store.engine.connect() as db:
        ids = list(db.execute(select(scheduler_job.c.job_id)).scalars())
    assert len(ids) == len(set(ids))
    assert {i for i in ids if i in sent} == sent - {held_id}
    jobs = {j.job_id: j for j in store.list_jobs(limit=5000)}
    urgent = next(j for j in jobs.values() if j.priority == 7)
    assert urgent.scheduled_time == eta
    assert canvas["chained"] in ids, "the chain's second step is stored ahead"
    # The held message went back to the queue with its consumer: the next run moves it.
    last = import_broker(AMQP_URL, store.url, "--queue", amqp_queue)
    assert isinstance(last, subprocess.CompletedProcess)
    assert last.returncode == 0, last.stdout + last.stderr
    assert store.result(held_id) is not None
