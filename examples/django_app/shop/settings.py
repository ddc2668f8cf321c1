"""Settings of the shop example: one PostgreSQL database for Django's tables and the jobs
(no CELERY_RATCHET_URL: with celery_ratchet.contrib.django the store is DATABASES["default"]).

``SHOP_DATABASE_URL`` says where (default ``postgresql://postgres@127.0.0.1:5432/shop``).
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

DATABASE_URL = os.environ.get("SHOP_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/shop")
_db = urlsplit(DATABASE_URL)

SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "only-for-the-example")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "shop.urls"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# celery_ratchet's Django app: migrate makes the job store's tables in DATABASES["default"],
# which is the job store, and a send inside transaction.atomic() is written in it.
INSTALLED_APPS = ["celery_ratchet.contrib.django", "orders"]
MIDDLEWARE: list[str] = []

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.path.lstrip("/"),
        "USER": unquote(_db.username or ""),
        "PASSWORD": unquote(_db.password or ""),
        "HOST": _db.hostname or "",
        "PORT": _db.port or "",
    }
}

# Never contacted: there is no broker.
CELERY_BROKER_URL = "amqp://unused:unused@127.0.0.1:1//"
CELERY_TASK_TRACK_STARTED = True
