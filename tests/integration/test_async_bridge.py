"""The bridge under the async pool, in-process: synchronous code in greenlets of one event
loop awaits coroutines without a thread each; cancels reach the coroutine, translated; an
``async def`` task outside that pool runs its coroutine to the end."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from celery import Celery

from celery_ratchet.celery.execution.aio import (
    TraceGreenlet,
    await_here,
    drive,
    offload,
    wrap_async,
)

TRACES = 300


def test_synchronous_code_in_many_greenlets_waits_on_one_loop_at_once() -> None:
    running = peak = 0

    def trace(n: int) -> int:  # synchronous, like Celery's tracer
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await_here(asyncio.sleep(0.5))
        running -= 1
        return offload(lambda: n * 2)  # a blocking call, in a thread

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(4) as io:
            traces = [drive(TraceGreenlet(trace, loop, io), (n,), {}) for n in range(TRACES)]
            return list(await asyncio.gather(*traces))

    assert asyncio.run(main()) == [2 * n for n in range(TRACES)]
    assert peak == TRACES


def test_a_cancel_reaches_the_coroutine_as_what_translate_makes_of_it() -> None:
    seen: list[BaseException] = []

    async def waits() -> None:
        try:
            await asyncio.sleep(30)
        except BaseException as exc:
            seen.append(exc)
            raise

    def trace() -> None:
        await_here(waits())

    def translate(exc: BaseException) -> BaseException:
        return TimeoutError("the limit") if isinstance(exc, asyncio.CancelledError) else exc

    async def main() -> None:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1) as io:
            task = asyncio.ensure_future(
                drive(TraceGreenlet(trace, loop, io), (), {}, translate=translate)
            )
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(TimeoutError, match="the limit"):
                await task

    asyncio.run(main())
    assert [type(exc) for exc in seen] == [TimeoutError]


def test_an_async_task_outside_the_async_pool_runs_its_coroutine_to_the_end() -> None:
    app = Celery("bridge", set_as_current=False)

    @app.task(bind=True)
    async def answer(self, n: int) -> tuple[int, str]:  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.01)
        return n * 2, self.request.id

    wrap_async(answer)
    result = answer.apply((21,), task_id="job-1")
    assert result.get() == (42, "job-1")

    async def awaited() -> tuple[int, str]:  # a loop runs here: the coroutine is returned
        return await answer(4)  # type: ignore[no-any-return]

    assert asyncio.run(awaited())[0] == 8


def test_an_async_ratchet_task_applied_eagerly_returns_its_outcome(tmp_path: Path) -> None:
    app = Celery("eager", task_cls="celery_ratchet:RatchetTask", set_as_current=False)
    app.conf.ratchet_url = f"sqlite:///{tmp_path / 'eager.db'}"

    @app.task(bind=True, max_retries=2)
    async def flaky(self) -> int:  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        if self.request.retries < 1:
            raise self.retry(countdown=0)
        return int(self.request.retries)

    assert flaky.apply().get() == 1
