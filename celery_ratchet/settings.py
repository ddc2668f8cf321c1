"""Ratchet settings: lower-case Celery settings ``ratchet_*``, each overridable by ``RATCHET_*``.

Precedence: environment variable, then the Celery setting, then the default. Pure: the caller
passes the Celery configuration mapping and the environment.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from celery_ratchet.domain.cron import CronError, CronExpression
from celery_ratchet.errors import ConfigurationError

DEFAULT_URL = "sqlite:///ratchet.db"


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"expected true/false, got {value!r}")


def _to_optional_str(value: Any) -> str | None:
    return None if value in (None, "") else str(value)


def _to_capacities(value: Any) -> dict[str, int]:
    """``{"payments": 2}``, or ``"payments=2,reports=1"`` from an environment variable."""
    if isinstance(value, str):
        pairs = [item.partition("=") for item in value.split(",") if item.strip()]
        if any(not sep for _, sep, _ in pairs):
            raise ValueError("expected name=capacity pairs separated by commas")
        value = {name.strip(): number.strip() for name, _, number in pairs}
    if not isinstance(value, Mapping):
        raise ValueError("expected a mapping of resource name to capacity")
    capacities = {str(name): int(number) for name, number in value.items()}
    for name, number in capacities.items():
        if number < 1 or not name or len(name) > 255:
            raise ValueError(
                f"resource {name!r} needs a name of 1-255 characters and capacity >= 1"
            )
    return capacities


def _to_mapping(value: Any) -> dict[str, Any]:
    """A mapping, or a JSON object from an environment variable."""
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else {}
    if not isinstance(value, Mapping):
        raise ValueError("expected a mapping (a JSON object in an environment variable)")
    return {str(k): v for k, v in value.items()}


def _to_names(value: Any) -> tuple[str, ...]:
    """``["shop", "billing.rules"]``, or ``"shop,billing.rules"`` from an environment variable."""
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise ValueError("expected a list of module names")
    names = tuple(str(v).strip() for v in value if str(v).strip())
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise ValueError(f"{name!r} is not a module name (e.g. shop.rules)")
    return names


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "bool": _to_bool,
    "int": int,
    "float": float,
    "str": str,
    "str | None": _to_optional_str,
    "int | None": lambda v: None if v in (None, "") else int(v),
    "float | None": lambda v: None if v in (None, "") else float(v),
    "dict[str, int]": _to_capacities,
    "dict[str, Any]": _to_mapping,
    "tuple[str, ...]": _to_names,
}


#: Environment variables also read for a setting (after its own ``RATCHET_*`` name).
_ENV_ALIASES = {
    "async_limit_single": "RATCHET_VIRTUAL_THREAD_LIMIT_SINGLE",
    "async_limit_batch_child": "RATCHET_VIRTUAL_THREAD_LIMIT_BATCH_CHILD",
}


#: ``ratchet_*`` settings read elsewhere than here: they take Python objects
#: (celery/worker/retry.py reads ``ratchet_retry_policy``).
OTHER_SETTINGS = frozenset({"ratchet_retry_policy"})
#: Settings a Django project gives under Celery's namespace (``CELERY_RATCHET_DATABASE``),
#: read from Django's settings by celery/django/django_store.py.
DJANGO_SETTINGS = frozenset({"ratchet_database"})


@dataclass(frozen=True)
class RatchetSettings:
    #: The job store's database URL. ``postgresql://`` uses psycopg 3, ``mysql://`` and
    #: ``mariadb://`` PyMySQL; the default is a SQLite file in the working directory.
    url: str = DEFAULT_URL
    #: Create missing tables on first use, under a schema lock (processes starting together on
    #: an empty database make one schema). A database user without CREATE privilege gets
    #: ``SchemaNotCreated``: apply ``ddl/<dialect>.sql`` as an administrator, grant the user
    #: SELECT, INSERT, UPDATE and DELETE, and set this to false.
    create_schema: bool = True
    #: Longest wait between two claim queries while the worker is idle (seconds).
    poll_interval: float = 1.0
    #: First wait after the queue runs dry; doubles up to ``poll_interval``.
    poll_interval_min: float = 0.05
    #: Most jobs one claim statement takes.
    claim_batch_size: int = 100
    #: Largest serialized arguments (args and kwargs, after compression) a job may carry, in
    #: KiB. The workflow Celery embeds beside them (the rest of a chain, a chord's header,
    #: callbacks) does not count, but each step's own arguments are held to the limit, and a
    #: whole message over 4 MB is refused (``MessageTooLarge``). Compressed arguments may
    #: decompress to 64 times this at most (``CompressedPayloadTooLarge``): a worker
    #: decompresses a row within that bound.
    max_payload_kb: int = 100
    #: Permit pickle (and other serializers that can run code) to write and read jobs,
    #: whatever ``accept_content`` says.
    allow_pickle: bool = False
    #: Modules (and their submodules) whose functions may be workflow conditions without
    #: ``@celery_ratchet.predicate``: your application's packages, e.g. ``["shop"]``.
    predicate_modules: tuple[str, ...] = ()
    #: Priority of a job sent without one (Celery's 0-9, higher runs first).
    default_priority: int = 4
    #: How often a worker writes its heartbeat (seconds).
    node_heartbeat_interval_seconds: float = 10.0
    #: How long other nodes must see a worker's heartbeat stand still before they declare it
    #: dead and recover its running jobs (seconds); must exceed the heartbeat interval.
    node_orphan_grace_seconds: float = 60.0
    #: A node (worker or sender) whose clock is further than this from the database's logs
    #: a WARNING saying by how much, once, and again when the offset moves (seconds; 0: never).
    #: Countdowns, retries and schedules are reckoned on the database's clock whatever it is.
    clock_skew_warning_seconds: float = 5.0
    #: How often every worker scans for jobs orphaned by a dead node (minutes).
    orphan_scan_interval_minutes: float = 5.0
    #: Longest a statement of the job store's own connections waits for the server's reply
    #: before its connection is dropped, as a network that cut it would (seconds; schema
    #: changes excepted). None: the grace period; 0: no limit. See ``statement_deadline``.
    statement_deadline_seconds: float | None = None
    #: A job whose node dies under it (or is declared dead) more often than this goes to the
    #: dead-letter queue instead of running again; claims of a job handed back by a live
    #: node count too. 0: never run again a job whose node died.
    max_recoveries: int = 5
    #: A job of a task this worker does not know (a rolling deploy: the task is newer than
    #: the worker) is handed back for other workers for this long from its first refusal
    #: here, then fails as NotRegistered; 0 fails it at once.
    unknown_task_grace_seconds: float = 600.0
    #: Finer control of the orphan scan; wins over the minutes setting when set.
    orphan_scan_interval_seconds: float | None = None
    #: Aging: a waiting job rises one priority level per this many minutes; 0 disables.
    priority_boost_interval_minutes: float = 15.0
    #: Cluster-wide permits: at most this many jobs of each resource run at once.
    resources: dict[str, int] = field(default_factory=dict)
    #: Off switch of every task's circuit breaker.
    circuit_breaker: bool = True
    #: PostgreSQL: enqueues notify idle workers, which claim at once instead of at the next
    #: poll (LISTEN/NOTIFY). No effect on other databases.
    listen_notify: bool = True
    #: PostgreSQL: a direct URL (not through PgBouncer) for the LISTEN connection; default:
    #: ``url``. LISTEN through a pooler in transaction mode never receives anything.
    listen_url: str | None = None
    #: PostgreSQL: ``url`` goes through PgBouncer (transaction or statement pooling): no
    #: server-side prepared statements, and LISTEN/NOTIFY only with ``listen_url``.
    pgbouncer: bool = False
    #: Connections each process keeps open to the job store (a worker's outcome writer keeps
    #: one more of its own).
    pool_size: int = 5
    #: More connections each process may open at a peak, beyond ``pool_size``.
    max_overflow: int = 10
    #: Extra keyword arguments of the driver's connect() (a JSON object in the environment).
    connect_args: dict[str, Any] = field(default_factory=dict)
    #: Redis URL for wake-ups on any database (``redis://host:6379/0``); optional.
    events_url: str | None = None
    #: The result backend of the fleet before the cutover (Celery's URL form:
    #: ``redis://old-host:6379/1``, ``db+postgresql://…``), read for a task id the job store
    #: does not hold: ``AsyncResult(id)`` of a task sent before the move. Never written.
    legacy_result_backend_url: str | None = None
    #: With a wake-up channel on (LISTEN/NOTIFY or ``events_url``), an idle worker is told of
    #: new jobs, schedule changes and revokes, and sleeps until the next due time it knows
    #: of; it still looks this often (seconds), so a lost notification only delays work.
    wakeup_poll_interval: float = 10.0
    #: Without a wake-up channel, how often a worker looks for remote control commands
    #: (``celery inspect``, ``celery control``; seconds). Their replies are waited for one
    #: second by default.
    control_poll_interval: float = 0.5
    #: How old a worker's list of paused queues (``ratchet queues pause``) may be when it
    #: claims (seconds): a pause or a resume takes effect on every worker within this long.
    #: While a queue of its own is paused, an idle worker looks again this often.
    queue_pause_check_seconds: float = 1.0
    #: Finished jobs older than this move to scheduler_job_archive.
    job_retention_days: float = 90.0
    #: Rows the archiver moves per transaction.
    job_archive_batch_size: int = 1000
    #: When the archiver runs (Quartz cron, UTC), once per cluster.
    job_archiver_cron: str = "0 0 1 * * ?"
    #: Switch the archiver off (its schedule is removed at the next worker start).
    job_archive_enabled: bool = True
    #: Job log lines older than this are deleted by the archiver.
    log_retention_days: float = 30.0
    #: The seeds' virtual threads: a worker started without ``-P`` (or with ``-P ratchet`` or
    #: ``prefork``) runs the async pool, ``-P ratchet-async``; one started with another pool
    #: named refuses to start.
    worker_use_virtual_threads: bool = False
    #: The ``ratchet-async`` pool: how many single jobs, and how many batch children, one
    #: worker process runs at once (also ``RATCHET_VIRTUAL_THREAD_LIMIT_SINGLE`` and
    #: ``RATCHET_VIRTUAL_THREAD_LIMIT_BATCH_CHILD``). 1000, as the seeds' default per job type.
    async_limit_single: int = 1000
    #: The ``ratchet-async`` pool: how many children of groups and batches one worker process
    #: runs at once. 1000, as the seeds' default per job type.
    async_limit_batch_child: int = 1000
    #: Dead-letter alerts: the registered Celery task name (as ``app.send_task`` takes it,
    #: e.g. ``shop.alerts.on_dead_letters``) sent one summary per task name whose jobs
    #: failed for good, at most once per ``dlq_alert_interval_seconds``. None: no alerts.
    dlq_alert_task: str | None = None
    #: A dead-letter alert window's length: at most one alert per task name per this many
    #: seconds.
    dlq_alert_interval_seconds: float = 300.0
    #: A Django database alias (``"default"``): sends made while a transaction is open on it
    #: are written in that transaction, through Django's connection. Must be the job store's
    #: database.
    django_connection: str | None = None
    #: A streaming batch's producer renews its hold on the batch with each chunk (and while
    #: a chunk fills); one that has not for this long is taken for dead: the batch FAILS.
    batch_stream_lease_seconds: float = 60.0
    #: ``ratchet web``: ``user:password`` (HTTP basic) or a token (``Authorization: Bearer``);
    #: unset, the dashboard asks no one, and binds only a loopback address.
    web_auth: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        # URLs with their passwords masked; web_auth (repr=False) not at all.
        shown = []
        for f in fields(self):
            if not f.repr:
                continue
            value = getattr(self, f.name)
            if f.name.endswith("url") and isinstance(value, str):
                value = mask_password(value, whole=True)
            shown.append(f"{f.name}={value!r}")
        return f"RatchetSettings({', '.join(shown)})"

    @property
    def wakeups_by_notify(self) -> bool:
        """Enqueues notify and workers LISTEN: on, unless behind PgBouncer with no direct URL."""
        return self.listen_notify and (not self.pgbouncer or self.listen_url is not None)

    @property
    def liveness_margin(self) -> float:
        """Half the margin between the heartbeat interval and the grace period: a heartbeat
        stuck on a dead connection this long, dropped and written again on a new one, is
        still in time for every node judging this one."""
        return (self.node_orphan_grace_seconds - self.node_heartbeat_interval_seconds) / 2

    @property
    def statement_deadline(self) -> float | None:
        """The deadline of every statement (None: none)."""
        if self.statement_deadline_seconds is None:
            return self.node_orphan_grace_seconds
        return self.statement_deadline_seconds or None

    @property
    def liveness_deadline(self) -> float | None:
        """The deadline of a heartbeat and of a node's registration: the shorter of the
        statement deadline and the liveness margin (None: no deadline at all)."""
        deadline = self.statement_deadline
        return None if deadline is None else min(deadline, self.liveness_margin)

    @property
    def orphan_scan_interval(self) -> float:
        if self.orphan_scan_interval_seconds is not None:
            return self.orphan_scan_interval_seconds
        return self.orphan_scan_interval_minutes * 60.0

    @classmethod
    def from_sources(
        cls, conf: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
    ) -> RatchetSettings:
        conf = conf or {}
        environ = environ or {}
        check_setting_names(conf)
        values: dict[str, Any] = {}
        for spec in fields(cls):
            setting = f"ratchet_{spec.name}"
            env_name = setting.upper()
            type_name = str(spec.type)
            convert = _CONVERTERS[type_name]
            alias = _ENV_ALIASES.get(spec.name)
            if env_name not in environ and alias is not None and alias in environ:
                env_name = alias
            if env_name in environ:
                raw, source = environ[env_name], f"environment variable {env_name}"
            else:
                raw = _conf_get(conf, setting)
                if raw is None:
                    continue
                source = f"setting {setting}"
            try:
                values[spec.name] = convert(raw)
            except (TypeError, ValueError) as exc:
                raise ConfigurationError(
                    f"{source} = {raw!r} is not a valid {type_name}: {exc}"
                ) from exc
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        positive = {
            "poll_interval": self.poll_interval,
            "poll_interval_min": self.poll_interval_min,
            "wakeup_poll_interval": self.wakeup_poll_interval,
            "control_poll_interval": self.control_poll_interval,
            "queue_pause_check_seconds": self.queue_pause_check_seconds,
            "claim_batch_size": self.claim_batch_size,
            "max_payload_kb": self.max_payload_kb,
            "node_heartbeat_interval_seconds": self.node_heartbeat_interval_seconds,
            "node_orphan_grace_seconds": self.node_orphan_grace_seconds,
            "orphan_scan_interval": self.orphan_scan_interval,
            "job_retention_days": self.job_retention_days,
            "job_archive_batch_size": self.job_archive_batch_size,
            "log_retention_days": self.log_retention_days,
            "async_limit_single": self.async_limit_single,
            "async_limit_batch_child": self.async_limit_batch_child,
            "dlq_alert_interval_seconds": self.dlq_alert_interval_seconds,
            "batch_stream_lease_seconds": self.batch_stream_lease_seconds,
        }
        if self.statement_deadline_seconds is not None and self.statement_deadline_seconds < 0:
            raise ConfigurationError(
                "ratchet_statement_deadline_seconds must be positive, or 0 for no deadline, "
                f"got {self.statement_deadline_seconds!r}"
            )
        if self.pool_size < 1 or self.max_overflow < 0:
            raise ConfigurationError(
                f"ratchet_pool_size ({self.pool_size}) must be at least 1 and "
                f"ratchet_max_overflow ({self.max_overflow}) at least 0"
            )
        for name, value in positive.items():
            if not value > 0:  # NaN too: it compares false with everything
                raise ConfigurationError(f"ratchet_{name} must be positive, got {value!r}")
        try:
            CronExpression(self.job_archiver_cron)
        except CronError as exc:
            raise ConfigurationError(f"ratchet_job_archiver_cron: {exc}") from exc
        if self.priority_boost_interval_minutes < 0:
            raise ConfigurationError(
                "ratchet_priority_boost_interval_minutes must be 0 (no aging) or positive, "
                f"got {self.priority_boost_interval_minutes!r}"
            )
        if self.unknown_task_grace_seconds < 0:
            raise ConfigurationError(
                "ratchet_unknown_task_grace_seconds must be 0 (fail at once) or positive, "
                f"got {self.unknown_task_grace_seconds!r}"
            )
        if self.clock_skew_warning_seconds < 0:
            raise ConfigurationError(
                "ratchet_clock_skew_warning_seconds must be 0 (no warning) or positive, "
                f"got {self.clock_skew_warning_seconds!r}"
            )
        if self.max_recoveries < 0:
            raise ConfigurationError(
                f"ratchet_max_recoveries must be 0 or more, got {self.max_recoveries!r}"
            )
        if not 0 <= self.default_priority <= 9:
            raise ConfigurationError(
                f"ratchet_default_priority must be within 0-9, got {self.default_priority!r}"
            )
        if self.dlq_alert_task is not None:
            check_alert_task_name(self.dlq_alert_task)
        if self.node_orphan_grace_seconds <= self.node_heartbeat_interval_seconds:
            raise ConfigurationError(
                "ratchet_node_orphan_grace_seconds "
                f"({self.node_orphan_grace_seconds}) must exceed "
                f"ratchet_node_heartbeat_interval_seconds ({self.node_heartbeat_interval_seconds}),"
                " or live nodes would be declared dead between two heartbeats"
            )


def known_settings() -> frozenset[str]:
    """Every ``ratchet_*`` setting an app's configuration may hold."""
    return frozenset(f"ratchet_{spec.name}" for spec in fields(RatchetSettings)) | OTHER_SETTINGS


