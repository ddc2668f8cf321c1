"""celery_ratchet as a Django app: ``INSTALLED_APPS += ["celery_ratchet.contrib.django"]``.

- ``manage.py migrate`` creates the job store's tables (and brings them up to date after an
  upgrade) in the database the store uses;
- with no ``CELERY_RATCHET_URL``, that database is ``DATABASES["default"]``
  (``CELERY_RATCHET_DATABASE = "alias"`` for another);
- a send made inside ``transaction.atomic()`` on it is written in that transaction;
- ``manage.py check`` says what is misconfigured.
"""
