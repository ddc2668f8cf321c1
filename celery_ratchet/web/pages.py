"""The dashboard's pages: each reads through the same store operations as the CLI's
listings (``ratchet stats``, ``jobs``, ``dlq``, ``schedules``, ``batches``, ``nodes``) and
returns the body of its page as HTML."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery_ratchet.domain.batch import BatchState, shown_value
from celery_ratchet.domain.job import JobStatus, parse_status, shown_status
from celery_ratchet.runtime import recurring
from celery_ratchet.runtime.dlq import DeadLetterQueue
from celery_ratchet.store.batches import BatchStore
from celery_ratchet.store.inspection import Inspection
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.web.render import bar, button, chart, esc, fields, link, table

PAGE_SIZE = 50
_STATUSES = [s.value for s in JobStatus]


class NotFound(LookupError):
    """The page names a job or batch the store does not hold."""


class BadRequest(ValueError):
    """A value of the request's own query cannot be used (answered 400)."""


@dataclass(frozen=True)
class View:
    store: JobStore
    csrf: str
    read_only: bool

    def button(self, action: str, label: str, **values: str) -> str:
        return button(action, label, self.csrf, values, read_only=self.read_only)


def _stored(status: str) -> str:
    """A status column's text as listings print it (an unknown one says so)."""
    return shown_status(parse_status(status))


def _status_order(status: str) -> tuple[int, str]:
    return (_STATUSES.index(status) if status in _STATUSES else len(_STATUSES), status)


def _one(query: Mapping[str, list[str]], name: str) -> str | None:
    """The value as sent: never stripped; only "" is none."""
    found = query.get(name)
    return found[0] if found and found[0] != "" else None


def overview(view: View, query: Mapping[str, list[str]]) -> str:
    stats = view.store.queue_stats()
    per_minute = Inspection(view.store).finished_per_minute(60)
    per_status: dict[str, int] = {}
    queues: dict[str, dict[str, int]] = {}
    for row in stats["counts"]:
        per_status[row["status"]] = per_status.get(row["status"], 0) + row["count"]
        queues.setdefault(row["queue"], {})[row["status"]] = row["count"]
    status_rows = [
        [link("/jobs", _stored(s), status=s), esc(per_status.get(s, 0))]
        for s in sorted(per_status, key=_status_order)
    ]
    shown = ("PENDING", "WAITING", "RUNNING", "SUCCEEDED", "FAILED", "REVOKED")
    queue_rows = [
        [
            link("/jobs", q, queue=q),
            *[esc(counts.get(s, 0)) for s in shown],
            esc(stats["oldest_pending_seconds"].get(q, "")),
        ]
        for q, counts in sorted(queues.items())
    ]
    return (
        "<h2>Jobs per status</h2>"
        + table(["status", "count"], status_rows)
        + "<h2>Queues</h2>"
        + table(["queue", *[s.lower() for s in shown], "oldest due (s)"], queue_rows)
        + f"<h2>Finished per minute, last hour ({sum(per_minute)} in all)</h2>"
        + chart(per_minute)
    )


def jobs(view: View, query: Mapping[str, list[str]]) -> str:
    status = _one(query, "status")
    wanted = {
        "status": status,
        "task": _one(query, "task"),
        "queue": _one(query, "queue"),
        "tag": _one(query, "tag"),
        "key": _one(query, "key"),
    }
    if status is not None and status.upper() not in _STATUSES:
        raise BadRequest(f"status {status!r}: one of {', '.join(_STATUSES)}")
    before = _one(query, "before")
    if before is not None and not Inspection(view.store).job_exists(before):
        raise BadRequest(
            f"before={before!r}: no such job (archived or deleted); start again from /jobs"
        )
    found = view.store.list_jobs(
        status=JobStatus(status.upper()) if status else None,
        task_name=wanted["task"],
        queue=wanted["queue"],
        tag=wanted["tag"],
        business_key=wanted["key"],
        limit=PAGE_SIZE + 1,
        before_job_id=before,
    )
    more, found = len(found) > PAGE_SIZE, found[:PAGE_SIZE]
    rows = [
        [
            link("/job", j.job_id, id=j.job_id),
            esc(j.task_name),
            esc(j.queue),
            esc(shown_status(j.status)),
            esc(j.priority),
            esc(j.attempts),
            esc(j.scheduled_time),
            esc(j.finished_at),
            esc(j.business_key),
            esc((j.tags or "").strip(",")),
        ]
        for j in found
    ]
    options = "".join(
        f"<option{' selected' if s == (status or '').upper() else ''}>{s}</option>"
        for s in ["", *_STATUSES]
    )
    inputs = "".join(
        f'<label>{name} <input name="{name}" value="{esc(wanted[name])}"></label> '
        for name in ("task", "queue", "tag", "key")
    )
    form = (
        f'<form method="get" action="/jobs"><label>status <select name="status">{options}'
        f"</select></label> {inputs}<button>filter</button></form>"
    )
    pager = ""
    if more:
        pager = "<p>" + link("/jobs", "older →", **wanted, before=found[-1].job_id) + "</p>"
    columns = ["job", "task", "queue", "status", "priority", "attempts", "due", "finished",
               "business key", "tags"]  # fmt: skip
    return form + table(columns, rows) + pager


