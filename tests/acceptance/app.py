"""The app the acceptance tests run real ``celery -A tests.acceptance.app worker`` on.

An ordinary Celery app, changed by the two lines of the README: the task base class, and
the job store URL (here from RATCHET_URL). Its broker_url points at a closed port.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from celery import Celery, signals
from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy import text

import celery_ratchet
from celery_ratchet.celery.state import ratchet_state

app = Celery("acceptance", task_cls="celery_ratchet:RatchetTask")
app.conf.broker_url = "amqp://guest:guest@127.0.0.1:1//"
app.conf.ratchet_poll_interval = 0.2
app.conf.ratchet_resources = {"ledger": 1}

SIDE_EFFECTS = "acceptance_run"


def record_run(key: str) -> None:
    """One row per execution: which pool process ran it (pid), under which worker (ppid)."""
    # The worker's own engine: its pool sizes, and no prepared statements behind PgBouncer.
    with ratchet_state(app).store.engine.connect() as conn:
        conn.execute(
            text(f"INSERT INTO {SIDE_EFFECTS} (run_key, pid, ppid) VALUES (:k, :p, :pp)"),
            {"k": key, "p": os.getpid(), "pp": os.getppid()},
        )


@app.task(name="acc.hard_retried", time_limit=0.5, backoff="fixed", backoff_param=0.1,
          max_retries=2)  # fmt: skip
def hard_retried(key: str) -> str:
    record_run(key)
    time.sleep(5)
    return "no limit"


@app.task(name="acc.ledger", resource="ledger")
def ledger(key: str) -> None:
    record_run(f"{key}:start:{time.time():.6f}")
    time.sleep(0.3)
    record_run(f"{key}:end:{time.time():.6f}")


@app.task(name="acc.double")
def double(n: int) -> int:
    record_run(f"double-{n}")
    return n * 2


@app.task(name="acc.step")
def step(n: int, key: str, pause: float = 0.0) -> int:
    """Step ``n`` of the chain ``key``: recorded as ``key:n``, it hands ``n + 1`` on."""
    record_run(f"{key}:{n}")
    time.sleep(pause)
    return n + 1


@app.task(name="acc.sleep")
def sleep(key: str, seconds: float) -> str:
    record_run(key)
    time.sleep(seconds)
    return key


@app.task(name="acc.gated")
def gated(key: str, gate: str) -> str:
    """Notes its start, then waits (up to two minutes) until the file ``gate`` exists: jobs
    held running for as long as a test needs, with no guess at how long that is."""
    record_run(key)
    deadline = time.monotonic() + 120
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    return key


def _note(line: str) -> None:
    """One line in RATCHET_ACCEPTANCE_RUN_LOG, a file, not the job store."""
    fd = os.open(os.environ["RATCHET_ACCEPTANCE_RUN_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{line}\n".encode())  # one O_APPEND write: lines never mix
    finally:
        os.close(fd)


@app.task(name="acc.noted_sleep")
def noted_sleep(key: str, seconds: float) -> str:
    """Like acc.sleep, but notes its run in a file (RATCHET_ACCEPTANCE_RUN_LOG), not in the
    job store: for tests that take the database away while jobs run."""
    _note(f"{key} {os.getpid()} {os.getppid()}")
    time.sleep(seconds)
    return key


@app.task(name="acc.noted_span")
def noted_span(key: str, seconds: float) -> str:
    """Like acc.noted_sleep, and notes its end too (``<key> end``): for tests that change
    the database while jobs run and wait for those to end first."""
    _note(f"{key} {os.getpid()} {os.getppid()}")
    time.sleep(seconds)
    _note(f"{key} end")
    return key


@app.task(name="acc.soft_limited", soft_time_limit=0.5)
def soft_limited() -> str:
    try:
        time.sleep(5)
    except SoftTimeLimitExceeded:
        return "caught soft limit"
    return "no limit"


@app.task(name="acc.hard_limited", time_limit=0.5)
def hard_limited() -> str:
    time.sleep(5)
    return "no limit"


# Recurring jobs, switched on per test by RATCHET_ACCEPTANCE_RECURRING (tick | misfire).
_RECURRING = os.environ.get("RATCHET_ACCEPTANCE_RECURRING", "")


@celery_ratchet.recurring(cron="* * * * * ?", id="acc-tick", enabled=_RECURRING == "tick")
@app.task(name="acc.tick", bind=True)
def tick(self) -> None:  # type: ignore[no-untyped-def]
    record_run(f"tick@{self.request.eta}")


def _misfire_task(policy: str, **options: int) -> None:
    @celery_ratchet.recurring(
        cron="* * * * * ?",
        id=f"acc-{policy}",
        misfire_policy=policy,
        enabled=_RECURRING == "misfire",
        **options,
    )
    @app.task(name=f"acc.{policy}", bind=True)
    def fired(self) -> None:  # type: ignore[no-untyped-def]
        record_run(f"{policy}@{self.request.eta}")


_misfire_task("catch_up", max_catch_up_executions=3)
_misfire_task("fire_once")
_misfire_task("skip")


# beat_schedule entries, per test: RATCHET_ACCEPTANCE_BEAT=beat-a,beat-b (each every 2 s).
@app.task(name="acc.beat_tick", bind=True)
def beat_tick(self, entry: str) -> None:  # type: ignore[no-untyped-def]
    record_run(f"{entry}@{self.request.eta}")


app.conf.beat_schedule = {
    entry: {"task": "acc.beat_tick", "schedule": 2.0, "args": (entry,)}
    for entry in filter(None, os.environ.get("RATCHET_ACCEPTANCE_BEAT", "").split(","))
}


class NotesCountdowns(app.Task):  # type: ignore[name-defined,misc]
    """Notes the delay each retry of its task asks for: Celery's ``retry(countdown=)``."""

    def retry(self, *args: Any, countdown: float | None = None, **kwargs: Any) -> Any:
        record_run(f"countdown|{self.request.id}|{self.request.retries}|{countdown!r}")
        return super().retry(*args, countdown=countdown, **kwargs)


