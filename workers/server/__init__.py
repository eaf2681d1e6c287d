"""``compaction serve``: the guard over HTTP, for agents in any language (``[server]`` extra).

- :mod:`workers.server.config` — ``ServerConfig`` (tokens -> tenants, body limit,
  bind address), read from ``COMPACTION_SERVER_*``; imports nothing optional;
- :mod:`workers.server.schemas` — the pydantic request and response models;
- :mod:`workers.server.app` — ``create_app(config, store, ...)``: auth,
  body-size limit, JSON errors carrying the exception tree's codes;
- :mod:`workers.server.routes` — the endpoints (record, prepare, recover,
  stats, compact, history);
- :mod:`workers.server.main` — the app built from settings (``compaction
  serve``, ``uvicorn --factory workers.server.main:app_from_env``);
- :mod:`workers.server.process` — the server as a child process on a free
  port (tests, benchmark).

This package imports nothing optional; ``app`` and ``routes`` need fastapi.
"""
