"""One test per Celery internal named in celery_ratchet.celery.compat."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import pytest
from billiard.pool import CLOSE, RUN, TERMINATE
from celery import Celery, Signature, group
from celery.local import Proxy
from celery.utils.saferepr import saferepr
from hypothesis import given
from hypothesis import strategies as st

from celery_ratchet.celery.app.application import Celery as RatchetCelery
from celery_ratchet.celery.app.task import RatchetTask
from celery_ratchet.celery.compat import (
    AMQP_CREATE_TASK_SENDER_METHOD,
    BACKEND_RETRY_SLEEP_METHOD,
    BACKEND_STORAGE_METHODS,
    BASE_POOL_GET_INFO_METHOD,
    CHANNEL_PURGE_METHOD,
    CONNECTION_RERAISE_METHOD,
    DJANGO_TASK_METHODS,
    POOL_HELP_STUFF_FINISH_METHOD,
    REQUEST_ANNOUNCE_REVOKED_METHOD,
    argument_reprs,
    billiard_pool_of,
    build_backend,
    cache_producer_pool,
    cached_producer_pool,
    close_pool_at_once,
    current_app_object,
    current_task_object,
    discard_input,
    django_task_method,
    ensure_not_eager,
    forget_billiard_pool,
    forget_cached_backend,
    freeze_group_id,
    in_stop_signal_handler,
    input_waiting,
    is_composite_signature,
    is_lazy_generator_result,
    offer_pool,
    on_every_cli_app,
    on_every_new_app,
    pool_input_queue,
    pool_processes,
    pool_state,
    pool_task_handler_alive,
    pool_unfinished_jobs,
    private_method,
    process_started,
    request_already_cancelled,
    request_already_revoked,
    request_terminates_on_ack,
    sends_as_celery,
    serializer_codec,
    serializer_decoders,
    set_message_state,
    set_task_tracer,
    signature_app,
    stop_pool_threads,
    take_input_lock,
    task_tracer,
    unproxied,
    wrap_settings_censor,
)
from celery_ratchet.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]


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


def test_group_tasks_are_lazy_tells_a_group_of_a_generator_from_one_of_a_list() -> None:
    from celery import Celery, group

    from celery_ratchet.celery.compat import group_tasks_are_lazy

    app = Celery(set_as_current=False)

    @app.task(name="t.noop", shared=False)
    def noop() -> None:
        pass

    assert group_tasks_are_lazy(group(noop.s() for _ in range(2)))
    assert not group_tasks_are_lazy(group([noop.s(), noop.s()]))


def test_wrap_group_apply_async_wraps_celerys_group_once() -> None:
    from celery.canvas import group

    from celery_ratchet.celery.send import lazy_groups

    lazy_groups.connect()
    lazy_groups.connect()
    wrapped = group.apply_async
    assert getattr(wrapped, "__ratchet_wrapped__", False)
    original = wrapped.__wrapped__  # type: ignore[attr-defined]
    assert not getattr(original, "__ratchet_wrapped__", False)
    assert original.__qualname__ == "group.apply_async"


# -- the app and Celery's proxies ------------------------------------------------------------


def test_forget_cached_backend_drops_the_backend_in_app_local() -> None:
    app = _app()
    before = app.backend
    app.conf.result_backend = "cache+memory://"
    assert app.backend is before  # cached: the new setting is not seen yet
    forget_cached_backend(app)
    assert type(app.backend).__name__ == "CacheBackend"


def test_build_backend_makes_a_new_backend_from_the_setting() -> None:
    app = _app()
    before = app.backend
    app.conf.result_backend = "cache+memory://"
    built = build_backend(app)
    assert type(built).__name__ == "CacheBackend"
    assert app.backend is before  # what app.backend keeps is left alone


def test_on_every_new_app_calls_back_as_each_app_is_constructed() -> None:
    made = _app()
    seen: list[Any] = []
    remove = on_every_new_app(seen.append)
    try:
        assert made in seen
        app = _app()
        assert seen[-1] is app
        assert app.main == "compat"  # called once the constructor has run
    finally:
        remove()
    count = len(seen)
    _app()
    assert len(seen) == count


def test_on_every_new_app_waits_for_celerys_app_module_when_it_is_not_imported() -> None:
    check = textwrap.dedent(
        """
        import sys
        from celery_ratchet.celery.compat import on_every_new_app
        assert "celery.app.base" not in sys.modules
        seen = []
        on_every_new_app(seen.append)
        from celery import Celery
        app = Celery("late", set_as_current=False)
        assert seen == [app], seen
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]


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


