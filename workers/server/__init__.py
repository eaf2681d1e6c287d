"""``compaction serve``: the guard over HTTP, for agents in any language (``[server]`` extra).

- :mod:`workers.server.config` — ``ServerConfig`` (tokens -> tenants, body limit,
  bind address), read from ``COMPACTION_SERVER_*``; imports nothing optional;
- :mod:`workers.server.schemas` — the pydantic request and response models;
- :mod:`workers.server.app` — ``create_app(config, store, ...)``: auth,
  body-size limit, JSON errors carrying the exception tree's codes;
- :mod:`workers.server.routes` — the endpoints (record, prepare, recover,
  stats, compact, history).

This package imports nothing optional; ``app`` and ``routes`` need fastapi.
"""
