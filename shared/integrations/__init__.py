"""Framework integrations (thin shells around :class:`shared.guard.ContextGuard`).

Each module imports its framework and needs that extra installed; this
package itself imports nothing optional:

- :mod:`shared.integrations.agents_sdk` — OpenAI Agents SDK (``[openai-agents]``).
"""
