"""``ratchet queues`` (list, pause, resume): the job table's queues, and pausing one."""

from __future__ import annotations

import click

from celery_ratchet.cli.base import CliContext, emit, json_option, pass_cli


@click.group("queues", invoke_without_command=True)
@click.pass_context
def queues(ctx: click.Context) -> None:
    """The job table's queues (list, pause, resume)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(queues_list)


@queues.command("list")
@json_option
@pass_cli
def queues_list(cli: CliContext, as_json: bool = False) -> None:
    """Each queue with its pending and running jobs, the age of its oldest due job in
    seconds, and whether it is paused (since when, and why)."""
    found = cli.store.queue_stats()
    paused = cli.store.paused_queues()
    counts: dict[str, dict[str, int]] = {}
    for row in found["counts"]:
        counts.setdefault(row["queue"], {})[row["status"]] = row["count"]
    rows = []
    for queue in sorted(set(counts) | set(paused)):
        pause = paused.get(queue)
        rows.append(
            {
                "queue": queue,
                "pending": counts.get(queue, {}).get("PENDING", 0),
                "running": counts.get(queue, {}).get("RUNNING", 0),
                "oldest_due_s": found["oldest_pending_seconds"].get(queue),
                "paused_at": pause.paused_at if pause else None,
                "reason": pause.reason if pause else None,
            }
        )
    emit(rows, ["queue", "pending", "running", "oldest_due_s", "paused_at", "reason"], as_json)


@queues.command("pause")
@click.argument("queue")
@click.option("--reason", help="Who pauses it and why, shown beside it (255 characters).")
@pass_cli
def queues_pause(cli: CliContext, queue: str, reason: str | None) -> None:
    """Stop every worker claiming from QUEUE until it is resumed. Jobs already running go
    on; new jobs are still accepted into it. Workers see it within
    ratchet_queue_pause_check_seconds."""
    if cli.store.pause_queue(queue, reason):
        cli.said(f"paused {queue}")
    else:
        cli.said(f"{queue} was paused already")


@queues.command("resume")
@click.argument("queue")
@pass_cli
def queues_resume(cli: CliContext, queue: str) -> None:
    """Let workers claim from QUEUE again."""
    if cli.store.resume_queue(queue):
        cli.said(f"resumed {queue}")
    else:
        cli.said(f"{queue} was not paused")
