"""Django without Celery: Django's own database as the job store, and jobs written in
Django's transaction so that they exist if and only if it commits."""