def _billiard_pool() -> Iterator[Any]:
    from billiard.pool import Pool

    pool = Pool(processes=1)
    try:
        yield pool
    finally:
        if pool_state(pool) != TERMINATE:
            pool.terminate()
            pool.join()


@pytest.fixture
def billiard_pool() -> Iterator[Any]:
    """A pool of the test's own, which it may close."""
    yield from _billiard_pool()


@pytest.fixture(scope="module")
def running_pool() -> Iterator[Any]:
    """One running pool for the tests that only read it (a pool's stop takes some 2 s)."""
    yield from _billiard_pool()


def test_pool_help_stuff_finish_method_is_what_billiards_pool_end_calls() -> None:
    from billiard.pool import Pool

    from celery_ratchet.celery.execution.prefork import _BlockingPool

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


def test_pool_processes_lists_billiards_pool_underscore_pool(running_pool: Any) -> None:
    processes = pool_processes(running_pool)
    assert len(processes) == 1
    assert processes[0].pid and processes[0].exitcode is None


def test_process_started_reads_billiards_process_underscore_popen(running_pool: Any) -> None:
    import billiard

    assert process_started(pool_processes(running_pool)[0])
    assert not process_started(billiard.Process(target=time.sleep, args=(0,)))


def test_pool_unfinished_jobs_reads_billiards_pool_underscore_cache(running_pool: Any) -> None:
    job = running_pool.apply_async(time.sleep, (0.3,))
    assert pool_unfinished_jobs(running_pool) == [job]
    job.get(timeout=10)
    assert pool_unfinished_jobs(running_pool) == []


def test_pool_task_handler_alive_reads_billiards_pool_underscore_task_handler(
    running_pool: Any,
) -> None:
    assert pool_task_handler_alive(running_pool) is True


def test_pool_input_queue_is_billiards_pool_underscore_inqueue(running_pool: Any) -> None:
    inqueue = pool_input_queue(running_pool)
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


# -- methods overridden here: each still there and still called by Celery --------------------


def test_base_pool_get_info_method_is_what_pool_info_returns() -> None:
    from celery.concurrency.base import BasePool

    from celery_ratchet.celery.execution.asyncpool import AsyncPool

    private_method(BasePool, BASE_POOL_GET_INFO_METHOD)
    assert BASE_POOL_GET_INFO_METHOD in vars(AsyncPool)
    pool = type("P", (BasePool,), {BASE_POOL_GET_INFO_METHOD: lambda self: {"mine": 1}})(1)
    assert pool.info == {"mine": 1}


def test_channel_purge_method_is_what_kombus_queue_purge_calls() -> None:
    from kombu import Connection
    from kombu.transport import memory

    from celery_ratchet.celery.worker.transport import Channel as RatchetChannel

    private_method(memory.Channel, CHANNEL_PURGE_METHOD)
    assert CHANNEL_PURGE_METHOD in vars(RatchetChannel)
    purged: list[str] = []

    def purge(self: Any, queue: str) -> int:
        purged.append(queue)
        return 7

    channel_cls = type("C", (memory.Channel,), {CHANNEL_PURGE_METHOD: purge})
    transport_cls = type("T", (memory.Transport,), {"Channel": channel_cls})
    with Connection(transport=transport_cls) as conn:
        assert conn.default_channel.queue_purge("jobs") == 7
    assert purged == ["jobs"]


def test_amqp_create_task_sender_method_builds_amqp_send_task_message() -> None:
    from celery.app.amqp import AMQP

    from celery_ratchet.celery.send.amqp import RatchetAMQP

    private_method(AMQP, AMQP_CREATE_TASK_SENDER_METHOD)
    assert AMQP_CREATE_TASK_SENDER_METHOD in vars(RatchetAMQP)

    def sender(*args: Any, **kwargs: Any) -> None:
        pass

    amqp_cls = type("A", (AMQP,), {AMQP_CREATE_TASK_SENDER_METHOD: lambda self: sender})
    app = Celery("compat", set_as_current=False, amqp=amqp_cls)
    assert app.amqp.send_task_message is sender


