"""Test and demo harness: fake provider servers, the stack harness, replay.

The worker runtime (``workers.app``, ``workers.tasks`` and what they load)
never imports this package; the demo, ``compaction replay``, the
benchmarks and the tests do.
"""
