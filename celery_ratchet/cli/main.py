"""``ratchet --url URL <command>``: the operations CLI without a Celery app."""

from __future__ import annotations

import click

from celery_ratchet.cli.commands import CliContext, add_commands, fail
from celery_ratchet.errors import RatchetError
from celery_ratchet.settings import DEFAULT_URL
from celery_ratchet.store.jobstore import JobStore


@click.group()
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
    ctx.obj = CliContext(lambda: JobStore(url, create_schema=False))


add_commands(cli)


def main() -> None:
    try:
        cli(standalone_mode=True)
    except RatchetError as exc:
        fail(str(exc))
