"""The one stack harness: store, broker and workers, for the demo, the replay and the tests.

- :mod:`.redis_server`: find or start ``redis-server`` (also a local
  Redis Cluster and a reply-dropping proxy for failure tests);
- :mod:`.worker_process`: real ``celery worker`` processes and their
  environment, the job outcomes they log;
- :mod:`.in_process`: a worker in a thread of this process (fakeredis or
  a real store, usually the ``memory://`` broker);
- :mod:`.services`: the replay's stack (configured Redis, a started
  ``redis-server``, or in-process), built from the three above;
- :mod:`.demo`: the demo's stack (embedded, or a configured deployment)
  and what landed in the store.

Nothing here is imported by the worker runtime (``tests/test_layers.py``).
"""
