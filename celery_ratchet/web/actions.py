"""The dashboard's actions, each an operation the CLI or Celery's remote control makes:
``ratchet jobs cancel`` (:meth:`request_revoke`: pending jobs never run, running ones are
dropped or terminated by their node), ``ratchet dlq retry/purge``
(:class:`~celery_ratchet.runtime.dlq.DeadLetterQueue`), ``ratchet schedules ...``
(:mod:`celery_ratchet.runtime.recurring`), and the workers' own remote control commands
(``celery control pool_grow`` ...), broadcast through the store (:mod:`.workers`).

An action that destroys or stops something asks first: the same POST comes back with
``confirmed=yes``."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

from celery_ratchet.domain.job import error_record
from celery_ratchet.domain.queue_pause import checked_name, checked_reason
from celery_ratchet.runtime import recurring
from celery_ratchet.runtime.dlq import DeadLetterQueue
from celery_ratchet.store.ports import ScheduleStore
from celery_ratchet.store.read_ports import DashboardStore
from celery_ratchet.web.pages import PAGES, BadRequest, NotFound
from celery_ratchet.web.workers import Workers

Form = Mapping[str, list[str]]
#: Most jobs one bulk action takes (a page of the list holds 50).
MAX_BULK = 500
_RATE = re.compile(r"^\d+(\.\d+)?(/[smh])?$")


@dataclass(frozen=True)
class Done:
    """Go to ``target`` and show ``note``."""

    target: str
    note: str
    query: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Confirm:
    """Ask before doing ``what``: the same POST to ``action`` with ``values``, and with
    ``inputs`` (name, label, value) the one asked may fill in on the way."""

    action: str
    what: str
    values: list[tuple[str, str]]
    back: str
    inputs: list[tuple[str, str, str]] = field(default_factory=list)


def _field(form: Form, name: str) -> str | None:
    found = form.get(name)
    return found[0] if found and found[0] != "" else None


def _required(form: Form, name: str) -> str:
    value = _field(form, name)
    if value is None:
        raise BadRequest(f"the form has no {name}")
    return value


def _ids(form: Form) -> list[str]:
    ids = list(dict.fromkeys(v for v in form.get("job_id", []) if v))
    if not ids:
        raise BadRequest("no job chosen: tick the jobs to act on")
    if len(ids) > MAX_BULK:
        raise BadRequest(f"{len(ids)} jobs at once: at most {MAX_BULK}")
    return ids


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _back(form: Form, default: str) -> str:
    """Where the form came from: a page of this dashboard, with its query, else ``default``.
    Nothing else: a browser reads ``/\\host``, ``/\t/host`` or ``//host`` as another site,
    and ``/../`` leaves the prefix the dashboard is mounted under."""
    back = _field(form, "back")
    path, _, query = (back or "").partition("?")
    if path not in PAGES:
        return default
    kept = urlencode(parse_qsl(query))
    return f"{path}?{kept}" if kept else path


def _positive(form: Form, name: str, most: int = 1000) -> int:
    text = _required(form, name)
    if not text.isdigit() or not 1 <= int(text) <= most:
        raise BadRequest(f"{name}={text!r}: a whole number from 1 to {most}")
    return int(text)


def _seconds(form: Form, name: str) -> float | None:
    text = _field(form, name)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 86400 * 7:
        raise BadRequest(f"{name}={text!r}: seconds, more than 0 and at most a week")
    return value


class Actions:
    def __init__(self, store: DashboardStore, workers: Workers) -> None:
        self.store = store
        self.workers = workers
        self._table: dict[str, Callable[[Form], Done | Confirm]] = {
            "/jobs/cancel": self._cancel,
            "/jobs/terminate": self._terminate,
            "/dlq/retry": self._retry,
            "/dlq/retry-task": self._retry_task,
            "/dlq/purge": self._purge,
            "/schedules/pause": self._schedule(recurring.pause, "paused"),
            "/schedules/resume": self._schedule(recurring.resume, "resumed"),
            "/schedules/run": self._schedule(
                recurring.run_now, "due now; the next worker to look fires it"
            ),
            "/schedules/remove": self._schedule(recurring.cancel, "removed", confirm=True),
            "/queues/purge": self._purge_queue,
            "/queues/pause": self._pause_queue,
            "/queues/resume": self._resume_queue,
            "/nodes/pool-grow": self._pool("pool_grow"),
            "/nodes/pool-shrink": self._pool("pool_shrink"),
            "/nodes/autoscale": self._autoscale,
            "/nodes/add-consumer": self._consumer("add_consumer"),
            "/nodes/cancel-consumer": self._consumer("cancel_consumer"),
            "/nodes/shutdown": self._shutdown,
            "/tasks/rate-limit": self._rate_limit,
            "/tasks/time-limit": self._time_limit,
        }

    @property
    def paths(self) -> frozenset[str]:
        """The paths of every action (each one writes to the job store)."""
        return frozenset(self._table)

    def run(self, path: str, form: Form) -> Done | Confirm:
        action = self._table.get(path)
        if action is None:
            raise NotFound(f"no action {path}")
        return action(form)

    # -- jobs ---------------------------------------------------------------------------------

    def _revoke(self, form: Form, *, terminate: bool) -> Done | Confirm:
        ids = _ids(form)
        back = _back(form, "/jobs" if len(ids) > 1 else "/job")
        verb = "terminate" if terminate else "cancel"
        if _field(form, "confirmed") != "yes":
            what = f"{verb} {ids[0]}" if len(ids) == 1 else f"{verb} {_count(len(ids), 'job')}"
            values = [("job_id", i) for i in ids] + [("back", back)]
            return Confirm(f"/jobs/{verb}", what, values, back)
        done = {"cancel": "cancelled", "terminate": "terminated"}[verb]
        error = error_record(
            "TaskRevokedError", [f"{done} from the dashboard"], "celery.exceptions"
        )
        pending, running = self.store.request_revoke(
            ids, error, terminate_signal="SIGTERM" if terminate else None
        )
        note = f"{done}: {pending} not started yet (revoked), {running} running " + (
            "(their workers terminate them)" if terminate else "(dropped if not started yet)"
        )
        untouched = len(ids) - pending - running
        if untouched:
            note += f"; {untouched} already finished, left alone"
        query = {"id": ids[0]} if back == "/job" else {}
        return Done(back, note, query)

    def _cancel(self, form: Form) -> Done | Confirm:
        return self._revoke(form, terminate=False)

    def _terminate(self, form: Form) -> Done | Confirm:
        return self._revoke(form, terminate=True)

    # -- dead letters ---------------------------------------------------------------------------

    def _retry(self, form: Form) -> Done | Confirm:
        ids = _ids(form)
        count = DeadLetterQueue(self.store).retry(*ids)
        return Done(_back(form, "/dlq"), f"requeued {_count(count, 'job')}")

    def _retry_task(self, form: Form) -> Done | Confirm:
        task = _required(form, "task")
        if _field(form, "confirmed") != "yes":
            return Confirm(
                "/dlq/retry-task", f"requeue every failed {task}", [("task", task)], "/dlq"
            )
        count = DeadLetterQueue(self.store).retry_all(task_name=task)
        return Done("/dlq", f"requeued {_count(count, 'job')} of {task}")

    def _purge(self, form: Form) -> Done | Confirm:
        ids = list(dict.fromkeys(v for v in form.get("job_id", []) if v))
        task = _field(form, "task")
        if not (ids or task or _field(form, "everything") == "1"):
            raise BadRequest("purge: name a job_id or a task, or post everything=1")
        if len(ids) > MAX_BULK:
            raise BadRequest(f"{len(ids)} jobs at once: at most {MAX_BULK}")
        back = _back(form, "/dlq")
        if _field(form, "confirmed") != "yes":
            if ids:
                what = (
                    f"delete failed job {ids[0]}"
                    if len(ids) == 1
                    else f"delete {_count(len(ids), 'failed job')}"
                )
                values = [("job_id", i) for i in ids]
            elif task:
                what, values = f"delete every failed {task}", [("task", task)]
            else:
                what, values = "delete every failed job", [("everything", "1")]
            return Confirm("/dlq/purge", what, [*values, ("back", back)], back)
        count = DeadLetterQueue(self.store).purge(*ids, task_name=None if ids else task)
        return Done(back, f"deleted {_count(count, 'failed job')}")

    # -- schedules ----------------------------------------------------------------------------

    def _schedule(
        self, operation: Callable[[ScheduleStore, str], None], done: str, *, confirm: bool = False
    ) -> Callable[[Form], Done | Confirm]:
        def act(form: Form) -> Done | Confirm:
            key = _required(form, "key")
            if confirm and _field(form, "confirmed") != "yes":
                return Confirm(
                    "/schedules/remove", f"remove schedule {key}", [("key", key)], "/schedules"
                )
            operation(self.store, key)
            return Done("/schedules", f"{key}: {done}")

        return act

    # -- queues -------------------------------------------------------------------------------

    def _purge_queue(self, form: Form) -> Done | Confirm:
        queue = _required(form, "queue")
        if _field(form, "confirmed") != "yes":
            what = f"delete every pending job of queue {queue}"
            return Confirm("/queues/purge", what, [("queue", queue)], "/queues")
        count = self.store.purge_pending([queue])
        return Done("/queues", f"deleted {_count(count, 'pending job')} of {queue}")

    def _pause_queue(self, form: Form) -> Done | Confirm:
        queue = checked_name(_required(form, "queue"))
        reason = checked_reason(_field(form, "reason"))
        if _field(form, "confirmed") != "yes":
            what = f"pause queue {queue}: no worker claims from it until it is resumed"
            reason_input = ("reason", "why (shown with the pause)", reason or "")
            return Confirm("/queues/pause", what, [("queue", queue)], "/queues", [reason_input])
        paused = self.store.pause_queue(queue, reason)
        return Done("/queues", f"{queue}: {'paused' if paused else 'was paused already'}")

    def _resume_queue(self, form: Form) -> Done:
        queue = _required(form, "queue")
        resumed = self.store.resume_queue(queue)
        return Done("/queues", f"{queue}: {'resumed' if resumed else 'was not paused'}")

    # -- workers: Celery's remote control, through the store ----------------------------------

    def _tell(
        self, command: str, arguments: dict[str, Any], nodes: Sequence[str], back: str
    ) -> Done:
        replies = self.workers.command(command, arguments, nodes)
        if not replies:
            note = f"{command}: no worker answered within {self.workers.timeout:g} s"
        else:
            note = f"{command}: " + "; ".join(
                f"{name}: {_reply_text(reply)}" for name, reply in sorted(replies.items())
            )
        return Done(back, note, {"id": nodes[0]} if back == "/node" and nodes else {})

    def _node(self, form: Form) -> str:
        return _required(form, "node")

    def _pool(self, command: str) -> Callable[[Form], Done | Confirm]:
        def act(form: Form) -> Done | Confirm:
            node = self._node(form)
            n = _positive(form, "n", 100)
            return self._node_command(form, command, {"n": n}, node)

        return act

    def _node_command(self, form: Form, command: str, arguments: dict[str, Any], node: str) -> Done:
        node_id = _field(form, "node_id")
        done = self._tell(command, arguments, [node], "/node" if node_id else "/nodes")
        return Done(done.target, done.note, {"id": node_id} if node_id else {})

    def _autoscale(self, form: Form) -> Done | Confirm:
        node = self._node(form)
        most, least = _positive(form, "max", 1000), _positive(form, "min", 1000)
        if least > most:
            raise BadRequest(f"autoscale: min {least} is more than max {most}")
        return self._node_command(form, "autoscale", {"max": most, "min": least}, node)

    def _consumer(self, command: str) -> Callable[[Form], Done | Confirm]:
        def act(form: Form) -> Done | Confirm:
            node = self._node(form)
            queue = _required(form, "queue")
            if len(queue) > 255:
                raise BadRequest("queue: at most 255 characters")
            return self._node_command(form, command, {"queue": queue}, node)

        return act

    def _shutdown(self, form: Form) -> Done | Confirm:
        node = self._node(form)
        if _field(form, "confirmed") != "yes":
            values = [("node", node), ("node_id", _field(form, "node_id") or "")]
            return Confirm("/nodes/shutdown", f"shut down worker {node}", values, "/nodes")
        self.workers.command("shutdown", {}, [node])  # a worker that stops replies nothing
        return Done("/nodes", f"{node}: told to shut down (warm: its running jobs finish)")

    def _rate_limit(self, form: Form) -> Done | Confirm:
        task = _required(form, "task")
        rate = _field(form, "rate") or ""
        if rate and not _RATE.match(rate):
            raise BadRequest(f"rate={rate!r}: such as 10/m, 2/s or 100/h; empty lifts it")
        replies = self._tell(
            "rate_limit", {"task_name": task, "rate_limit": rate or None}, [], "/task"
        )
        return Done("/task", replies.note, {"name": task})

    def _time_limit(self, form: Form) -> Done | Confirm:
        task = _required(form, "task")
        soft, hard = _seconds(form, "soft"), _seconds(form, "hard")
        if soft is not None and hard is not None and soft > hard:
            raise BadRequest(f"time limit: soft {soft:g} s is more than hard {hard:g} s")
        replies = self._tell(
            "time_limit", {"task_name": task, "soft": soft, "hard": hard}, [], "/task"
        )
        return Done("/task", replies.note, {"name": task})


def _reply_text(reply: Any) -> str:
    if isinstance(reply, dict) and len(reply) == 1:
        ((kind, text),) = reply.items()
        return f"{text}" if kind == "ok" else f"{kind}: {text}"
    return str(reply)
