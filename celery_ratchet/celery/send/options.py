"""Ratchet's per-job options: ``apply_async(ratchet={...})`` over task attributes.

Names follow the seeds: ``resource``, ``backoff`` (none | fixed | exponential),
``backoff_param`` (seconds), ``max_retries``, ``timeout`` (seconds), ``priority`` (a level
name or 0-9), ``business_key``, ``on_duplicate`` (``existing``, the default: a send whose
business key an active job holds gets that job's result; ``raise``: DuplicateJob) and
``tags``. The same names set as task attributes are the defaults of every call. What the
worker needs later (retry settings, tags) travels in the message header ``ratchet``; what
the claim needs (resource, priority, business key) goes on the row.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from celery_ratchet.domain.job import OnDuplicate
from celery_ratchet.domain.priority import to_numeric
from celery_ratchet.domain.retry import Backoff
from celery_ratchet.errors import ConfigurationError, InvalidJob
from celery_ratchet.settings import RatchetSettings

HEADER = "ratchet"
OPTIONS = frozenset(
    {"resource", "backoff", "backoff_param", "max_retries", "timeout", "priority",
     "business_key", "on_duplicate", "tags"}
)  # fmt: skip
#: Task attributes read as defaults; ``priority`` is Celery's own attribute already.
_TASK_ATTRIBUTES = (
    "resource", "backoff", "backoff_param", "timeout", "business_key", "on_duplicate", "tags",
)  # fmt: skip


def task_defaults(task: Any) -> dict[str, Any]:
    if task is None:
        return {}
    values = {name: getattr(task, name, None) for name in _TASK_ATTRIBUTES}
    return {name: value for name, value in values.items() if value is not None}


def resolve(
    task_name: str,
    task: Any,
    given: Mapping[str, Any] | None,
    settings: RatchetSettings,
    *,
    require_capacity: bool = True,
) -> dict[str, Any]:
    """The job's ratchet options, validated: ``given`` over the task's attributes. With
    ``require_capacity`` (sending) a resource must have a capacity in ``settings``."""
    if given is not None and not isinstance(given, Mapping):
        raise TypeError(f"ratchet= takes a dict of options, got {type(given).__name__}")
    unknown = set(given or {}) - OPTIONS
    if unknown:
        raise InvalidJob(
            "ratchet",
            f"unknown ratchet option(s) {', '.join(sorted(unknown))} for task {task_name!r}; "
            f"known: {', '.join(sorted(OPTIONS))}",
        )
    options = {**task_defaults(task), **dict(given or {})}
    where = f"task {task_name!r}"
    if "backoff" in options:
        try:
            options["backoff"] = Backoff.parse(options["backoff"]).value
        except ValueError as exc:
            raise InvalidJob("backoff", f"{where}: {exc}") from None
    for name in ("backoff_param", "timeout"):
        if name in options:
            options[name] = _seconds(where, name, options[name], zero_ok=name != "timeout")
    if options.get("max_retries") is not None:
        options["max_retries"] = _count(where, "max_retries", options["max_retries"])
    if "priority" in options:
        try:
            options["priority"] = to_numeric(options["priority"])
        except ValueError as exc:
            raise InvalidJob("priority", f"{where}: {exc}") from None
    if "tags" in options:
        options["tags"] = _tags(where, options["tags"])
    if "on_duplicate" in options:
        try:
            options["on_duplicate"] = OnDuplicate(options["on_duplicate"]).value
        except ValueError:
            raise InvalidJob(
                "on_duplicate",
                f"{where}: ratchet option on_duplicate must be 'existing' (follow the active "
                f"job holding the business key) or 'raise' (DuplicateJob); "
                f"got {options['on_duplicate']!r}",
            ) from None
    resource = options.get("resource")
    if require_capacity and resource is not None and resource not in settings.resources:
        configured = ", ".join(sorted(settings.resources)) or "none"
        raise ConfigurationError(
            f"task {task_name!r} needs resource {resource!r}, which has no capacity here "
            f"(configured: {configured}); set ratchet_resources = {{{resource!r}: N}} "
            "(env RATCHET_RESOURCES) on clients and workers"
        )
    return options


def _seconds(where: str, name: str, value: Any, *, zero_ok: bool) -> float:
    """A number of seconds: finite, and positive (or zero where ``zero_ok``)."""
    bound = "0 or more" if zero_ok else "more than 0"
    try:
        seconds = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero_ok):
        raise InvalidJob(
            name,
            f"{where}: ratchet option {name} must be a finite number of seconds, {bound}; "
            f"got {value!r}",
        )
    return seconds


def _count(where: str, name: str, value: Any) -> int:
    """A whole number, 0 or more."""
    whole = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        whole, value = True, int(value)
    if not whole or value < 0:
        raise InvalidJob(
            name, f"{where}: ratchet option {name} must be a whole number, 0 or more; got {value!r}"
        )
    return int(value)


def _tags(where: str, value: Any) -> list[str]:
    """A list of tags. A lone string is refused: iterating it would store its letters."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidJob(
            "tags",
            f"{where}: ratchet option tags must be a list of strings, got "
            f"{type(value).__name__} {value!r}; write tags=[{value!r}] for one tag",
        )
    tags = []
    for tag in value:
        if not isinstance(tag, str) or not tag or "," in tag:
            raise InvalidJob(
                "tags", f"{where}: each tag must be a non-empty string with no comma, got {tag!r}"
            )
        tags.append(tag)
    return tags


def apply_to_message(
    options: Mapping[str, Any], headers: dict[str, Any], properties: dict[str, Any]
) -> None:
    """Write the options into the message: the whole set as the ``ratchet`` header (so a
    retry, which copies the headers, keeps them), the timeout as Celery's hard time limit
    unless one was given, the priority as Celery's."""
    if not options:
        headers.pop(HEADER, None)
        return
    headers[HEADER] = dict(options)
    timeout = options.get("timeout")
    if timeout is not None:
        hard, soft = [*(headers.get("timelimit") or ()), None, None][:2]
        headers["timelimit"] = [hard if hard is not None else timeout, soft]
    if "priority" in options:
        properties["priority"] = options["priority"]