def check_setting_names(conf: Mapping[str, Any]) -> None:
    """Refuse a ``ratchet_*`` key of ``conf`` that is no setting: a misspelt ``ratchet_url``
    would otherwise leave the store at its default, and jobs where no worker looks.

    Keys under a namespace (Django's ``CELERY_RATCHET_URL`` with ``namespace="CELERY"``)
    are checked by their name without it. Environment variables are not checked: other
    programs use the ``RATCHET_`` prefix too."""
    try:
        keys = [key for key in conf if isinstance(key, str)]
        # Known once Celery's configuration is loaded: after the keys.
        prefix = str(getattr(conf, "prefix", None) or "")
    except Exception:  # Celery's lazy settings may raise while loading
        return
    known = known_settings()
    for key in keys:
        namespace = ""
        if prefix and key.upper().startswith(prefix.upper()):
            namespace, name = key[: len(prefix)], key[len(prefix) :].lower()
            if name in DJANGO_SETTINGS:
                continue
        else:
            name = key
        if not name.startswith("ratchet_") or name in known:
            continue
        # Compared without the prefix every setting shares, which would make any name close.
        suffixes = sorted(setting.removeprefix("ratchet_") for setting in known)
        closest = [
            f"ratchet_{suffix}"
            for suffix in difflib.get_close_matches(name.removeprefix("ratchet_"), suffixes, n=1)
        ]
        if not closest:
            hint = "no setting has a similar name"
        elif key.isupper():
            hint = f"did you mean {(namespace + closest[0]).upper()}?"
        else:
            hint = f"did you mean {namespace}{closest[0]}?"
        raise ConfigurationError(
            f"unknown setting {key}: {hint} A setting celery_ratchet does not know is refused "
            "rather than ignored; every setting is listed in docs/reference/configuration.md"
        )


