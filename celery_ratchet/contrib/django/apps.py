"""The Django app's configuration: its checks are registered when Django is ready."""

from __future__ import annotations

from django.apps import AppConfig


class RatchetConfig(AppConfig):
    name = "celery_ratchet.contrib.django"
    label = "celery_ratchet"
    verbose_name = "celery_ratchet job store"

    def ready(self) -> None:
        from celery_ratchet.contrib.django import checks  # noqa: F401  (registers them)
