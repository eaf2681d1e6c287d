"""Test and demo harness: fake provider servers, the stack harness, replay, reliability.

- ``stack/``: the one stack harness (Redis servers, worker processes, an
  in-process worker; the replay's and the demo's stacks built from them);
- ``fakes/``: fake OpenAI-compatible and Gemini HTTP servers;
- ``replay/``: ``compaction replay`` (sessions, runner, run, report);
- ``reliability/``: the reliability scenarios (kill9, restart, races,
  load, failures) run by ``scripts/reliability.py`` and the tests;
- ``demo_session.py``, ``transcripts.py``, ``timing.py``: a generated
  session, the data kit's transcripts, one percentile and poll loop.

The worker runtime (``workers.app``, ``workers.tasks`` and what they load)
never imports this package; the demo, ``compaction replay``, the
benchmarks and the tests do.
"""
