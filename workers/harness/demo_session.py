"""A long, realistic coding-agent session, generated deterministically.

Used by ``compaction demo``: an agent works on a fictional inventory
service over many turns, reading files (bulky outputs), searching, running
tests (tracebacks), editing files, sometimes with parallel tool calls; the
user adds constraints along the way. Everything is generated from a seed,
so the demo is reproducible and ships no third-party transcript.
"""

from __future__ import annotations

import json
import random
from typing import Any

from shared.core.messages import Message
from shared.core.turns import turn_starts
from shared.core.wire import from_openai

SYSTEM_PROMPT = (
    "You are a senior software engineer working in the repository `inventory-service`. "
    "Use the tools to read, search, edit and test code. Keep changes minimal and explain "
    "each step briefly."
)

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": name, "description": desc,
        "parameters": {"type": "object", "properties": props, "required": list(props)}}}
    for name, desc, props in [
        ("read_file", "Read a file of the repository.", {"path": {"type": "string"}}),
        ("edit_file", "Replace one exact snippet in a file.",
         {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}}),
        ("bash", "Run a shell command in the repository root.",
         {"command": {"type": "string"}}),
        ("grep", "Search the repository for a regular expression.",
         {"pattern": {"type": "string"}}),
    ]
]

MODULES = ["inventory/models.py", "inventory/api.py", "inventory/stock.py",
           "inventory/pricing.py", "inventory/warehouse.py", "inventory/events.py",
           "tests/test_stock.py", "tests/test_pricing.py", "tests/test_api.py"]
TASKS = [
    "Add a `reserve(sku, qty)` operation that fails when stock would go negative.",
    "Prices must be rounded to cents with banker's rounding; fix `pricing.total`.",
    "Emit a `StockLow` event when a warehouse drops below its reorder point.",
    "The `/items/{sku}` endpoint returns 500 for unknown SKUs; it must return 404.",
    "Support bulk transfers between warehouses in one transaction.",
    "Add pagination (limit/offset) to `/items`, default limit 50.",
]
CONSTRAINTS = [
    "Do not change the public API of `inventory.api`.",
    "Never touch the database migrations in `migrations/`.",
    "Keep Python 3.11 compatibility; no new dependencies.",
    "All money values must stay `Decimal`, never float.",
]


def _source(rng: random.Random, path: str, lines: int) -> str:
    out = [f'"""{path}: part of inventory-service."""', "from decimal import Decimal", ""]
    for n in range(lines // 6):
        name = rng.choice(["load", "apply", "check", "compute", "sync", "emit"])
        out += [f"def {name}_{n}(sku: str, qty: int) -> Decimal:",
                f"    \"\"\"{name.title()} step {n} for one SKU.\"\"\"",
                f"    if qty < {rng.randint(0, 9)}:",
                "        raise ValueError(f'bad quantity for {sku}: {qty}')",
                f"    return Decimal('{rng.randint(1, 999)}.{rng.randint(0, 99):02d}') * qty", ""]
    return "\n".join(out)


def _pytest_output(rng: random.Random, failing: bool) -> str:
    passed = rng.randint(40, 120)
    if not failing:
        return f"{'.' * passed}\n{passed} passed in {rng.uniform(0.5, 3):.2f}s"
    test = rng.choice(["test_reserve_negative", "test_total_rounding", "test_unknown_sku"])
    frames = "\n".join(
        f'  File "/repo/inventory/{rng.choice(["stock", "pricing", "api"])}.py", line '
        f"{rng.randint(10, 400)}, in {rng.choice(['reserve', 'total', 'get_item'])}"
        for _ in range(rng.randint(3, 8)))
    return (f"{'.' * (passed - 1)}F\n=== FAILURES ===\n___ {test} ___\n"
            f"Traceback (most recent call last):\n{frames}\n"
            f"AssertionError: assert Decimal('10.005') == Decimal('10.00')\n"
            f"=== 1 failed, {passed - 1} passed in {rng.uniform(0.5, 3):.2f}s ===")


def _call(n: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"call_{n:05d}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}


def generate_session(turns: int = 120, seed: int = 7) -> list[dict[str, Any]]:
    """OpenAI-format messages (system first) of a ``turns``-turn session."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    ids = iter(range(1, 10**6))
    for t in range(turns):
        task = TASKS[(t // 20) % len(TASKS)]
        if t % 20 == 0:
            request = f"New task: {task} {rng.choice(CONSTRAINTS)}"
        elif rng.random() < 0.15:
            request = f"Also: {rng.choice(CONSTRAINTS)} Continue."
        else:
            request = rng.choice(["Continue.", "Run the tests again.", "What is left?",
                                  f"Check {rng.choice(MODULES)} too.", "Go on with the fix."])
        messages.append({"role": "user", "content": request})
        for _ in range(rng.randint(1, 3)):
            calls = []
            kind = rng.random()
            if kind < 0.35:
                paths = rng.sample(MODULES, rng.randint(1, 2))  # parallel reads
                calls = [(_call(next(ids), "read_file", {"path": p}),
                          _source(rng, p, rng.randint(60, 260))) for p in paths]
            elif kind < 0.55:
                calls = [(_call(next(ids), "bash", {"command": "python -m pytest -q"}),
                          _pytest_output(rng, rng.random() < 0.6))]
            elif kind < 0.75:
                path = rng.choice(MODULES[:6])
                calls = [(_call(next(ids), "edit_file", {
                    "path": path, "old": "return Decimal(", "new": "return quantize(Decimal("}),
                    f"Edited {path}: 1 replacement.")]
            else:
                pattern = rng.choice(["def reserve", "Decimal\\(", "StockLow", "404"])
                hits = "\n".join(f"{rng.choice(MODULES)}:{rng.randint(1, 300)}: {pattern}"
                                 for _ in range(rng.randint(3, 30)))
                calls = [(_call(next(ids), "grep", {"pattern": pattern}), hits)]
            messages.append({"role": "assistant", "content": rng.choice(
                ["Let me look at the code.", "Running the tests.", "Applying the fix.",
                 "Searching for the call sites.", ""]),
                "tool_calls": [c for c, _ in calls]})
            messages += [{"role": "tool", "tool_call_id": c["id"], "content": out}
                         for c, out in calls]
        messages.append({"role": "assistant", "content": (
            f"Step {t + 1} done for: {task} Next I will "
            f"{rng.choice(['add a test', 'run the full suite', 'check the edge cases'])}.")})
    return messages


def demo_turns(turns: int, seed: int = 7) -> list[list[Message]]:
    """A generated session (without its system prompt) as core messages, split into turns."""
    body = from_openai(generate_session(turns, seed))[1:]
    starts = turn_starts(body)
    return [body[a:b] for a, b in zip(starts, [*starts[1:], len(body)], strict=True)]


__all__ = ["SYSTEM_PROMPT", "TOOLS", "demo_turns", "generate_session"]