def check_alert_task_name(name: str) -> None:
    """``ratchet_dlq_alert_task`` is a Celery task name, sent by name like ``app.send_task``:
    not an import path (``module:function``), which Celery cannot send."""
    if ":" in name:
        module, _, function = name.partition(":")
        suggested = f"{module}.{function}"
        raise ConfigurationError(
            f"ratchet_dlq_alert_task = {name!r} looks like an import path; give the task's "
            f"registered Celery name instead, e.g. {suggested!r} (Celery's name for "
            f"a task defined as {function}() in module {module}), or the name= it was "
            "registered with"
        )
    if not name.strip() or name != name.strip() or len(name) > 255:
        raise ConfigurationError(
            f"ratchet_dlq_alert_task = {name!r} must be a task name of 1-255 characters "
            "without surrounding spaces"
        )


def _conf_get(conf: Mapping[str, Any], key: str) -> Any:
    try:
        return conf.get(key)
    except Exception:  # Celery's lazy settings may raise while loading
        return None


MASK = "***"
_SECRET_KEY = re.compile(r"pass|pwd|secret|token|credential|auth|api_?key", re.IGNORECASE)
_URL_START = r"[A-Za-z][A-Za-z0-9+.\-]*://"
#: ``scheme://user:password@``: the password runs to the last ``@`` of the line before the
#: next URL (it may hold spaces, ``/``, ``:`` or an unencoded ``@``).
#: A password masked already (``***@`` and a host with no ``@``) is left alone: masked
#: again, it would run on to an ``@`` later in the message (MySQL's ``'user'@'host'``) and
#: hide the text in between.
_USERINFO = re.compile(
    rf"(?P<head>{_URL_START}[^\s:/@]*:)(?!\*\*\*@[^\s@]*(?:\s|$))(?:(?!{_URL_START})[^\n])*@"
)
#: ``key=value`` of a credential, in a URL's query or a ``key=value`` connection string.
_SECRET_PAIR = re.compile(
    r"(?P<head>(?:^|(?<=[\s?&;,(]))(?P<key>[\w.\-]+)\s*=\s*)"
    r"(?P<value>'[^']*'|\"[^\"]*\"|[^&\s;,)]*)"
)
_NO_SCHEME_USERINFO = re.compile(r"^(?P<head>\s*(?:[A-Za-z][\w+.\-]*:/+)?[^\s:/@]*:)[^\n]*@")


