"""``ratchet --url URL <command>``: the operations CLI without a Celery app."""

from __future__ import annotations

import os
from pathlib import Path

import click

from celery_ratchet.cli.base import CliContext, RatchetGroup
from celery_ratchet.cli.commands import add_commands
from celery_ratchet.errors import ConfigurationError
from celery_ratchet.settings import DEFAULT_URL, RatchetSettings
from celery_ratchet.store.engine import sqlite_file
from celery_ratchet.store.jobstore import JobStore


@click.group(cls=RatchetGroup)
@click.option(
    "--url",
    envvar="RATCHET_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="Database URL of the job store (env RATCHET_URL).",
)
@click.pass_context
def cli(ctx: click.Context, url: str) -> None:
    """celery_ratchet operations."""
    ctx.obj = CliContext(
        lambda: _open(url), lambda: JobStore(url, create_schema=False, notify=_notifies())
    )


def _notifies() -> bool:
    """Revokes, schedule changes and requeues wake idle workers (LISTEN/NOTIFY)."""
    return RatchetSettings.from_sources({}, os.environ).wakeups_by_notify


def _open(url: str) -> JobStore:
    """The job store at ``url``. A SQLite file that does not exist is not made here: that
    would only show an empty store (or "no such table") instead of saying what is wrong."""
    database = sqlite_file(url)
    if database is not None and not Path(database).expanduser().exists():
        hint = "pass --url or set RATCHET_URL" if url == DEFAULT_URL else "check the path"
        raise ConfigurationError(
            f"no job store at {url}: {database} does not exist ({hint}; "
            "`ratchet --url URL schema apply` creates one)"
        )
    return JobStore(url, create_schema=False, notify=_notifies())


add_commands(cli)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