def test_connection_reraise_method_is_what_send_task_enters_on_the_producers_connection() -> None:
    from contextlib import contextmanager

    from kombu import Connection

    from celery_ratchet.celery.send.sender import _NoBrokerConnection

    private_method(Connection, CONNECTION_RERAISE_METHOD)
    assert CONNECTION_RERAISE_METHOD in vars(_NoBrokerConnection)
    entered: list[int] = []

    @contextmanager
    def reraise(self: Any) -> Iterator[None]:
        entered.append(1)
        yield

    published: list[str] = []
    connection = type("Conn", (), {CONNECTION_RERAISE_METHOD: reraise})()
    producer = SimpleNamespace(connection=connection, publish=lambda *a, **k: published.append(1))
    app = Celery("compat", set_as_current=False, broker="memory://")
    app.send_task("some.task", producer=producer)
    assert entered == [1]


def test_backend_storage_methods_are_what_basebackends_public_methods_call() -> None:
    from celery.backends.base import BaseBackend
    from celery.result import GroupResult

    from celery_ratchet.celery.results.backend import RatchetBackend

    for name in BACKEND_STORAGE_METHODS:
        assert name in vars(RatchetBackend), name
    called: list[str] = []

    def recorder(name: str) -> Any:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            called.append(name)
            return {"status": "SUCCESS", "result": 1} if name == "_get_task_meta_for" else None

        return method

    backend_cls = type("B", (BaseBackend,), {n: recorder(n) for n in BACKEND_STORAGE_METHODS})
    backend = backend_cls(app=_app())
    backend.store_result("id", 1, "SUCCESS")
    backend.get_task_meta("id")
    backend.forget("id")
    backend.save_group("g", GroupResult("g", []))
    backend.restore_group("g")
    backend.delete_group("g")
    assert called == list(BACKEND_STORAGE_METHODS)


def test_backend_retry_sleep_method_is_the_pause_between_two_result_write_retries() -> None:
    from celery.backends.base import BaseBackend

    from celery_ratchet.celery.results.backend import RatchetBackend

    private_method(BaseBackend, BACKEND_RETRY_SLEEP_METHOD)
    assert BACKEND_RETRY_SLEEP_METHOD in vars(RatchetBackend)
    slept: list[float] = []
    failures = [OSError("away")]

    def store(self: Any, *args: Any, **kwargs: Any) -> None:
        if failures:
            raise failures.pop()

    app = _app()
    app.conf.result_backend_always_retry = True
    methods = {
        "_store_result": store,
        "exception_safe_to_retry": lambda self, exc: True,
        BACKEND_RETRY_SLEEP_METHOD: lambda self, amount: slept.append(amount),
    }
    type("B", (BaseBackend,), methods)(app=app).store_result("id", 1, "SUCCESS")
    assert len(slept) == 1


def test_ensure_not_eager_is_basebackends_eager_result_warning() -> None:
    from celery.backends.base import BaseBackend

    app = _app()
    app.conf.task_always_eager = True
    with pytest.warns(RuntimeWarning):
        ensure_not_eager(BaseBackend(app=app))


def test_is_lazy_generator_result_knows_celerys_underscore_regen() -> None:
    from celery.utils.functional import regen

    assert is_lazy_generator_result(regen(x for x in [1]))
    assert not is_lazy_generator_result([1])


# -- the worker's requests -----------------------------------------------------------------


def _request(app: Celery) -> Any:
    from celery.contrib.testing.mocks import TaskMessage
    from celery.worker.request import Request

    @app.task(shared=False)
    def job() -> None:
        pass

    return Request(TaskMessage(job.name), app=app, task=app.tasks[job.name])


