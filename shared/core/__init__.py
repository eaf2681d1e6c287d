"""The pure core: every decision that does not need I/O.

Messages and wire formats, token estimation, context limits, turn
boundaries, the budget formula, overflow detection, tool-pair repair,
emergency truncation, cheap stages, the fact ledger and view building.
Nothing here imports redis, celery, kombu or a provider SDK (a test loads
every module with those blocked), so the same code serves the sync and
async guards, the workers and any other shell.
"""
