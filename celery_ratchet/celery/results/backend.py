"""Celery result backend reading and writing the job rows themselves.

A task's result is stored on its job row (``job_result`` as JSON, ``result_type`` the Python
type name); failures keep Celery's exception record in ``last_error``. Writes made while a
claim is held are compare-and-swaps on that claim, so a worker that lost the job cannot
overwrite what its new owner stores.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery import states
from celery.app.backends import by_url
from celery.backends.base import BaseBackend
from celery.exceptions import TimeoutError
from celery.result import GroupResult, result_from_tuple
from kombu.exceptions import EncodeError
from kombu.serialization import loads
from kombu.utils import json as kjson

from celery_ratchet.celery.canvas import batches
from celery_ratchet.celery.compat import (
    ensure_not_eager,
    in_stop_signal_handler,
    is_lazy_generator_result,
    message_ignore_result_overrides_task,
)
from celery_ratchet.celery.execution.aio import offload
from celery_ratchet.celery.execution.stopping import RUNNING, stop_mode
from celery_ratchet.celery.send.message import CLAIM_HEADER, check_serializer, safe_accept
from celery_ratchet.celery.send.sender import note_chord_opened
from celery_ratchet.celery.send.transactions import joined
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import (
    JobStatus,
    ResultRecord,
    Settlement,
    StoredResult,
    error_record,
)
from celery_ratchet.errors import ConfigurationError, StoreUnavailable
from celery_ratchet.store.celery_ports import ResultStore
from celery_ratchet.store.redact import mask_url

if TYPE_CHECKING:
    from celery_ratchet.runtime.worker import WorkerRuntime

logger = logging.getLogger(__name__)

#: Results up to this many characters (encoded, with their meta) are handed to the worker's
#: settler, written with its next batch; a larger one is written by its thread at once, where
#: a refusal fails the task through Celery's failure path, as Celery's backends do.
HANDED_OVER_RESULT_MAX = 256 * 1024
#: The longest type name the ``result_type`` column takes.
RESULT_TYPE_MAX = 255


def _surely_storable(stored: StoredResult) -> bool:
    """Whether every database takes this result as it is, so that its write in the
    settler's batch cannot be refused after the task's success handlers ran."""
    texts = [t for t in (stored.value, stored.meta) if t is not None]
    return (
        sum(len(t) for t in texts) <= HANDED_OVER_RESULT_MAX
        and len(stored.type_name or "") <= RESULT_TYPE_MAX
        and not any("\x00" in t for t in texts)
    )


class _QuietStoreRetries(logging.Filter):
    """Celery logs each retry of a backend write with its traceback ("Failed operation
    _store_result. Retrying …"): dozens per outage and process. The job store logs the
    outage itself, once when it starts and once when it ends; these retries go unlogged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (
            isinstance(exc, StoreUnavailable) and str(record.msg).startswith("Failed operation")
        )


logging.getLogger("celery.backends.base").addFilter(_QuietStoreRetries())

#: First pause of AsyncResult.get() between two reads of the row; it doubles up to interval.
_FIRST_NAP = 0.005

_FINAL = {
    states.SUCCESS: JobStatus.SUCCEEDED,
    states.FAILURE: JobStatus.FAILED,
    states.REVOKED: JobStatus.REVOKED,
}
#: The Celery state of a row whose status this version does not know.
UNKNOWN_STATE = "UNKNOWN"
_CELERY_STATE = {
    JobStatus.SUCCEEDED: states.SUCCESS,
    JobStatus.FAILED: states.FAILURE,
    JobStatus.REVOKED: states.REVOKED,
    JobStatus.IGNORED: states.IGNORED,
}


def type_name(value: Any) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def exception_record(exc: BaseException) -> str:
    """Celery's JSON form of an exception, as stored in ``last_error``: its ``args``, which
    Celery rebuilds it from (``cls(*args)``), kept as JSON holds them."""
    kind = type(exc)
    messages = [_json_arg(a) for a in exc.args] if exc.args else [str(exc)]
    return error_record(kind.__qualname__, messages, kind.__module__)


def _json_arg(value: Any) -> Any:
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


class RatchetBackend(BaseBackend):
    """Results in the job store (``result_backend = "ratchet://"``, the default of ratchet apps)."""

    persistent = True
    supports_autoexpire = False

    def __init__(self, app: Any = None, url: str | None = None, **kwargs: Any) -> None:
        super().__init__(app, url=url, **kwargs)
        allow_pickle = ratchet_state(self.app).settings.allow_pickle
        check_serializer(self.serializer, allow_pickle)
        # Extended results decode a row's arguments with the row's own content type: never
        # with a serializer that can run code unless ratchet_allow_pickle is on.
        self.accept, _ = safe_accept(self.accept, allow_pickle)  # type: ignore[has-type]

    @property
    def store(self) -> ResultStore:
        return ratchet_state(self.app).store

    def as_uri(self, include_password: bool = False) -> str:
        return f"ratchet://{self.store.url if include_password else self.store.display_url}"

    def exception_safe_to_retry(self, exc: BaseException) -> bool:
        # Retried while the worker runs; once it stops, the outcome is left to orphan
        # recovery rather than hold the stop until the database returns. The cold stop's
        # handler writes (a cancelled job's retry note) before the stop is set: it is the
        # stop, and tries once.
        return (
            isinstance(exc, StoreUnavailable)
            and stop_mode() == RUNNING
            and not in_stop_signal_handler()
        )

    def _sleep(self, amount: float) -> None:
        # compat.BACKEND_RETRY_SLEEP_METHOD: a stop ends the pause between two retries.
        if in_stop_signal_handler():
            return
        deadline = time.monotonic() + amount
        while stop_mode() == RUNNING and time.monotonic() < deadline:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    # -- writing (the storage methods Celery calls: compat.BACKEND_STORAGE_METHODS) ----

    def _store_result(
        self,
        task_id: str,
        result: Any,
        state: str,
        traceback: str | None = None,
        request: Any = None,
        **kwargs: Any,
    ) -> Any:
        try:
            # On the async pool, in a thread: the event loop goes on meanwhile.
            return offload(self._write_result, task_id, result, state, traceback, request)
        except StoreUnavailable:
            if not in_stop_signal_handler():
                raise
            # Raised out of the handler, it would cut short whatever stop the signal
            # interrupted: the job is handed back, or found by orphan recovery.
            logger.warning(
                "ratchet: state %s of job %s not written during the cold stop: the job "
                "store is unreachable",
                state,
                task_id,
            )
            return result

    def _write_result(
        self, task_id: str, result: Any, state: str, traceback: str | None, request: Any
    ) -> Any:
        token = _claim_token(request)
        status = _FINAL.get(state)
        if status is None:  # STARTED, RETRY, or a custom state from update_state()
            name = getattr(request, "task", None) or ""
            # An eager run's interim states are not stored, as before (nor its result,
            # unless task_store_eager_result says so).
            eager = bool(
                getattr(request, "is_eager", False)
            ) and not self.app.conf.find_value_for_key("store_eager_result", "task")
            self._store_progress(task_id, name, token, result, state, traceback, eager)
            return result
        values: dict[str, Any] = {"result_meta": self._result_meta(request)}
        if status is JobStatus.SUCCEEDED:
            values["job_result"], values["result_type"] = self._encode_value(task_id, result)
        else:
            values["error"] = self._encode_json(result)
            values["traceback"] = traceback
        if token is not None:
            part = batches.part_of(self, request, state, result)
            if self._handed_to_settler(task_id, token, state, status, part, values):
                return result
            if not self.store.store_outcome(task_id, token, status, part=part, **values):
                logger.warning(
                    "ratchet: result of job %s not stored: the job is no longer held by this "
                    "execution (already finished, or recovered from a node presumed dead)",
                    task_id,
                )
        else:
            name = getattr(request, "task", None) or ""
            self.store.store_untracked_result(task_id, name, status, **values)
        return result

    def _handed_to_settler(
        self,
        task_id: str,
        token: str,
        state: str,
        status: JobStatus,
        part: Any,
        values: dict[str, Any],
    ) -> bool:
        """In the worker's own process (``-P threads``, ``solo``, ``gevent``), a plain
        success goes to the worker's settler, written with its next batch of outcomes as an
        ignored result's success is: one statement for the successes of all its threads.
        True when nothing is left for this thread to write."""
        runtime = self._runtime_here()
        if runtime is None:
            return False
        # The first outcome of an execution wins; a chord member's goes on to the write,
        # whose compare-and-swap decides, so that its part is counted only with its row.
        if part is None and runtime.unwritten(task_id, token):
            logger.warning(
                "ratchet: state %s of job %s not stored: an earlier outcome of this "
                "execution was reported first",
                state,
                task_id,
            )
            return True
        if status is not JobStatus.SUCCEEDED or part is not None:
            return False
        stored = StoredResult(values["job_result"], values["result_type"], values["result_meta"])
        if not _surely_storable(stored):
            return False
        runtime.report_result(Settlement(task_id, token, status, result=stored))
        return True

    def _runtime_here(self) -> WorkerRuntime | None:
        """The worker's runtime where outcomes reported here reach its settler: this is
        the worker's own process (``-P threads``, ``solo``, ``gevent``), not a pool process."""
        runtime = ratchet_state(self.app).runtime
        return runtime if runtime is not None and runtime.keeps_outcomes_here() else None

    def mark_as_failure(
        self,
        task_id: str,
        exc: Any,
        traceback: str | None = None,
        request: Any = None,
        store_result: bool = True,
        call_errbacks: bool = True,
        state: str = states.FAILURE,
    ) -> Any:
        """Celery's, and the members of a group chained after the failed task fail too.

        Celery fails the steps chained after a failure by their ids, and a group's id is
        not what its GroupResult waits for: its members would stay PENDING, and
        ``get()`` on the chain's result would wait for ever."""
        outcome = super().mark_as_failure(
            task_id, exc, traceback, request, store_result, call_errbacks, state
        )
        if store_result and request is not None:
            for member in _group_members(getattr(request, "chain", None)):
                self.store_result(member, exc, state, traceback=traceback)
        return outcome

    def _store_progress(
        self,
        task_id: str,
        name: str,
        token: str | None,
        result: Any,
        state: str,
        traceback: str | None,
        eager: bool = False,
    ) -> None:
        if state == states.RETRY:
            noted = self.store.note_retry(task_id, self._encode_json(result), traceback)
            if noted or token is not None or eager:
                return
            # No job of the store is waiting for it: a task another process runs retries,
            # reported through this backend; kept as any interim state from outside, its
            # exception in JSON's form whatever the result serializer made of it.
            if isinstance(result, BaseException):
                result = self.prepare_exception(result, "json")
        meta = self._encode_json({"state": state, "result": result})
        if token is not None:
            self.store.store_progress(task_id, token, meta, started=state == states.STARTED)
        elif not eager:  # another process runs the task and reports through this backend
            self.store.store_untracked_result(
                task_id, name, JobStatus.EXTERNAL, result_meta=meta, traceback=traceback
            )

    def _encode_json(self, value: Any) -> str | None:
        if value is None:
            return None
        try:
            return str(kjson.dumps(value))
        except TypeError:
            return str(kjson.dumps(repr(value)))

    def _encode_value(self, task_id: str, value: Any) -> tuple[str | None, str | None]:
        if value is None:
            return None, None
        try:
            encoded = self.encode(value)
        except (EncodeError, TypeError, ValueError) as exc:
            logger.warning(
                "ratchet: result of job %s (a %s) cannot be serialised as %s and is not "
                "stored; the job still succeeded: %s",
                task_id,
                type_name(value),
                self.serializer,
                exc,
            )
            return None, type_name(value)
        text = encoded.decode(self.content_encoding) if isinstance(encoded, bytes) else encoded
        return text, type_name(value)

    def _result_meta(self, request: Any) -> str | None:
        children = self.current_task_children(request)
        return self._encode_json({"children": children}) if children else None

    # -- reading ----------------------------------------------------------------------------

    def _get_task_meta_for(self, task_id: str) -> dict[str, Any]:
        record = self.store.result(task_id)
        if record is None:
            legacy = self._legacy()
            if legacy is not None:  # a task sent before the cutover, to the old backend
                meta: dict[str, Any] = legacy.get_task_meta(task_id)
                return meta
            return {"status": states.PENDING, "result": None, "task_id": task_id}
        return self._meta(record)

    def _legacy(self) -> Any:
        """The backend of ``ratchet_legacy_result_backend_url``, made on first use; None
        without one."""
        url = ratchet_state(self.app).settings.legacy_result_backend_url
        if url is None:
            return None
        made = getattr(self, "_legacy_backend", None)
        if made is None or made[0] != url:
            backend_class, backend_url = by_url(url, self.app.loader)
            if issubclass(backend_class, RatchetBackend):
                raise ConfigurationError(
                    f"ratchet_legacy_result_backend_url = {mask_url(url)!r} is the job store's "
                    "own backend: name the result backend the fleet used before the cutover"
                )
            made = (url, backend_class(app=self.app, url=backend_url))
            self._legacy_backend = made
        return made[1]

    def _meta(self, record: ResultRecord) -> dict[str, Any]:
        extra = _extra_of(record)
        state, result = self._state_and_result(record, extra)
        meta: dict[str, Any] = {
            "task_id": record.job_id,
            "status": state,
            "result": result,
            "traceback": record.error_traceback if state in states.EXCEPTION_STATES else None,
            "children": extra.get("children") or [],
            "date_done": record.finished_at if isinstance(record.finished_at, datetime) else None,
        }
        if self.app.conf.find_value_for_key("extended", "result"):
            args, kwargs = self._arguments(record)
            meta.update(
                name=record.task_name,
                args=args,
                kwargs=kwargs,
                worker=record.picked_by,
                retries=record.attempts,
                queue=record.queue,
            )
        return meta

    def _state_and_result(self, record: ResultRecord, extra: dict[str, Any]) -> tuple[str, Any]:
        status = record.status
        if not isinstance(status, JobStatus):
            # A status this version does not know (a row written by hand or by a newer
            # version): not ready, not an error; the job's own text stays in the store.
            return UNKNOWN_STATE, None
        if status is JobStatus.SUCCEEDED:
            if (
                record.job_result is None
                and record.result_type is None
                and _ignored(self.app, record)
            ):
                # Sent with ignore_result: Celery stores nothing, and such a result reads
                # PENDING for ever; the row's own status stays for the store's bookkeeping.
                return states.PENDING, None
            value = self.decode(record.job_result) if record.job_result is not None else None
            return states.SUCCESS, value
        if status in (JobStatus.FAILED, JobStatus.REVOKED):
            return _CELERY_STATE[status], self._exception(record.last_error)
        if status is JobStatus.IGNORED:
            return states.IGNORED, None
        if status in (JobStatus.RUNNING, JobStatus.EXTERNAL) and "state" in extra:
            state, value = extra["state"], extra.get("result")
            if state in states.EXCEPTION_STATES and isinstance(value, dict) and "exc_type" in value:
                value = self.exception_to_python(value)
            return state, value
        if status is JobStatus.PENDING and record.attempts > 0 and record.last_error:
            return states.RETRY, self._exception(record.last_error)
        return states.PENDING, None

    def _exception(self, stored: str | None) -> BaseException | None:
        if not stored:
            return None
        try:
            record = kjson.loads(stored)
        except ValueError:
            record = stored
        if isinstance(record, dict) and "exc_type" in record:
            return self.exception_to_python(record)
        return Exception(str(record))

    def _arguments(self, record: ResultRecord) -> tuple[Any, Any]:
        if not record.payload or not record.content_type:
            return None, None
        try:
            body = loads(
                record.payload, record.content_type, record.content_encoding, accept=self.accept
            )
        except Exception:
            return None, None
        if not isinstance(body, (list, tuple)) or len(body) < 2:
            return None, None
        return body[0], body[1]

    def wait_for(
        self,
        task_id: str,
        timeout: float | None = None,
        interval: float = 0.5,
        no_ack: bool = True,
        on_interval: Any = None,
    ) -> dict[str, Any]:
        """``AsyncResult.get()``: poll the row, first every 5 ms and then less often, up to
        ``interval`` — a result that is ready soon is seen soon, a slow one costs little."""
        ensure_not_eager(self)
        started = last_interval = time.monotonic()
        nap = min(_FIRST_NAP, interval)
        while True:
            meta = self.get_task_meta(task_id)
            if meta["status"] in states.READY_STATES:
                if on_interval and meta["status"] in states.PROPAGATE_STATES:
                    on_interval()  # a failed parent raises its own error first, as in Celery
                return meta
            # Parents are checked at Celery's own pace (every ``interval``), not at every
            # quick read: a failure reaches the result awaited before its parents are blamed.
            if on_interval and time.monotonic() - last_interval >= interval:
                on_interval()
                last_interval = time.monotonic()
            elapsed = time.monotonic() - started
            if timeout is not None and elapsed >= timeout:
                raise TimeoutError("The operation timed out.")
            time.sleep(nap if timeout is None else max(0.0, min(nap, timeout - elapsed)))
            nap = min(nap * 2, interval)

    # -- the rest of Celery's backend contract ----------------------------------------------

    def _forget(self, task_id: str) -> None:
        self.store.forget(task_id)

    def _save_group(self, group_id: str, result: Any) -> Any:
        self.store.save_group(group_id, str(self.encode({"result": result.as_tuple()})))
        return result

    def _restore_group(self, group_id: str) -> dict[str, Any] | None:
        stored = self.store.load_group(group_id)
        if stored is None:
            return None
        meta = self.decode(stored)
        meta["result"] = result_from_tuple(meta["result"], self.app)
        return meta

    def _delete_group(self, group_id: str) -> None:
        self.store.delete_group(group_id)

    # -- chords: completed by the database (celery_ratchet.celery.canvas.batches) -----------------

    def apply_chord(self, header_result_args: Any, body: Any, **kwargs: Any) -> None:
        self.ensure_chords_allowed()
        created = batches.open_chord(self.app, header_result_args[0], body)
        # A header with groups inside (a chain ending in a group): keep its shape, so the
        # body gets nested results, as Celery's Redis backend does.
        if not is_lazy_generator_result(header_result_args[1]):
            header = self.app.GroupResult(*header_result_args)
            if any(isinstance(r, GroupResult) for r in header.results):
                header.save(backend=self)
        if created:  # the header is written next: refused, it takes the row with it
            note_chord_opened(header_result_args[0])

    def set_chord_size(self, group_id: str, chord_size: int) -> None:
        with joined(self.app) as unit:
            ratchet_state(self.app).batches.set_total(group_id, chord_size, unit)

    def add_to_chord(self, chord_id: str, result: Any) -> None:
        with joined(self.app) as unit:
            ratchet_state(self.app).batches.add_children(chord_id, 1, unit)

    def on_chord_part_return(self, request: Any, state: str, result: Any, **kwargs: Any) -> None:
        batches.on_part_return(self, request, state, result, _claim_token(request))

    def cleanup(self) -> None:
        """Clear stored return values older than ``result_expires`` (the rows stay)."""
        if self.expires:
            self.store.expire_results(float(self.expires))


def _ignored(app: Any, record: ResultRecord) -> bool:
    """The job's result is ignored, as the installed Celery's worker decides it: the
    message's ``ignore_result`` and the task's own (when registered here); see
    :func:`~celery_ratchet.celery.compat.message_ignore_result_overrides_task`."""
    try:
        headers = kjson.loads(record.headers) if record.headers else None
    except ValueError:
        headers = None
    flag = headers.get("ignore_result") if isinstance(headers, dict) else None
    if flag is True:
        return True
    if flag is None or not message_ignore_result_overrides_task():
        task = app.tasks.get(record.task_name)
        return getattr(task, "ignore_result", False) is True
    return False


def _group_members(chain: Any) -> list[str]:
    """Task ids of the members of the groups in a request's remaining chain, nested ones
    included (a member that is itself a group or a chain is looked into)."""
    if not isinstance(chain, (list, tuple)):
        return []
    found: list[str] = []
    signatures = [s for s in chain if isinstance(s, dict) and s.get("subtask_type") == "group"]
    while signatures:
        signature = signatures.pop()
        kwargs = signature.get("kwargs") or {}
        members = kwargs.get("tasks") or []
        for member in members if isinstance(members, (list, tuple)) else []:
            if not isinstance(member, dict):
                continue
            if member.get("subtask_type") == "group":
                signatures.append(member)
            elif member.get("subtask_type") is None:
                member_id = (member.get("options") or {}).get("task_id")
                if isinstance(member_id, str):
                    found.append(member_id)
    return found


def _claim_token(request: Any) -> str | None:
    if request is None:
        return None
    token = getattr(request, CLAIM_HEADER, None)
    if token is None and isinstance(getattr(request, "headers", None), dict):
        token = request.headers.get(CLAIM_HEADER)
    return token


def _extra_of(record: ResultRecord) -> dict[str, Any]:
    """The row's result meta (interim state, children); empty where none could be read: a
    meta stored as its repr, or one written by hand that is no JSON object."""
    if not record.result_meta:
        return {}
    try:
        extra = kjson.loads(record.result_meta)
    except ValueError:
        return {}
    return extra if isinstance(extra, dict) else {}
