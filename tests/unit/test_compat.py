"""One test per Celery internal named in celery_ratchet.celery.compat."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import click
import pytest
from billiard.pool import CLOSE, RUN, TERMINATE
from celery import Celery, Signature
from celery.local import Proxy

from celery_ratchet.celery.compat import (
    DJANGO_TASK_METHODS,
    POOL_HELP_STUFF_FINISH_METHOD,
    billiard_pool_of,
    close_pool_at_once,
    current_app_object,
    current_task_object,
    discard_input,
    django_task_method,
    forget_billiard_pool,
    forget_cached_backend,
    input_waiting,
    offer_pool,
    on_every_cli_app,
    pool_input_queue,
    pool_processes,
    pool_state,
    pool_task_handler_alive,
    pool_unfinished_jobs,
    private_method,
    process_started,
    signature_app,
    stop_pool_threads,
    take_input_lock,
    unproxied,
    wrap_settings_censor,
)
from celery_ratchet.errors import ConfigurationError


def _app() -> Celery:
    return Celery("compat", set_as_current=False)


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def delay(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("delay", args, kwargs))

    def apply_async(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("apply_async", args, kwargs))


@pytest.mark.parametrize(
    ("name", "sends"), [("delay_on_commit", "delay"), ("apply_async_on_commit", "apply_async")]
)
def test_django_task_method_defers_the_send_to_on_commit(
    name: str, sends: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("django")
    from celery.contrib.django import task as django_task

    deferred: list[Any] = []
    monkeypatch.setattr(django_task.transaction, "on_commit", deferred.append)
    task = _Recorder()

    django_task_method(name)(task, 1, kw=2)

    assert task.calls == []  # nothing is sent before the commit
    assert len(deferred) == 1
    deferred[0]()
    assert task.calls == [(sends, (1,), {"kw": 2})]


def test_django_task_method_without_django_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "celery.contrib.django.task", None)
    for name in DJANGO_TASK_METHODS:
        with pytest.raises(ConfigurationError, match="Django is not installed"):
            django_task_method(name)


def test_django_task_method_names_only_celerys_methods() -> None:
    with pytest.raises(ValueError, match="not one of Celery's Django task methods"):
        django_task_method("delay")


def test_message_ignore_result_overrides_task_follows_the_installed_celery() -> None:
    from importlib.metadata import version

    from celery_ratchet.celery.compat import message_ignore_result_overrides_task

    major, minor = (int(p) for p in version("celery").split(".")[:2])
    assert message_ignore_result_overrides_task() is ((major, minor) >= (5, 6))


# -- the app and Celery's proxies ------------------------------------------------------------


def test_forget_cached_backend_drops_the_backend_in_app_local() -> None:
    app = _app()
    before = app.backend
    app.conf.result_backend = "cache+memory://"
    assert app.backend is before  # cached: the new setting is not seen yet
    forget_cached_backend(app)
    assert type(app.backend).__name__ == "CacheBackend"


def test_current_app_object_is_the_app_behind_the_current_app_proxy() -> None:
    previous = current_app_object()
    app = _app()
    app.set_current()
    try:
        found = current_app_object()
        assert found is app
        assert not isinstance(found, Proxy)
    finally:
        previous.set_current()


def test_current_task_object_is_the_task_behind_the_current_task_proxy() -> None:
    app = _app()

    @app.task(bind=True)
    def which(self: Any) -> bool:
        return current_task_object() is self

    assert which.apply().get() is True
    assert current_task_object() is None


def test_unproxied_reaches_the_task_behind_a_get_current_object_proxy() -> None:
    app = _app()

    @app.task
    def lazy() -> None:
        pass

    assert isinstance(lazy, Proxy)  # defined before the app was finalized
    task = unproxied(lazy)
    assert not isinstance(task, Proxy)
    assert task is app.tasks[task.name]
    assert unproxied(task) is task


def test_signature_app_reads_the_app_a_signature_holds_in_underscore_app() -> None:
    app = _app()

    @app.task
    def bound() -> None:
        pass

    assert signature_app(bound.s()) is app
    assert signature_app(Signature("elsewhere")) is None


# -- settings --------------------------------------------------------------------------------


def test_wrap_settings_censor_replaces_celerys_filter_hidden_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from celery.app import utils

    # A filter not wrapped yet (the ratchet apps of other tests wrapped Celery's own).
    monkeypatch.setattr(utils, "filter_hidden_settings", lambda conf: dict(conf))
    calls: list[int] = []

    def wrap(current: Any) -> Any:
        calls.append(1)
        return lambda conf: {**current(conf), "WRAPPED_SETTING": "seen"}

    wrap_settings_censor(wrap)
    wrap_settings_censor(wrap)
    assert calls == [1]
    app = _app()
    app.conf.some_setting = "x"
    assert "WRAPPED_SETTING" in app.conf.table(censored=True)


# -- the celery program ------------------------------------------------------------------------


def test_offer_pool_adds_to_celery_aliases_and_the_workers_pool_choice() -> None:
    from celery import concurrency
    from celery.bin.worker import WORKERS_POOL
    from celery.concurrency.solo import TaskPool

    alias = "compat-test-pool"
    choices = WORKERS_POOL.choices
    try:
        offer_pool(alias, "celery.concurrency.solo:TaskPool")
        offer_pool(alias, "celery.concurrency.solo:TaskPool")
        assert list(WORKERS_POOL.choices).count(alias) == 1
        app = SimpleNamespace(conf=SimpleNamespace(worker_pool=None))
        ctx = click.Context(click.Command("worker"), obj=SimpleNamespace(app=app))
        assert WORKERS_POOL.convert(alias, None, ctx) is TaskPool
    finally:
        WORKERS_POOL.choices = choices
        concurrency.ALIASES.pop(alias, None)


def test_on_every_cli_app_runs_when_celery_builds_a_cli_context() -> None:
    from celery.bin.base import CLIContext

    seen: list[Any] = []
    remove = on_every_cli_app(seen.append)
    try:
        app = _app()
        CLIContext(app, no_color=True, workdir=None, quiet=True)
        CLIContext(None, no_color=True, workdir=None, quiet=True)
        assert seen == [app]
    finally:
        remove()
    CLIContext(_app(), no_color=True, workdir=None, quiet=True)
    assert len(seen) == 1


# -- private methods overridden by subclasses here ---------------------------------------------


def test_private_method_names_what_the_release_does_not_have() -> None:
    assert private_method(Celery, "send_task") is Celery.send_task
    with pytest.raises(AttributeError, match="Celery has no method '_gone'"):
        private_method(Celery, "_gone")


# -- billiard's pool ---------------------------------------------------------------------------


@pytest.fixture
def billiard_pool() -> Iterator[Any]:
    from billiard.pool import Pool

    pool = Pool(processes=1)
    try:
        yield pool
    finally:
        if pool_state(pool) != TERMINATE:
            pool.terminate()
            pool.join()


def test_pool_help_stuff_finish_method_is_what_billiards_pool_end_calls() -> None:
    from billiard.pool import Pool

    from celery_ratchet.celery.pool import _BlockingPool

    private_method(Pool, POOL_HELP_STUFF_FINISH_METHOD)
    assert POOL_HELP_STUFF_FINISH_METHOD in vars(_BlockingPool)
    called: list[int] = []

    def drain(inqueue: Any, task_handler: Any, pool: Any) -> None:
        called.append(len(pool))

    recording = type("Recording", (Pool,), {POOL_HELP_STUFF_FINISH_METHOD: staticmethod(drain)})
    pool = recording(processes=1)
    pool.terminate()
    pool.join()
    assert called == [1]


def test_billiard_pool_of_reads_prefork_task_pool_underscore_pool() -> None:
    from billiard.pool import Pool
    from celery.concurrency.prefork import TaskPool

    task_pool = TaskPool(limit=1, initargs=(_app(), "compat@test"), threads=False)
    assert billiard_pool_of(task_pool) is None
    task_pool.start()
    try:
        assert isinstance(billiard_pool_of(task_pool), Pool)
    finally:
        task_pool.stop()


def test_forget_billiard_pool_clears_prefork_task_pool_underscore_pool() -> None:
    from celery.concurrency.prefork import TaskPool

    task_pool = TaskPool(limit=1, initargs=(_app(), "compat@test"), threads=False)
    task_pool.start()
    pool = billiard_pool_of(task_pool)
    forget_billiard_pool(task_pool)
    assert billiard_pool_of(task_pool) is None
    task_pool.on_stop()  # nothing left to stop: Celery's own stop sees no pool
    pool.terminate()
    pool.join()


def test_pool_state_reads_billiards_pool_underscore_state(billiard_pool: Any) -> None:
    assert pool_state(billiard_pool) == RUN
    billiard_pool.close()
    assert pool_state(billiard_pool) == CLOSE


def test_pool_processes_lists_billiards_pool_underscore_pool(billiard_pool: Any) -> None:
    processes = pool_processes(billiard_pool)
    assert len(processes) == 1
    assert processes[0].pid and processes[0].exitcode is None


def test_process_started_reads_billiards_process_underscore_popen(billiard_pool: Any) -> None:
    import billiard

    assert process_started(pool_processes(billiard_pool)[0])
    assert not process_started(billiard.Process(target=time.sleep, args=(0,)))


def test_pool_unfinished_jobs_reads_billiards_pool_underscore_cache(billiard_pool: Any) -> None:
    job = billiard_pool.apply_async(time.sleep, (0.3,))
    assert pool_unfinished_jobs(billiard_pool) == [job]
    job.get(timeout=10)
    assert pool_unfinished_jobs(billiard_pool) == []


def test_pool_task_handler_alive_reads_billiards_pool_underscore_task_handler(
    billiard_pool: Any,
) -> None:
    assert pool_task_handler_alive(billiard_pool) is True


def test_pool_input_queue_is_billiards_pool_underscore_inqueue(billiard_pool: Any) -> None:
    inqueue = pool_input_queue(billiard_pool)
    assert input_waiting(inqueue) is False  # idle: its one process waits for a job


@pytest.fixture
def simple_queue() -> Any:
    import billiard

    return billiard.get_context().SimpleQueue()


def test_take_input_lock_takes_billiards_simple_queue_underscore_rlock(simple_queue: Any) -> None:
    assert take_input_lock(simple_queue, 0.1) is True
    assert take_input_lock(simple_queue, 0.1) is False  # held, and not released


def test_input_waiting_polls_billiards_simple_queue_underscore_reader(simple_queue: Any) -> None:
    assert input_waiting(simple_queue) is False
    simple_queue.put("job")
    assert input_waiting(simple_queue) is True


def test_discard_input_reads_from_billiards_simple_queue_underscore_reader(
    simple_queue: Any,
) -> None:
    simple_queue.put("job")
    discard_input(simple_queue)
    assert input_waiting(simple_queue) is False


def test_close_pool_at_once_and_stop_pool_threads_end_a_billiard_pool(billiard_pool: Any) -> None:
    threads = [billiard_pool._worker_handler, billiard_pool._task_handler]
    threads.append(billiard_pool._result_handler)
    close_pool_at_once(billiard_pool)
    assert pool_state(billiard_pool) == CLOSE
    for process in pool_processes(billiard_pool):  # the end-of-work marker reached them
        process.join(10)
        assert process.exitcode is not None
    stop_pool_threads(billiard_pool)
    assert pool_state(billiard_pool) == TERMINATE
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()


def test_exit_as_billiard_does_is_billiards_shutdown_cleanup() -> None:
    code = (
        "import signal; from celery_ratchet.celery.compat import exit_as_billiard_does; "
        "exit_as_billiard_does(signal.SIGTERM, None)"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, timeout=60)
    assert done.returncode == (-(256 - signal.SIGTERM)) & 0xFF