def test_request_announce_revoked_method_is_where_a_revoke_of_a_request_ends() -> None:
    from celery.worker import state as worker_state
    from celery.worker.request import Request

    from celery_ratchet.celery.execution.request import RatchetRequest

    private_method(Request, REQUEST_ANNOUNCE_REVOKED_METHOD)
    assert REQUEST_ANNOUNCE_REVOKED_METHOD in vars(RatchetRequest)
    request = _request(_app())
    announced: list[str] = []
    request_cls = type(
        "R", (Request,), {REQUEST_ANNOUNCE_REVOKED_METHOD: lambda self, *a: announced.append(a[0])}
    )
    request.__class__ = request_cls
    worker_state.revoked.add(request.id)
    try:
        request.revoked()
    finally:
        worker_state.revoked.discard(request.id)
    assert announced == ["revoked"]


def test_request_already_revoked_reads_requests_underscore_already_revoked() -> None:
    from celery.worker import state as worker_state

    request = _request(_app())
    assert request_already_revoked(request) is False
    worker_state.revoked.add(request.id)
    try:
        assert request.revoked()
    finally:
        worker_state.revoked.discard(request.id)
        worker_state.task_ready(request)
    assert request_already_revoked(request) is True


def test_request_already_cancelled_reads_requests_underscore_already_cancelled() -> None:
    app = _app()
    # Celery 5.5 always records the cancel as a retry: give it a backend that can.
    app.conf.result_backend = "cache+memory://"
    request = _request(app)
    assert request_already_cancelled(request) is False
    request.time_start = time.monotonic()
    pool = SimpleNamespace(terminate_job=lambda *args: None)
    if "emit_retry" in inspect.signature(request.cancel).parameters:  # Celery 5.6+
        request.cancel(pool, emit_retry=False)
    else:
        request.cancel(pool)
    assert request_already_cancelled(request) is True


def test_request_terminates_on_ack_reads_requests_underscore_terminate_on_ack() -> None:
    request = _request(_app())
    assert request_terminates_on_ack(request) is False
    request.terminate(SimpleNamespace(terminate_job=lambda *args: None))  # not started yet
    assert request_terminates_on_ack(request) is True


# -- sending ---------------------------------------------------------------------------------


def test_cached_producer_pool_is_amqp_underscore_producer_pool_which_a_fork_clears() -> None:
    app = _app()
    assert cached_producer_pool(app.amqp) is None
    pool = object()
    cache_producer_pool(app.amqp, pool)
    assert cached_producer_pool(app.amqp) is pool
    assert app.amqp.producer_pool is pool  # where Celery's own property keeps it
    app._after_fork()
    assert cached_producer_pool(app.amqp) is None


def test_cache_producer_pool_keeps_it_where_celerys_amqp_keeps_its_own() -> None:
    from celery.app.amqp import AMQP

    app = _app()
    cache_producer_pool(app.amqp, "kept")
    assert AMQP.producer_pool.fget(app.amqp) == "kept"


# -- kombu messages and serializers -------------------------------------------------------------


def test_serializer_decoders_reads_kombus_registry_underscore_decoders() -> None:
    from kombu.utils import json as kjson

    decoders = serializer_decoders()
    assert decoders is not None
    assert decoders["application/json"] is kjson.loads


def test_serializer_codec_reads_kombus_registry_underscore_encoders() -> None:
    from kombu.utils import json as kjson

    codec = serializer_codec("json")
    assert codec is not None
    assert (codec.content_type, codec.content_encoding) == ("application/json", "utf-8")
    assert codec.encoder is kjson.dumps
    assert serializer_codec("no-such-serializer") is None


def test_set_message_state_writes_kombus_message_underscore_state() -> None:
    from kombu.message import Message

    message = Message(body=b"{}", content_type="application/json")
    assert not message.acknowledged
    set_message_state(message, "ACK")
    assert message.acknowledged
    other = Message(body=b"{}", content_type="application/json")
    set_message_state(other, "REJECTED")
    assert other.acknowledged  # ended: kombu will not ack it again


# -- canvas and tracing ----------------------------------------------------------------------


def test_is_composite_signature_knows_celerys_underscore_chain_and_chord() -> None:
    from celery import chain, chord, group

    app = _app()

    @app.task(shared=False)
    def step() -> None:
        pass

    assert not is_composite_signature(step.s())
    assert is_composite_signature(step.s() | step.s())
    assert is_composite_signature(chain(step.s(), step.s()))
    assert is_composite_signature(chord([step.s()], step.s()))
    assert is_composite_signature(group([step.s()]))


