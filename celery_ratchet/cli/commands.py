"""Operations commands, shared by ``celery -A app ratchet`` and the standalone ``ratchet``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Any

import click

from celery_ratchet.cli.base import (
    CliContext,
    emit,
    fail,
    json_option,
    jsonable,
    pass_cli,
)
from celery_ratchet.cli.dead_letters import archive, dlq
from celery_ratchet.cli.queues import queues
from celery_ratchet.domain.batch import BatchKind, BatchState, BatchSummary, shown_value
from celery_ratchet.domain.cron import CronExpression
from celery_ratchet.domain.job import JobStatus, error_record, public_type, shown_status
from celery_ratchet.runtime import recurring
from celery_ratchet.store.batches import BatchStore
from celery_ratchet.store.ddl import DIALECTS, ddl_script
from celery_ratchet.store.inspection import Inspection
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.redact import mask_url

_STATUSES = [s.value for s in JobStatus]


@click.group("jobs", invoke_without_command=True)
@click.option("--status", type=click.Choice(_STATUSES, case_sensitive=False))
@click.option("--task", "task_name", help="Only jobs of this task name.")
@click.option("--queue")
@click.option("--tag", help="Only jobs carrying this tag.")
@click.option("--key", "business_key", help="Only jobs with this business key.")
@click.option("--limit", default=50, show_default=True)
@json_option
@click.pass_context
def jobs(
    ctx: click.Context,
    status: str | None,
    task_name: str | None,
    queue: str | None,
    tag: str | None,
    business_key: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List jobs, newest first."""
    if ctx.invoked_subcommand is not None:
        return
    store = ctx.find_object(CliContext).store  # type: ignore[union-attr]
    found = store.list_jobs(
        status=JobStatus(status.upper()) if status else None,
        task_name=task_name,
        queue=queue,
        tag=tag,
        business_key=business_key,
        limit=limit,
    )
    emit(
        [
            {**vars(j), "status": shown_status(j.status), "public_type": public_type(j.job_type)}
            for j in found
        ],
        [
            "job_id",
            "task_name",
            "queue",
            "status",
            "job_type",
            *(["public_type"] if as_json else []),
            "priority",
            "attempts",
            "scheduled_time",
            "finished_at",
            "picked_by",
            "business_key",
            "tags",
        ],
        as_json,
    )


@jobs.command("cancel")
@click.argument("job_ids", nargs=-1, required=True)
@click.option("--terminate", is_flag=True, help="Also stop running ones (prefork workers).")
@pass_cli
def jobs_cancel(cli: CliContext, job_ids: tuple[str, ...], terminate: bool) -> None:
    """Revoke jobs: pending ones never run; running ones are dropped if not started yet, and
    terminated with --terminate."""
    error = error_record("TaskRevokedError", ["cancelled"], "celery.exceptions")
    pending, running = cli.store.request_revoke(
        job_ids, error, terminate_signal="SIGTERM" if terminate else None
    )
    cli.said(f"cancelled {pending} pending, marked {running} running")
    untouched = len(job_ids) - pending - running
    if untouched:
        click.echo(f"{untouched} already finished or unknown, left alone")


@jobs.command("show")
@click.argument("job_id")
@json_option
@pass_cli
def jobs_show(cli: CliContext, job_id: str, as_json: bool) -> None:
    """Everything stored about one job."""
    record = cli.store.result(job_id)
    if record is None:
        fail(f"no job {job_id!r}")
        return
    values = {k: v for k, v in vars(record).items() if k != "payload"}
    values["status"] = shown_status(record.status)
    links = Inspection(cli.store).job_links(job_id) or {}
    values["job_type"] = links.get("job_type")
    values["public_type"] = public_type(links.get("job_type") or "")
    if record.payload is not None:
        values["payload"] = record.payload.decode("utf-8", "replace")
    log = cli.store.job_log(job_id)
    if as_json:
        shown = {k: jsonable(v) for k, v in values.items()}
        shown["log"] = [{"at": at.isoformat(), "level": lv, "message": m} for at, lv, m in log]
        click.echo(json.dumps(shown, indent=2))
        return
    for key, value in values.items():
        click.echo(f"{key:16} {jsonable(value) if value is not None else ''}")
    if log:
        click.echo("log:")
        for at, level, message in log:
            click.echo(f"  {at.isoformat()} {level:8} {message}")


