"""``ratchet dlq`` (list, show, retry, purge) and ``ratchet archive``."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
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
from celery_ratchet.runtime.dlq import DeadLetterQueue, exception_line
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.redact import mask_url


@click.group("dlq", invoke_without_command=True)
@click.pass_context
def dlq(ctx: click.Context) -> None:
    """The dead-letter queue: jobs that failed for good (list, show, retry, purge)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(dlq_list)


_dlq_filters = [
    click.option("--task", "task_name", help="Only jobs of this task name."),
    click.option("--queue", help="Only jobs of this queue."),
]


def _with_filters(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_dlq_filters):
        command = option(command)
    return command


@dlq.command("list")
@_with_filters
@click.option("--limit", default=50, show_default=True)
@json_option
@pass_cli
def dlq_list(
    cli: CliContext,
    task_name: str | None = None,
    queue: str | None = None,
    limit: int = 50,
    as_json: bool = False,
) -> None:
    """Failed jobs, newest first. ``alert``: the dead-letter alert counting the job was sent
    (``sent``), waits for its window to close (``due``), or there is none (``-``)."""
    letters = DeadLetterQueue(cli.store)
    found = letters.list(task_name=task_name, queue=queue, limit=limit)
    alerts = letters.alerts_of(found)
    columns = ["job_id", "task_name", "queue", "attempts", "finished_at", "alert", "last_error"]
    rows = [{**vars(j), "alert": alerts[j.job_id]} for j in found]
    if not as_json:  # the table reads as dlq show does; --json keeps the stored record
        rows = [{**row, "last_error": exception_line(row["last_error"])} for row in rows]
    emit(rows, columns, as_json)


@dlq.command("show")
@click.argument("job_id")
@json_option
@pass_cli
def dlq_show(cli: CliContext, job_id: str, as_json: bool) -> None:
    """One failed job: its arguments, exception, traceback and attempts."""
    letter = DeadLetterQueue(cli.store).show(job_id)
    if letter is None:
        fail(f"no failed job {job_id!r} in the dead-letter queue")
        return
    values = {k: jsonable(v) for k, v in vars(letter).items()}
    if as_json:
        click.echo(json.dumps(values, indent=2, default=str))
        return
    for key, value in values.items():
        if key in ("args", "kwargs"):
            value = json.dumps(value, default=str)
        if key != "traceback":
            click.echo(f"{key + ':':13}{value}")
    if letter.traceback:
        click.echo("traceback:\n" + letter.traceback.rstrip())


@dlq.command("retry")
@click.argument("job_ids", nargs=-1)
@_with_filters
@click.option("--all", "everything", is_flag=True, help="Every failed job matching the filters.")
@pass_cli
def dlq_retry(
    cli: CliContext,
    job_ids: tuple[str, ...],
    task_name: str | None,
    queue: str | None,
    everything: bool,
) -> None:
    """Requeue failed jobs: due now, attempts 0, error cleared."""
    queue_ = DeadLetterQueue(cli.store)
    others: dict[str, str] = {}
    if job_ids:
        others = queue_.not_dead_letters(job_ids)
        letters = [job_id for job_id in dict.fromkeys(job_ids) if job_id not in others]
        count = queue_.retry(*letters) if letters else 0
    elif everything or task_name or queue:
        count = queue_.retry_all(task_name=task_name, queue=queue)
    else:
        fail("name job ids, or pass --all / --task / --queue to requeue every match")
        return
    left = ", ".join(f"{job_id} ({status})" for job_id, status in others.items())
    if job_ids and not count:
        reasons = [f"not dead letters, left alone: {left}"] if others else []
        if len(others) < len(set(job_ids)):  # dead letters the store left FAILED
            reasons.append(
                "the others stay in the dead-letter queue: another active job holds their "
                "business key"
            )
        fail(f"requeued nothing on {mask_url(cli.store.url)}: {'; '.join(reasons)}")
    cli.said(f"requeued {count} job{'s' if count != 1 else ''}")
    if others:
        click.echo(f"not dead letters, left alone: {left}")


@dlq.command("purge")
@click.argument("job_ids", nargs=-1)
@_with_filters
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_cli
def dlq_purge(
    cli: CliContext,
    job_ids: tuple[str, ...],
    task_name: str | None,
    queue: str | None,
    yes: bool,
) -> None:
    """Delete failed jobs (all of them unless ids or filters are given)."""
    if not (job_ids or task_name or queue or yes):
        click.confirm("delete every failed job?", abort=True)
    count = DeadLetterQueue(cli.store).purge(*job_ids, task_name=task_name, queue=queue)
    cli.said(f"deleted {count} failed job{'s' if count != 1 else ''}")


@click.command("archive")
@click.option("--older-than", "days", type=float, help="Days since finished (default: setting).")
@click.option("--batch-size", type=int, help="Rows per transaction (default: setting).")
@pass_cli
def archive(cli: CliContext, days: float | None, batch_size: int | None) -> None:
    """Move finished jobs to scheduler_job_archive now (workers also do it on a schedule)."""
    settings = RatchetSettings.from_sources({}, os.environ)
    days = settings.job_retention_days if days is None else days
    size = batch_size or settings.job_archive_batch_size
    click.echo(f"archiving jobs finished more than {days:g} days ago, {size} at a time")
    moved = cli.store.archive_finished(
        days, size, progress=lambda n: click.echo(f"  {n} archived", err=True)
    )
    purged = cli.store.purge_logs(settings.log_retention_days)
    cli.said(f"archived {moved} jobs; deleted {purged} job log lines")
