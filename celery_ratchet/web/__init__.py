"""``ratchet web``: a dashboard of the job store, served by the process itself (stdlib only).

It reads and acts through the store operations the CLI uses; it imports neither SQLAlchemy
nor Celery itself (``./dev lint`` checks that)."""