@click.command("stats")
@json_option
@pass_cli
def stats(cli: CliContext, as_json: bool) -> None:
    """Jobs per status and queue, throughput over the last minute, oldest due pending job."""
    found = cli.store.queue_stats()
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    per_status: dict[str, int] = {}
    for row in found["counts"]:
        per_status[row["status"]] = per_status.get(row["status"], 0) + row["count"]
    listed = [{"status": s, "count": per_status.get(s, 0)} for s in _STATUSES]
    listed += [
        {"status": shown_status(s), "count": n}
        for s, n in sorted(per_status.items())
        if s not in _STATUSES
    ]
    emit(listed, ["status", "count"], False)
    click.echo("")
    queues = sorted({row["queue"] for row in found["counts"]})
    rows = []
    for queue in queues:
        counts = {r["status"]: r["count"] for r in found["counts"] if r["queue"] == queue}
        rows.append(
            {"queue": queue, **{s.lower(): counts.get(s, 0) for s in ("PENDING", "RUNNING",
             "SUCCEEDED", "FAILED")}, "oldest_due_s": found["oldest_pending_seconds"].get(queue)}
        )  # fmt: skip
    emit(rows, ["queue", "pending", "running", "succeeded", "failed", "oldest_due_s"], False)
    click.echo(f"\nfinished in the last minute: {found['finished_last_minute']}")


@click.command("nodes")
@json_option
@pass_cli
def nodes(cli: CliContext, as_json: bool) -> None:
    """Worker nodes with their last heartbeat and running jobs. ``state``: ``silent`` for a
    node whose heartbeat is older than ratchet_node_orphan_grace_seconds; another node
    takes its running jobs back at its next orphan scan."""
    now = cli.store.inspection.database_now()
    grace = cli.settings().node_orphan_grace_seconds
    rows = cli.store.list_nodes()
    for row in rows:
        beat = row.get("heartbeat_ts")
        age = (now - beat).total_seconds() if isinstance(beat, datetime) else None
        row["heartbeat_age_s"] = None if age is None else round(age, 1)
        row["state"] = "silent" if age is None or age > grace else "alive"
    columns = ["node_id", "hostname", "pid", "queues", "concurrency", "heartbeat_ts"]
    emit(rows, [*columns, "heartbeat_age_s", "state", "running"], as_json)


@click.group("batches", invoke_without_command=True)
@click.option("--state", type=click.Choice([s.value for s in BatchState], case_sensitive=False))
@click.option("--limit", default=50, show_default=True)
@json_option
@click.pass_context
def batches(ctx: click.Context, state: str | None, limit: int, as_json: bool) -> None:
    """Groups, chords and batches, newest first, with their progress."""
    if ctx.invoked_subcommand is not None:
        return
    cli = ctx.find_object(CliContext)
    assert cli is not None
    wanted = BatchState(state.upper()) if state else None
    found = BatchStore(cli.store).summaries(state=wanted, limit=limit)
    emit([_batch_row(b) for b in found], _BATCH_COLUMNS, as_json)


@batches.command("show")
@click.argument("batch_id")
@json_option
@pass_cli
def batches_show(cli: CliContext, batch_id: str, as_json: bool) -> None:
    """One batch's progress."""
    found = BatchStore(cli.store).summaries(batch_id=batch_id, limit=1)
    if not found:
        fail(f"no batch {batch_id!r} (a group's id, a chord's or celery_ratchet.batch()'s)")
    row = _batch_row(found[0])
    if as_json:
        click.echo(json.dumps({k: jsonable(v) for k, v in row.items()}, indent=2))
        return
    for column in _BATCH_COLUMNS:
        click.echo(f"{column:>12}: {jsonable(row[column]) if row[column] is not None else ''}")


_BATCH_COLUMNS = [
    "batch_id", "kind", "name", "state", "done", "total", "written", "failed",
    "percent_done", "created_at", "finished_at",
]  # fmt: skip


def _batch_row(summary: BatchSummary) -> dict[str, Any]:
    return {
        "batch_id": summary.batch_id,
        "kind": shown_value(summary.kind),
        "name": summary.name,
        "state": shown_value(summary.state),
        "done": summary.done,
        "total": summary.total,
        "written": summary.written if summary.kind is BatchKind.STREAM else summary.total,
        "failed": summary.failed,
        "percent_done": summary.percent_done,
        "created_at": summary.created_at,
        "finished_at": summary.finished_at,
    }


@click.group("schema")
def schema() -> None:
    """The database schema: print it, apply it, check a live database against it."""


@schema.command("show")
@click.option(
    "--dialect", type=click.Choice(sorted(DIALECTS)), help="Default: the dialect of the store URL."
)
@click.pass_context
def schema_show(ctx: click.Context, dialect: str | None) -> None:
    """Print the DDL (the same as ddl/<dialect>.sql)."""
    if dialect is None:
        dialect = ctx.find_object(CliContext).store.family  # type: ignore[union-attr]
    click.echo(ddl_script(dialect), nl=False)


@schema.command("apply")
@pass_cli
def schema_apply(cli: CliContext) -> None:
    """Create missing tables and their indexes."""
    created = cli.store_to_create().create_missing_tables()
    cli.said(f"created: {', '.join(created)}" if created else "schema up to date")


@schema.command("check")
@pass_cli
def schema_check(cli: CliContext) -> None:
    """Exit 1 when the live database lacks a table, column or index of the schema, or has
    one of its indexes invalid; an index an earlier version made is a note."""
    problems = cli.store.schema_differences()
    invalid, notes = cli.store.index_shapes()
    problems += invalid
    for problem in problems:
        click.echo(problem)
    for note in notes:
        click.echo(f"note: {note}")
    if problems:
        sys.exit(1)
    click.echo("schema matches")


