"""The job store of a Django project with ``celery_ratchet.contrib.django`` installed: Django's
own database.

With the app in ``INSTALLED_APPS`` and no ``CELERY_RATCHET_URL``, the store is
``DATABASES["default"]`` (``CELERY_RATCHET_DATABASE`` names another alias): the same server,
database and credentials. Sends made while a transaction is open on that database are written
in it (``ratchet_django_connection`` defaults to that alias) whenever the store is that
database, so a rolled-back ``atomic()`` leaves no job; ``CELERY_RATCHET_DJANGO_CONNECTION =
""`` turns that off. Without the app nothing here applies, and a project configures
``CELERY_RATCHET_URL`` as any app does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from celery_ratchet.errors import ConfigurationError
from celery_ratchet.store.lent import url_of_database, url_reaches

#: The Django app whose presence makes Django's database the job store.
DJANGO_APP = "celery_ratchet.contrib.django"
#: The Django setting naming the alias of the job store's database.
DATABASE_SETTING = "CELERY_RATCHET_DATABASE"


def project_settings() -> Any | None:
    """Django's settings, when this process runs a Django project that installed the app;
    never imports Django itself (a process without it is no Django project)."""
    if "django.conf" not in sys.modules:
        return None
    from django.conf import settings

    try:
        if not settings.configured or DJANGO_APP not in settings.INSTALLED_APPS:
            return None
    except Exception:  # settings that cannot be loaded: Django itself says why, elsewhere
        return None
    return settings


def store_alias(settings: Any) -> str:
    return str(getattr(settings, DATABASE_SETTING, None) or "default")


def connection_of(alias: str) -> Any:
    from django.db import connections

    if alias not in connections.settings:
        raise ConfigurationError(
            f"{DATABASE_SETTING} = {alias!r}: DATABASES has no such alias (it has "
            f"{', '.join(sorted(connections.settings)) or 'none'}); name one of them"
        )
    return connections[alias]


def where(wrapper: Any) -> dict[str, Any]:
    """Where a Django connection goes, as the store compares databases."""
    settings = wrapper.settings_dict
    port = settings.get("PORT")
    return {
        "vendor": wrapper.vendor,
        "host": settings.get("HOST") or None,
        "port": int(port) if port else None,
        "database": str(settings.get("NAME") or "") or None,
    }


def database_url(alias: str) -> str:
    """The job store URL of ``DATABASES[alias]``."""
    wrapper = connection_of(alias)
    settings = wrapper.settings_dict
    port = settings.get("PORT")
    return url_of_database(
        wrapper.vendor,
        user=settings.get("USER") or None,
        password=settings.get("PASSWORD") or None,
        host=settings.get("HOST") or None,
        port=int(port) if port else None,
        database=str(settings.get("NAME") or "") or None,
        options=dict(settings.get("OPTIONS") or {}),
    )


def explicit_url(conf: Mapping[str, Any]) -> str | None:
    """The store URL set in the environment or the app's configuration, if one is."""
    return os.environ.get("RATCHET_URL") or _get(conf, "ratchet_url") or None


def with_django_defaults(conf: Mapping[str, Any]) -> Mapping[str, Any]:
    """``conf`` with what the Django app makes the default: the store URL, and the alias
    whose transactions sends join."""
    settings = project_settings()
    if settings is None:
        return conf
    alias = store_alias(settings)
    defaults: dict[str, Any] = {}
    url = explicit_url(conf)
    if url is None:
        defaults["ratchet_url"] = database_url(alias)
        joins = True
    else:
        joins = url_reaches(url, **where(connection_of(alias)))
    chosen = os.environ.get("RATCHET_DJANGO_CONNECTION", _get(conf, "ratchet_django_connection"))
    if joins and chosen is None:
        defaults["ratchet_django_connection"] = alias
    return _Defaults(conf, defaults) if defaults else conf


def schema_url(alias: str) -> str | None:
    """The URL of the job store whose tables ``manage.py migrate`` on ``alias`` makes or
    brings up to date, when the store is ``alias``'s database; None for another database
    (contrib/django/schema.py applies it)."""
    settings = project_settings()
    if settings is None or alias != store_alias(settings):
        return None
    from django.conf import settings as django_settings

    url = os.environ.get("RATCHET_URL") or getattr(django_settings, "CELERY_RATCHET_URL", None)
    if url and not url_reaches(url, **where(connection_of(alias))):
        return None  # the store is elsewhere: `manage.py check` says so
    return url or database_url(alias)


def _get(conf: Mapping[str, Any], key: str) -> Any:
    try:
        return conf.get(key)
    except Exception:  # Celery's lazy settings may raise while loading
        return None


class _Defaults(Mapping[str, Any]):
    """``conf``, with ``defaults`` for the keys it leaves unset."""

    def __init__(self, conf: Mapping[str, Any], defaults: dict[str, Any]) -> None:
        self.conf, self.defaults = conf, defaults

    @property
    def prefix(self) -> str | None:
        """Celery's namespace of ``conf`` (``CELERY_``), if it has one."""
        return getattr(self.conf, "prefix", None)

    def get(self, key: str, default: Any = None) -> Any:
        value = _get(self.conf, key)
        return self.defaults.get(key, default) if value is None else value

    def __getitem__(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter({*self.conf, *self.defaults})

    def __len__(self) -> int:
        return len({*self.conf, *self.defaults})