def job(view: View, query: Mapping[str, list[str]]) -> str:
    job_id = _one(query, "id")
    record = view.store.result(job_id) if job_id else None
    links = Inspection(view.store).job_links(job_id) if job_id else None
    if record is None or links is None:
        raise NotFound(f"no job {job_id!r}")
    letter = DeadLetterQueue(view.store).show(record.job_id)
    summary: dict[str, Any] = {
        "job_id": record.job_id,
        "task": record.task_name,
        "queue": record.queue,
        "status": shown_status(record.status),
        "attempts": record.attempts,
        "claims": links["claims"],
        "priority": links["priority"],
        "due": links["scheduled_time"],
        "created": links["created_at"],
        "started": links["started_at"],
        "finished": record.finished_at,
        "worker": record.picked_by,
        "business key": links["business_key"],
        "resource": links["resource"],
        "tags": (links["tags"] or "").strip(","),
    }
    body = fields(summary)
    related = [
        ["batch", link("/batch", links["group_id"], id=links["group_id"])]
        if links["group_id"]
        else None,
        ["waits on (chain)", link("/job", links["depends_on"], id=links["depends_on"])]
        if links["depends_on"]
        else None,
        ["root", link("/job", links["root_id"], id=links["root_id"])]
        if links["root_id"] and links["root_id"] != record.job_id
        else None,
        ["parent", link("/job", links["parent_id"], id=links["parent_id"])]
        if links["parent_id"]
        else None,
    ]
    related += [
        ["next step (chain)", link("/job", d, id=d) + " " + esc(_stored(s))]
        for d, s in links["dependents"]
    ]
    shown_related = [r for r in related if r]
    if shown_related:
        body += "<h2>Chain and batch</h2>" + table(["", "job"], shown_related)
    args = letter.args if letter else None
    kwargs = letter.kwargs if letter else None
    if letter is None and record.payload is not None:
        body += "<h2>Payload</h2><pre>" + esc(record.payload.decode("utf-8", "replace")) + "</pre>"
    else:
        body += f"<h2>Arguments</h2><pre>args: {esc(args)}\nkwargs: {esc(kwargs)}</pre>"
    if record.job_result is not None:
        body += f"<h2>Result</h2><pre>{esc(record.job_result)}</pre>"
    if record.last_error:
        body += f"<h2>Error</h2><pre>{esc(record.last_error)}</pre>"
    if record.error_traceback:
        body += f"<h2>Traceback</h2><pre>{esc(record.error_traceback)}</pre>"
    log = view.store.job_log(record.job_id)
    if log:
        body += "<h2>Log</h2>" + table(
            ["at", "level", "message"], [[esc(a), esc(lv), esc(m)] for a, lv, m in log]
        )
    if letter is not None:
        body += view.button("/dlq/retry", "retry", job_id=record.job_id)
    return body


def dlq(view: View, query: Mapping[str, list[str]]) -> str:
    task = _one(query, "task")
    letters = DeadLetterQueue(view.store)
    found = letters.list(task_name=task, limit=PAGE_SIZE)
    alerts = letters.alerts_of(found)
    rows = [
        [
            link("/job", j.job_id, id=j.job_id),
            link("/dlq", j.task_name, task=j.task_name),
            esc(j.queue),
            esc(j.attempts),
            esc(j.finished_at),
            esc(alerts[j.job_id]),
            esc(j.last_error),
            view.button("/dlq/retry", "retry", job_id=j.job_id)
            + view.button("/dlq/purge", "purge", job_id=j.job_id),
        ]
        for j in found
    ]
    actions = ""
    if not view.read_only and found:
        if task:
            actions += view.button("/dlq/retry-task", f"retry every failed {task}", task=task)
            actions += view.button("/dlq/purge", f"purge every failed {task}", task=task)
        else:
            actions += view.button("/dlq/purge", "purge every failed job", everything="1")
    heading = f"<p>only {esc(task)} · {link('/dlq', 'all tasks')}</p>" if task else ""
    columns = ["job", "task", "queue", "attempts", "finished", "alert", "error", ""]
    return heading + table(columns, rows) + actions


def confirm(view: View, action: str, values: Mapping[str, str], what: str) -> str:
    """The confirmation step of a destructive action: the same POST, with ``confirmed``."""
    return (
        f"<p>{esc(what)}?</p>"
        + view.button(action, "yes, " + what, **values, confirmed="yes")
        + " "
        + link("/", "no, go back")
    )


