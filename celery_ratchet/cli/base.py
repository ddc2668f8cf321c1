"""What every operations command runs on: the store opened on first use, tables or JSON out,
errors as one line and exit status 2."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import click

from celery_ratchet.domain.job import JobStatus, Unreadable
from celery_ratchet.errors import RatchetError
from celery_ratchet.settings import RatchetSettings, mask_password
from celery_ratchet.store.database import outages_said_by_caller
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.redact import mask_url


class CliContext:
    """What every command needs: the store, opened on first use."""

    def __init__(
        self,
        open_store: Callable[[], JobStore],
        create_store: Callable[[], JobStore] | None = None,
        settings: Callable[[], RatchetSettings] | None = None,
    ) -> None:
        self._open_store = open_store
        #: The settings (``ratchet_web_auth``, ...): the app's under ``celery -A app``, else
        #: the environment's.
        self.settings = settings or environment_settings
        self._create_store = create_store or open_store
        self._store: JobStore | None = None

    def web_auth(self) -> str | None:
        return self.settings().web_auth

    @property
    def store(self) -> JobStore:
        if self._store is None:
            self._store = self._open_store()
        return self._store

    def said(self, outcome: str) -> None:
        """A state-changing command's outcome, naming the store it changed (password
        masked): without ``--url`` that is ``./ratchet.db`` when there is one, which may not
        be the store the operator meant."""
        click.echo(f"{outcome} on {mask_url(self.store.url)}")

    def store_to_create(self) -> JobStore:
        """The store for ``schema apply``: one whose database may not exist yet."""
        if self._store is None:
            self._store = self._create_store()
        return self._store


pass_cli = click.make_pass_decorator(CliContext)


def jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, JobStatus):
        return value.value
    if isinstance(value, Unreadable):
        return str(value)
    return value


def emit(rows: Sequence[dict[str, Any]], columns: Sequence[str], as_json: bool) -> None:
    """Print rows as JSON lines of objects, or as an aligned table."""
    if as_json:
        click.echo(json.dumps([{k: jsonable(r.get(k)) for k in columns} for r in rows], indent=2))
        return
    table = [
        [str(jsonable(r.get(c)) if r.get(c) is not None else "") for c in columns] for r in rows
    ]
    widths = [max([len(c)] + [len(row[i]) for row in table]) for i, c in enumerate(columns)]
    click.echo("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in table:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


class CommandFailed(click.ClickException):
    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(mask_password(message))


def fail(message: str) -> None:
    raise CommandFailed(message)


class RatchetGroup(click.Group):
    """Turns celery_ratchet's errors (an unreachable store, a bad setting) into a one-line
    message and exit status 2 instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        # A command's store error is its one line of output: the store's own line for an
        # outage (meant for long-running processes, as the dashboard is) would say it twice.
        serving = ctx.protected_args[:1] == ["web"]
        with contextlib.nullcontext() if serving else outages_said_by_caller():
            try:
                return super().invoke(ctx)
            except RatchetError as exc:
                raise CommandFailed(str(exc)) from exc


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def environment_settings() -> RatchetSettings:
    return RatchetSettings.from_sources({}, os.environ)
