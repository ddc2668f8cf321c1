"""Celery's ``celery.commands`` entry point: ``-P ratchet`` and ``celery -A app ratchet``.

Loaded by the ``celery`` program after its worker command (and its ``--pool`` choices) exist,
so adding the ``ratchet`` pool here makes ``celery -A app worker -P ratchet`` valid.
"""

from __future__ import annotations

from typing import Any

import click

from celery_ratchet.celery.app.install import install
from celery_ratchet.celery.broker_import.command import import_broker
from celery_ratchet.celery.compat import offer_pool, on_every_cli_app
from celery_ratchet.celery.schedules.recurring import (
    beat_entries_gone,
    beat_entries_kept,
    check_beat_entry,
    register_beat_entry,
    remove_gone_beat_entries,
)
from celery_ratchet.celery.state import is_ratchet_app, ratchet_state
from celery_ratchet.cli.base import CliContext, CommandFailed, RatchetGroup
from celery_ratchet.cli.commands import add_commands
from celery_ratchet.errors import RatchetError

POOL_ALIAS = "ratchet"
ASYNC_POOL_ALIAS = "ratchet-async"
offer_pool(POOL_ALIAS, "celery_ratchet.celery.execution.prefork:RatchetPool")
offer_pool(ASYNC_POOL_ALIAS, "celery_ratchet.celery.execution.asyncpool:AsyncPool")


def _install_if_ratchet_app(app: Any) -> None:
    """Make the app of every ``celery`` subcommand a ratchet app before it runs.

    An app becomes one when its tasks are bound (``task_cls``); commands that never bind
    them (``celery -A app events``, ``shell``) would otherwise reach for ``broker_url``.
    """
    if is_ratchet_app(app):
        install(app)


on_every_cli_app(_install_if_ratchet_app)


@click.group(name="ratchet", cls=RatchetGroup)
@click.pass_context
def ratchet(ctx: click.Context) -> None:
    """celery_ratchet operations on this app's job store."""
    app: Any = ctx.obj.app
    install(app)
    ctx.obj = CliContext(
        lambda: ratchet_state(app).job_store, settings=lambda: ratchet_state(app).settings
    )


add_commands(ratchet)
ratchet.add_command(import_broker)


@ratchet.command("import-beat")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Check each entry as a worker's start does and print what it becomes; change nothing.",
)
@click.pass_context
def import_beat(ctx: click.Context, dry_run: bool) -> None:
    """Register the app's beat_schedule as recurring jobs (no celery beat needed).

    Workers do this at start too; this registers ahead of a deploy and shows each crontab's
    Quartz form. Entries are keyed by name: running it again updates them in place, and an
    entry registered before that beat_schedule no longer has is removed.
    """
    app: Any = ctx.find_root().obj.app
    # The modules a worker imports at start (imports=, include=, autodiscover_tasks): the
    # tasks the entries name are checked against the same registry.
    app.loader.import_default_modules()
    entries = dict(app.conf.beat_schedule or {})
    if not entries:
        click.echo("beat_schedule is empty: nothing to import")
    failed = 0
    for name, entry in entries.items():
        try:
            # The dry run makes every check the registration makes, and writes nothing.
            checked = (check_beat_entry if dry_run else register_beat_entry)(app, name, entry)
        except RatchetError as exc:
            failed += 1
            click.echo(f"{name}: NOT IMPORTED: {exc}", err=True)
            continue
        verb = "would register" if dry_run else "registered"
        click.echo(f"{name}: {verb} {entry.get('task')} {checked.description} ({app.timezone})")
        for warning in checked.warnings:
            click.echo(f"{name}: WARNING: {warning}", err=True)
    gone = (beat_entries_gone if dry_run else remove_gone_beat_entries)(app, entries)
    for name in gone:
        verb = "would remove" if dry_run else "removed"
        click.echo(f"{name}: {verb} (registered from beat_schedule, which no longer has it)")
    for name in beat_entries_kept(app, entries):
        if name not in gone:
            click.echo(
                f"{name}: kept: a running worker's beat_schedule has it (or a worker of an "
                "earlier version runs); removed once no running worker's has it"
            )
    if failed:
        raise CommandFailed(f"{failed} of {len(entries)} beat_schedule entries were not imported")
