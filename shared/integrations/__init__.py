"""Drop-in adapters for agent frameworks: thin shells over the guard.

Each adapter lives in its own module and imports its framework there, and
only there (install the matching extra):

- :mod:`shared.integrations.langchain`: ``ContextGuardMiddleware`` for LangChain v1's
  ``create_agent`` (``pip install 'context-compaction[langchain]'``).
- :mod:`shared.integrations.pydantic_ai`: ``ContextGuardCapability`` for pydantic-ai
  agents (``pip install 'context-compaction[pydantic-ai]'``).
- :mod:`shared.integrations.agents_sdk`: ``GuardedSession`` for the OpenAI Agents SDK
  (``pip install 'context-compaction[openai-agents]'``); its budget filter and
  model wrapper are in :mod:`shared.integrations.agents_run`, and the item
  mapping, which needs no SDK, in :mod:`shared.integrations.agents_items`.

Each gives the model the ``recall`` tool and runs its calls against the guard
(LangChain and pydantic-ai by default, the Agents SDK with
``session.recall_tool()``); what they share is in :mod:`shared.integrations._common`.

This package itself imports nothing optional: ``import shared.integrations``
works with no framework installed.
"""

from __future__ import annotations

__all__: list[str] = []
