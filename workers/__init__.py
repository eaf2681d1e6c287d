"""Celery workers: summarize sessions off the hot path."""