@click.group("schedules", invoke_without_command=True)
@json_option
@click.pass_context
def schedules(ctx: click.Context, as_json: bool) -> None:
    """Recurring jobs with their next fire times; pause, resume or remove one."""
    if ctx.invoked_subcommand is not None:
        return
    store = ctx.find_object(CliContext).store  # type: ignore[union-attr]
    emit(
        recurring.describe(store),
        [
            "business_key",
            "name",
            "task",
            "schedule",
            "zone",
            "status",
            "next_fire",
            "misfire",
            "queue",
            "tags",
        ],
        as_json,
    )


def _schedule_action(name: str, action: Callable[[JobStore, str], None], done: str) -> None:
    @schedules.command(name)
    @click.argument("business_key")
    @pass_cli
    def command(cli: CliContext, business_key: str) -> None:
        try:
            action(cli.store, business_key)
        except (LookupError, ValueError) as exc:
            fail(str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc))
        cli.said(f"{business_key}: {done}")

    command.__doc__ = f"{done.capitalize()} the recurring job BUSINESS_KEY."


_schedule_action("pause", recurring.pause, "paused")
_schedule_action("resume", recurring.resume, "resumed")
_schedule_action("remove", recurring.cancel, "removed")


@click.group("cron")
def cron() -> None:
    """Quartz cron expressions."""


@cron.command("next")
@click.argument("expression")
@click.option("--zone", default="UTC", show_default=True, help="IANA time zone.")
@click.option("--after", "after_text", help="ISO-8601 instant to start from (default: now).")
@click.option("-n", "count", default=5, show_default=True, help="How many fire times.")
def cron_next(expression: str, zone: str, after_text: str | None, count: int) -> None:
    """Print the next fire times of EXPRESSION, one a line: UTC, then local."""
    try:
        parsed = CronExpression(expression, zone)
        after = datetime.fromisoformat(after_text) if after_text else datetime.now(timezone.utc)
    except ValueError as exc:
        fail(str(exc))
        return
    if after.tzinfo is None:
        after = after.replace(tzinfo=parsed.zone)
    times = parsed.fire_times(after, count)
    if not times:
        fail(f"{expression!r} has no fire time after {after.isoformat()} (in {zone})")
        return
    for moment in times:
        click.echo(f"{moment.astimezone(timezone.utc).isoformat()}  {moment.isoformat()}")
    if len(times) < count:
        click.echo(f"(no further fire times after {len(times)})", err=True)


@click.command("web")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=5580, show_default=True, type=click.IntRange(0, 65535))
@click.option("--read-only", is_flag=True, help="Show everything; refuse every action.")
@click.option(
    "--insecure-no-auth",
    is_flag=True,
    help="Serve a non-loopback --host without ratchet_web_auth (anyone reaching it may act).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="A Host name to answer besides the bound address (repeatable; e.g. the name a "
    "proxy or DNS gives this machine).",
)
@pass_cli
def web(
    cli: CliContext,
    host: str,
    port: int,
    read_only: bool,
    insecure_no_auth: bool,
    allowed_hosts: tuple[str, ...],
) -> None:
    """Serve the dashboard: jobs, tasks, queues, workers, dead letters, schedules, batches,
    resources; with their actions (cancel, terminate, retry, run now, pool size...); and
    GET /metrics for Prometheus (celery-ratchet[metrics]).

    Credentials: RATCHET_WEB_AUTH (or the app's ratchet_web_auth), user:password for HTTP
    basic auth or a token; without them, only a loopback address is served."""
    from celery_ratchet.web.app import Dashboard
    from celery_ratchet.web.guard import Guard, HostAllowlist, check_bind
    from celery_ratchet.web.server import serve
    from celery_ratchet.web.templating import environment

    environment()  # without the web extra's Jinja2, say so before listening
    auth = cli.web_auth()
    check_bind(host, Guard(auth), insecure_no_auth=insecure_no_auth)
    hosts = HostAllowlist.for_bind(host, allowed_hosts)
    dashboard = Dashboard(
        cli.store,
        auth=auth,
        read_only=read_only,
        hosts=hosts,
        node_grace_seconds=cli.settings().node_orphan_grace_seconds,
    )
    server = serve(host, port, dashboard)
    bare = host.strip("[]")
    shown_host = f"[{bare}]" if ":" in bare else bare
    click.echo(
        f"ratchet web on http://{shown_host}:{server.port}/ for {mask_url(cli.store.url)}"
        f"{' (read-only)' if read_only else ''}{'' if auth else ' (no auth)'}, "
        f"served by {server.kind}; Ctrl-C stops"
    )
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


COMMANDS: Iterable[click.Command] = (
    jobs, stats, queues, nodes, schedules, batches, schema, cron, dlq, archive, web,
)  # fmt: skip


def add_commands(group: click.Group) -> click.Group:
    for command in COMMANDS:
        group.add_command(command)
    return group