def test_task_tracer_and_set_task_tracer_are_what_celerys_trace_task_calls() -> None:
    from celery.app.trace import trace_task

    app = _app()

    @app.task(shared=False)
    def traced() -> None:
        pass

    task = app.tasks[traced.name]
    assert task_tracer(task) is None  # built on first use
    calls: list[str] = []

    def tracer(uuid: str, args: Any, kwargs: Any, request: Any = None) -> str:
        calls.append(uuid)
        return "traced"

    set_task_tracer(task, tracer)
    assert task_tracer(task) is tracer
    assert trace_task(task, "the-id", (), {}) == "traced"
    assert calls == ["the-id"]


def test_in_stop_signal_handler_is_true_beneath_the_workers_stop_handler_only() -> None:
    """Found by the handler's frame: a real signal, through Celery's own handler."""
    from celery.apps.worker import _shutdown_handler
    from celery.utils.log import set_in_sighandler
    from celery.worker import state

    seen: list[bool] = []
    previous = signal.getsignal(signal.SIGUSR2)
    _shutdown_handler(
        SimpleNamespace(hostname="w@test"),  # type: ignore[arg-type]
        sig="SIGUSR2",
        how="Cold",
        callback=lambda worker: seen.append(in_stop_signal_handler()),
        verbose=False,
    )
    try:
        assert not in_stop_signal_handler()
        os.kill(os.getpid(), signal.SIGUSR2)
        for _ in range(100_000):  # Python runs the handler between two bytecodes
            if seen:
                break
        assert seen == [True]
        assert not in_stop_signal_handler()
        # As SIGHUP's restart handler leaves it: Celery's flag set for good.
        set_in_sighandler(True)
        assert not in_stop_signal_handler()
    finally:
        set_in_sighandler(False)
        state.should_terminate = None
        signal.signal(signal.SIGUSR2, previous)


def test_freeze_group_id_is_celerys_group_underscore_freeze_gid() -> None:
    app = Celery("t", set_as_current=False)
    members = group([Signature("t.x", app=app)], app=app, queue="q")
    merged, group_id, root_id = freeze_group_id(members, {"task_id": "gid", "priority": 3})
    assert (merged, group_id, root_id) == (
        {"queue": "q", "priority": 3, "group_id": "gid"},
        "gid",
        None,
    )


_scalars = st.one_of(
    st.integers(),
    st.text(st.characters(codec="utf-8"), max_size=12),
    st.text("ab'\\\" c", max_size=6),
)


@given(
    st.one_of(
        st.lists(_scalars, max_size=6).map(tuple),
        st.lists(_scalars, max_size=6),
        st.dictionaries(st.text("abcxyz_'", max_size=5), _scalars, max_size=5),
    ),
    st.sampled_from([8, 40, 1024]),
)
def test_argument_reprs_are_what_as_task_v2_writes(value: Any, limit: int) -> None:
    app = Celery("t", set_as_current=False)
    app.amqp.argsrepr_maxsize = app.amqp.kwargsrepr_maxsize = limit
    expected = saferepr(value, limit, maxlevels=app.conf.get("task_repr_maxlevels", 3))
    assert argument_reprs(app, value, value) == (expected, expected)


def test_sends_as_celery_only_for_celerys_own_send_of_a_plain_task() -> None:
    app = RatchetCelery("t", set_as_current=False)
    app.conf.ratchet_url = "sqlite://"
    routed = RatchetCelery("routed", set_as_current=False)
    routed.conf.update(ratchet_url="sqlite://", task_routes={"t.plain": {"queue": "elsewhere"}})

    @routed.task(name="t.plain", shared=False)
    def routed_plain() -> None: ...

    @app.task(name="t.plain", shared=False)
    def plain() -> None: ...

    class Wrapped(RatchetTask):
        def apply_async(self, *args: Any, **kwargs: Any) -> Any:  # a send of its own
            return super().apply_async(*args, **kwargs)

    @app.task(name="t.wrapped", base=Wrapped, shared=False)
    def wrapped() -> None: ...

    assert sends_as_celery(app, app.tasks["t.plain"])
    assert not sends_as_celery(app, app.tasks["t.wrapped"])
    assert not sends_as_celery(routed, routed.tasks["t.plain"])
