"""Integrations with frameworks beyond Celery: each may import its framework."""