def schedules(view: View, query: Mapping[str, list[str]]) -> str:
    rows = []
    for s in recurring.describe(view.store, with_last_fire=True):
        key = s["business_key"]
        last = s["last_fire"]
        fired = (
            link("/job", last[0], id=recurring.occurrence_id(recurring.master_id(key), last[0]))
            + " "
            + esc(shown_status(last[1]))
            if last
            else "—"
        )
        actions = (
            view.button("/schedules/resume", "resume", key=key)
            if s["status"] == JobStatus.PAUSED.value
            else view.button("/schedules/pause", "pause", key=key)
        ) + view.button("/schedules/remove", "remove", key=key)
        rows.append(
            [
                esc(key),
                esc(s["task"]),
                esc(s["schedule"]),
                esc(s["zone"]),
                esc(s["status"]),
                "<br>".join(esc(t) for t in s["upcoming"]),
                fired,
                esc(s["misfire"]),
                esc(s["queue"]),
                actions,
            ]
        )
    columns = ["schedule", "task", "when", "zone", "status", "next 5 fire times", "last fire",
               "misfire", "queue", ""]  # fmt: skip
    return table(columns, rows)


def batches(view: View, query: Mapping[str, list[str]]) -> str:
    state = _one(query, "state")
    known = [s.value for s in BatchState]
    if state is not None and state.upper() not in known:
        raise BadRequest(f"state {state!r}: one of {', '.join(known)}")
    wanted = BatchState(state.upper()) if state else None
    found = BatchStore(view.store).summaries(state=wanted, limit=PAGE_SIZE)
    rows = [
        [
            link("/batch", b.batch_id, id=b.batch_id),
            esc(shown_value(b.kind)),
            esc(b.name),
            esc(shown_value(b.state)),
            f"{esc(b.done)} / {esc(b.total if b.total is not None else '?')}",
            esc(b.failed),
            bar(b.percent_done, bad=b.failed > 0),
            esc(b.created_at),
        ]
        for b in found
    ]
    return table(["batch", "kind", "name", "state", "done", "failed", "progress", "created"], rows)


def batch(view: View, query: Mapping[str, list[str]]) -> str:
    batch_id = _one(query, "id")
    found = BatchStore(view.store).summaries(batch_id=batch_id, limit=1) if batch_id else []
    if not found or batch_id is None:
        raise NotFound(f"no batch {batch_id!r}")
    b = found[0]
    children = Inspection(view.store).children_by_status(batch_id)
    child_rows = [
        [esc(_stored(s)), esc(n)]
        for s, n in sorted(children.items(), key=lambda item: _status_order(item[0]))
    ]
    return (
        fields(
            {
                "batch": b.batch_id,
                "kind": shown_value(b.kind),
                "name": b.name,
                "state": shown_value(b.state),
                "done": b.done,
                "total": b.total,
                "failed": b.failed,
                "created": b.created_at,
                "finished": b.finished_at,
            }
        )
        + "<p>"
        + bar(b.percent_done, bad=b.failed > 0)
        + "</p><h2>Children by status</h2>"
        + table(["status", "children"], child_rows)
    )


def resources(view: View, query: Mapping[str, list[str]]) -> str:
    rows = []
    for r in Inspection(view.store).resources():
        held = r["held"]
        capacity = r["capacity"]
        holders = "<br>".join(
            link("/job", h["job_id"], id=h["job_id"])
            + f" on {esc(h['node_id'])} since {esc(h['acquired_at'])}"
            for h in held
        )
        percent = 100.0 * len(held) / capacity if capacity else 0.0
        rows.append(
            [esc(r["resource"]), esc(capacity), esc(len(held)), bar(percent), holders or "—"]
        )
    return table(["resource", "capacity", "permits held", "in use", "held by"], rows)


def nodes(view: View, query: Mapping[str, list[str]]) -> str:
    now = Inspection(view.store).database_now()
    running: dict[str, list[str]] = {}
    for j in view.store.list_jobs(status=JobStatus.RUNNING, limit=500):
        running.setdefault(j.picked_by or "", []).append(j.job_id)
    rows = []
    for n in view.store.list_nodes():
        beat = n.get("heartbeat_ts")
        age = f"{(now - beat).total_seconds():.0f} s" if isinstance(beat, datetime) else ""
        ids = running.get(n["node_id"], [])
        rows.append(
            [
                esc(n["node_id"]),
                esc(n.get("hostname")),
                esc(n.get("pid")),
                esc(n.get("queues")),
                esc(n.get("concurrency")),
                esc(beat),
                esc(age),
                esc(n.get("running")),
                "<br>".join(link("/job", i, id=i) for i in ids[:20]),
            ]
        )
    columns = ["node", "host", "pid", "queues", "concurrency", "heartbeat", "age", "running",
               "running jobs"]  # fmt: skip
    return table(columns, rows)
