"""The path of a claimed job through Celery's execution, and of its outcome back."""
