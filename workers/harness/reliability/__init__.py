"""Reliability scenarios against real Redis and real Celery workers, one module each.

``kill9``, ``restart``, ``races``, ``load``, ``failures``; their shared pieces
(the observed fake LLM, worker start-up, :class:`~.common.Env`) in ``common``.
``scripts/reliability.py`` runs them long and prints the figures;
``tests/test_reliability.py`` runs them at CI size.
"""