@celery_ratchet.recurring(
    cron="* * * * * ?",
    id="acc-backoff",
    max_retries=3,
    backoff_delay_ms=500,
    enabled=_RECURRING == "backoff",
)
@app.task(name="acc.flaky_schedule", bind=True, base=NotesCountdowns)
def flaky_schedule(self) -> None:  # type: ignore[no-untyped-def]
    """Fails three times, then succeeds; notes when each run began and its message's ETA."""
    eta = datetime.fromisoformat(str(self.request.eta)).timestamp()
    record_run(f"flaky|{self.request.id}|{self.request.retries}|{eta:.3f}|{time.time():.3f}")
    if self.request.retries < 3:
        raise RuntimeError("the partner is down")


@app.task(name="acc.value")
def value(n: int, pause: float = 0.0) -> int:
    if pause:
        time.sleep(pause)
    return n


@app.task(name="acc.big")
def big(size: int) -> str:
    return "x" * size


@app.task(name="acc.until")
def until(n: int, moment: float) -> int:
    """Finish at the wall-clock ``moment``: two of them end at the same instant."""
    time.sleep(max(0.0, moment - time.time()))
    return n


@app.task(name="acc.progress_report")
def progress_report(summary: dict[str, Any], key: str) -> None:
    """A batch's progress report: notes its percent and how many reports of its batch had
    ended when it started (run one at a time and in order, that is its place)."""
    with ratchet_state(app).store.engine.connect() as conn:
        ended = conn.execute(
            text(f"SELECT COUNT(*) FROM {SIDE_EFFECTS} WHERE run_key LIKE :ends"),
            {"ends": f"progress-end|{key}|%"},
        ).scalar()
    record_run(f"progress|{key}|{summary['percent_done']}|{ended}")
    time.sleep(0.02)  # a report running beside another would overlap it
    record_run(f"progress-end|{key}|{summary['percent_done']}")


@app.task(name="acc.chord_body")
def chord_body(results: list[int], key: str) -> int:
    record_run(key)
    return sum(results)


@app.task(name="acc.crash_worker")
def crash_worker(key: str) -> None:
    """Notes its run, then SIGKILLs its whole worker (main process and pool), every time."""
    record_run(key)
    os.killpg(os.getpgrp(), signal.SIGKILL)


@app.task(name="acc.boom")
def boom(message: str) -> None:
    raise RuntimeError(message)


@app.task(name="acc.needs_marker")
def needs_marker(path: str) -> str:
    """Fails for good until the file ``path`` exists: a dead letter that a retry mends."""
    if not os.path.exists(path):
        raise RuntimeError(f"no marker file {path}")
    return "mended"


@app.task(name="acc.on_dead_letters")
def on_dead_letters(summary: dict[str, object]) -> dict[str, object]:
    """The dead-letter alert task of the workers started with RATCHET_DLQ_ALERT_TASK."""
    return summary


# A task of the next release, which only the workers started with
# RATCHET_ACCEPTANCE_NEXT_RELEASE know: a rolling deploy half done.
if os.environ.get("RATCHET_ACCEPTANCE_NEXT_RELEASE"):

    @app.task(name="acc.next_release")
    def next_release(key: str) -> str:
        record_run(key)
        return key


# Celery's setting, for tests of it set in the app rather than by --prefetch-multiplier.
if os.environ.get("RATCHET_ACCEPTANCE_PREFETCH_MULTIPLIER"):
    app.conf.worker_prefetch_multiplier = int(os.environ["RATCHET_ACCEPTANCE_PREFETCH_MULTIPLIER"])
if os.environ.get("RATCHET_ACCEPTANCE_ACKS_LATE"):
    app.conf.task_acks_late = True

# The serializers the app accepts, set per test (RATCHET_ACCEPTANCE_ACCEPT_CONTENT=json,pickle).
if os.environ.get("RATCHET_ACCEPTANCE_ACCEPT_CONTENT"):
    app.conf.accept_content = os.environ["RATCHET_ACCEPTANCE_ACCEPT_CONTENT"].split(",")


