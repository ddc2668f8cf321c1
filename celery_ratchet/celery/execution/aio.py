"""``async def`` tasks: Celery's synchronous trace around a coroutine, without a thread each.

Celery's tracer (signals, result storing, retries, callbacks) calls ``task.run`` and wants its
return value. On the ``ratchet-async`` pool each execution's trace runs in a greenlet of the
event loop's thread. When the tracer reaches an ``async def`` task, :func:`await_here` steps
the coroutine inside that greenlet, and passes every future it waits on to the loop, which
switches back once it is done: thousands of executions wait at once, each with its own
``self.request`` (Celery keys its request stacks by greenlet). Blocking calls made on the way
(the result write) go through :func:`offload`, to a thread, so the loop never waits on them.

Outside that pool (prefork, threads, an eager ``apply()``) an ``async def`` task runs its
coroutine to the end on an event loop of its own, so it works everywhere.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Generator
from concurrent.futures import Executor
from typing import Any, TypeVar

from celery_ratchet.errors import ConfigurationError

try:
    import greenlet
except ImportError:  # pragma: no cover - only the async pool needs it
    greenlet = None

T = TypeVar("T")

_ASYNC = "_ratchet_async"


def require_greenlet() -> None:
    if greenlet is None:
        raise ConfigurationError(
            "the ratchet-async pool needs the greenlet package: pip install 'celery_ratchet[async]'"
        )


class TraceGreenlet(greenlet.greenlet if greenlet is not None else object):  # type: ignore[misc]
    """The greenlet one execution's trace runs in; its parent is the loop's thread."""

    def __init__(self, run: Callable[..., Any], loop: asyncio.AbstractEventLoop,
                 io: Executor) -> None:  # fmt: skip
        super().__init__(run)
        self.loop = loop
        self.io = io
        #: Its code runs on the loop's thread now (rather than waits): read from other
        #: threads, to tell a coroutine that blocks the loop from one that waits.
        self.stepping = False

    def step(self, thrown: BaseException | None, *args: Any, **kwargs: Any) -> Any:
        """Switch into the greenlet (or throw ``thrown`` into it) until it yields or ends."""
        self.stepping = True
        try:
            if thrown is not None:
                return self.throw(thrown)
            return self.switch(*args, **kwargs)
        finally:
            self.stepping = False


def _trace_greenlet() -> TraceGreenlet | None:
    if greenlet is None:
        return None
    current = greenlet.getcurrent()
    return current if isinstance(current, TraceGreenlet) else None


class _Pass:
    """Hands one thing a coroutine yielded (a future, or None for "let others run") to the
    task that drives the greenlet, and what that task is sent or thrown back."""

    __slots__ = ("yielded",)

    def __init__(self, yielded: Any) -> None:
        self.yielded = yielded

    def __await__(self) -> Generator[Any, Any, Any]:
        return (yield self.yielded)


async def drive(
    trace: TraceGreenlet,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    translate: Callable[[BaseException], BaseException] | None = None,
) -> Any:
    """Run ``trace`` to its end in its greenlet, waiting on the loop for whatever the
    coroutines inside it wait on. An exception thrown into this task (a cancel) is passed
    into the greenlet, through ``translate`` (a time limit's cancel becomes the limit)."""
    value = trace.step(None, *args, **kwargs)
    while not trace.dead:
        try:
            sent = await _Pass(value)
        except BaseException as exc:  # every interruption goes to the coroutine
            value = trace.step(translate(exc) if translate is not None else exc)
        else:
            value = trace.step(None, sent)
    return value


def await_here(awaitable: Awaitable[T]) -> T:
    """Inside a trace greenlet: the awaitable's result, stepping it here and waiting on the
    loop between two steps."""
    current = _trace_greenlet()
    assert current is not None and current.parent is not None
    steps = awaitable.__await__()
    sent: Any = None
    thrown: BaseException | None = None
    while True:
        try:
            yielded = steps.throw(thrown) if thrown is not None else steps.send(sent)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return,unused-ignore]
        sent = thrown = None
        try:
            sent = current.parent.switch(yielded)
        except BaseException as exc:  # a cancel or a time limit, for the coroutine
            thrown = exc


def offload(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)``; inside a trace greenlet in a thread, so that the loop goes
    on meanwhile."""
    current = _trace_greenlet()
    if current is None:
        return call(*args, **kwargs)
    future = current.loop.run_in_executor(current.io, functools.partial(call, *args, **kwargs))
    return await_here(future)


def is_async_task(task: Any) -> bool:
    return bool(getattr(task, _ASYNC, False))


def wrap_async(task: Any) -> None:
    """Make an ``async def`` task's ``run`` return its outcome to Celery's tracer
    (idempotent). Called with the coroutine's own context outside any trace, it returns the
    coroutine when a loop runs in this thread (``await task(...)``), else runs it to its end."""
    run = task.run
    if getattr(task, _ASYNC, False) or not inspect.iscoroutinefunction(run):
        return

    @functools.wraps(run)
    def run_to_end(*args: Any, **kwargs: Any) -> Any:
        coroutine: Coroutine[Any, Any, Any] = run(*args, **kwargs)
        if _trace_greenlet() is not None:
            return await_here(coroutine)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coroutine)
        return coroutine

    task.run = run_to_end
    setattr(task, _ASYNC, True)
