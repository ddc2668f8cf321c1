"""``ratchet --url URL <command>``: the operations CLI without a Celery app."""

from __future__ import annotations

import os

import click

from celery_ratchet.cli.commands import CliContext, RatchetGroup, add_commands
from celery_ratchet.settings import DEFAULT_URL, RatchetSettings
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

    def open_store() -> JobStore:
        # Revokes, schedule changes and requeues wake idle workers (LISTEN/NOTIFY).
        notify = RatchetSettings.from_sources({}, os.environ).listen_notify
        return JobStore(url, create_schema=False, notify=notify)

    ctx.obj = CliContext(open_store)


add_commands(cli)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