#: Coroutines of acc.async_sleep running in this process now, and the most seen at once.
_async_running = 0
_async_peak = 0


@app.task(name="acc.async_sleep")
async def async_sleep(seconds: float, gather: int = 0) -> int:
    """Waits on the event loop; returns how many ran at once at most, so far, here.

    With ``gather``, first waits (up to two minutes) until that many have been running at
    once, so how many the pool can hold does not depend on how fast the machine claims."""
    global _async_running, _async_peak
    _async_running += 1
    _async_peak = max(_async_peak, _async_running)
    try:
        deadline = time.monotonic() + 120
        while _async_peak < gather and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(seconds)
    finally:
        _async_running -= 1
    return _async_peak


@app.task(name="acc.async_noted", bind=True)
async def async_noted(self, key: str, seconds: float) -> str:  # type: ignore[no-untyped-def]
    """Notes each run (with its attempt) without blocking the loop, then waits."""
    await asyncio.to_thread(record_run, f"{key}:{self.request.retries}")
    await asyncio.sleep(seconds)
    return key


@app.task(name="acc.async_over_limit", bind=True, time_limit=1, backoff="fixed",
          backoff_param=0.1, max_retries=2)  # fmt: skip
async def async_over_limit(self, key: str) -> str:  # type: ignore[no-untyped-def]
    """Its first attempt outlasts its time limit; the retry ends at once."""
    attempt = self.request.retries
    await asyncio.to_thread(record_run, f"{key}:start:{attempt}")
    if attempt == 0:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            record_run(f"{key}:cancelled:{attempt}")
            raise
    return f"{key} done on attempt {attempt}"


@app.task(name="acc.async_cancellable")
async def async_cancellable(key: str, seconds: float) -> str:
    """Notes its start, and its cancellation if it is cancelled (also while the start is
    being noted: the note is visible before the coroutine has resumed from writing it)."""
    try:
        await asyncio.to_thread(record_run, f"{key}:start")
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        record_run(f"{key}:cancelled")
        raise
    return key


@app.task(name="acc.async_soft_limited", soft_time_limit=0.5)
async def async_soft_limited() -> str:
    try:
        await asyncio.sleep(5)
    except SoftTimeLimitExceeded:
        return "caught soft limit"
    return "no limit"


def _blocked_until(gate: str) -> None:
    """Waits (up to two minutes) until the file ``gate`` exists, without ever yielding."""
    deadline = time.monotonic() + 120
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)


@app.task(name="acc.async_blocking", time_limit=1)
async def async_blocking(key: str, gate: str) -> str:
    """Blocks the event loop past its time limit (a sync call in a coroutine), which no
    cancel can interrupt; notes its start, and its wake after the block."""
    await asyncio.to_thread(record_run, f"{key}:start")
    _blocked_until(gate)
    record_run(f"{key}:woke")
    return key


@app.task(name="acc.sync_limited", time_limit=1)
def sync_limited(key: str, gate: str) -> str:
    """A plain task past its time limit: on -P ratchet-async it runs in a thread."""
    record_run(f"{key}:start")
    _blocked_until(gate)
    record_run(f"{key}:woke")
    return key


@app.task(name="acc.async_flaky", bind=True, max_retries=3)
async def async_flaky(self, key: str) -> int:  # type: ignore[no-untyped-def]
    """Retried twice by self.retry from inside the coroutine, then succeeds."""
    await asyncio.sleep(0.01)
    if self.request.retries < 2:
        raise self.retry(countdown=0.1)
    return int(self.request.retries)


@app.task(name="acc.async_deaf", time_limit=1)
async def async_deaf(key: str) -> str:
    """Outlasts its time limit and ignores the cancel: it runs on for an hour."""
    await asyncio.to_thread(record_run, f"{key}:start")
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        await asyncio.to_thread(record_run, f"{key}:ignored the cancel")
        await asyncio.sleep(3600)
    return key


@app.task(name="acc.async_fan_out", bind=True)
async def async_fan_out(self, n: int) -> list[str]:  # type: ignore[no-untyped-def]
    """Sends n jobs from async code without blocking the loop; returns their ids."""
    sent = [await double.adelay(i) for i in range(n)]
    return [result.id for result in sent]


def _note_signal(name: str) -> Callable[..., None]:
    def note(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "name", None) == "acc.async_flaky":
            record_run(f"{name}:{sender.request.retries}")

    return note


_SIGNALS = {"prerun": signals.task_prerun, "postrun": signals.task_postrun,
            "retry": signals.task_retry, "success": signals.task_success}  # fmt: skip
for _name, _signal in _SIGNALS.items():
    _signal.connect(_note_signal(_name), weak=False)


#: The countdown acc.retried_later's first try retries with (seconds): longer than a test.
RETRY_LATER_SECONDS = 120


@app.task(name="acc.retried_later", bind=True)
def retried_later(self: Any, key: str) -> None:
    if not self.request.retries:
        raise self.retry(countdown=RETRY_LATER_SECONDS)
    record_run(key)
