"""``ratchet web``: a dashboard of the job store, in place of Flower (the ``web`` extra:
Jinja2 templates, served by waitress or else the standard library's server).

It reads and acts through the store's and the runtime's operations; it imports neither
SQLAlchemy nor Celery itself (``./dev lint`` checks that)."""
