"""The two apps the bench compares: one on celery_ratchet, one on Celery's Redis broker.

Both run the same tasks. Each task bumps a Redis counter, so "done" is measured the same way
for both, and records its start time for the latency measurement.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

import celery_ratchet

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/15")
_redis = redis.Redis.from_url(REDIS_URL)

ratchet_app = Celery("bench_ratchet", task_cls="celery_ratchet:RatchetTask")
ratchet_app.conf.update(
    ratchet_url=os.environ.get("RATCHET_URL", "postgresql://postgres@127.0.0.1/ratchet_bench"),
    worker_hijack_root_logger=False,
)

redis_app = Celery("bench_redis", broker=REDIS_URL, backend=REDIS_URL)
redis_app.conf.update(worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)


def _register(app: Celery, prefix: str) -> None:
    @app.task(name="bench.noop", ignore_result=True, shared=False)
    def noop(i: int = 0) -> None:
        _redis.incr(f"{prefix}:done")

    @app.task(name="bench.echo", shared=False)
    def echo(i: int = 0) -> int:
        _redis.incr(f"{prefix}:done")
        return i

    @app.task(name="bench.total", shared=False)
    def total(values: list[int]) -> int:
        return sum(values)

    @app.task(name="bench.inc", shared=False)
    def inc(x: int) -> int:
        return x + 1

    @app.task(name="bench.stamp", ignore_result=True, shared=False)
    def stamp(sent_at: float) -> None:
        _redis.rpush(f"{prefix}:latency", time.time() - sent_at)


@celery_ratchet.recurring(
    cron="* * * * * ?", id="bench-tick", enabled=os.environ.get("BENCH_TICK") == "1"
)
@ratchet_app.task(name="bench.tick", ignore_result=True)
def tick() -> None:
    """A per-second schedule (bench/idle.py): how late each tick is comes from its row."""


#: The schedules bench's own Redis database: other benches flush theirs while it runs.
SCHEDULES_REDIS_URL = os.environ.get("BENCH_SCHEDULES_REDIS_URL", "redis://127.0.0.1:6379/12")
_schedules_board = redis.Redis.from_url(SCHEDULES_REDIS_URL)


@ratchet_app.task(name="bench.occurrence", bind=True, ignore_result=True)
def occurrence(self: object) -> None:
    """One tick of a schedule (bench/schedules.py): how late it started, and that it ran."""
    request = self.request  # type: ignore[attr-defined]
    started = time.time()
    with _schedules_board.pipeline(transaction=False) as pipe:
        pipe.hincrby("schedules:runs", request.id, 1)
        pipe.rpush("schedules:late", f"{request.eta}|{started}")
        pipe.execute()


_register(ratchet_app, "ratchet")
_register(redis_app, "redis")