def is_secret_key(key: str) -> bool:
    """Whether a setting, query or connection parameter named ``key`` holds a credential."""
    return bool(_SECRET_KEY.search(key))


def _mask_pair(match: re.Match[str]) -> str:
    if not is_secret_key(match["key"]):
        return match[0]
    return f"{match['head']}{MASK}"


def mask_password(text: str, *, whole: bool = False) -> str:
    """Replace every credential in ``text`` with ``***``: the password of each URL, and each
    credential parameter (``password=``, ``sslpassword=``, ``token=``...).

    Conservative, for text that may not be a well-formed URL: a password is taken to run to
    the last ``@`` of its line (before the next URL). ``whole``: ``text`` is a single URL,
    maybe without a scheme, whose query values may hold spaces (they run to the next ``&``).
    """
    text = str(text)
    masked = _USERINFO.sub(rf"\g<head>{MASK}@", text)
    if whole and masked == text and "://" not in text:
        masked = _NO_SCHEME_USERINFO.sub(rf"\g<head>{MASK}@", text)
    if whole and "?" in masked:
        base, _, query = masked.partition("?")
        pairs = [
            f"{k}={MASK}" if sep and is_secret_key(k) else f"{k}{sep}{v}"
            for k, sep, v in (p.partition("=") for p in query.split("&"))
        ]
        return f"{base}?{'&'.join(pairs)}"
    return _SECRET_PAIR.sub(_mask_pair, masked)
