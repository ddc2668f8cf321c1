"""The standard Django ``celery.py``, with celery_ratchet's app class: no broker.

Start a worker from this directory with ``celery -A shop worker -P ratchet``.
"""

from __future__ import annotations

import os

from celery_ratchet import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")

app = Celery("shop")
# Every CELERY_-prefixed setting, CELERY_RATCHET_URL among them.
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
