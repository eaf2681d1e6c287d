"""The shippable form of the pre-token ceiling: `re` pre-tokens at their shape's mean."""

from __future__ import annotations

import math
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import _timing  # noqa: F401  (puts this checkout first on sys.path)
from _calibration_pieces import PieceTable, by_shape, message_texts
from _calibration_rules import Trace, halves, make_trace
from _token_data import (
    Doc,
    Session,
    pct,
    prefix_sums,
)

from shared.core.messages import Message
from shared.core.tokens import (
    MESSAGE_OVERHEAD,
    TOOL_CALL_OVERHEAD,
    estimate_tokens,
)
from shared.core.tokens_exact import TiktokenCounter

# -- the shippable form: Python's re, a shape table, no vocabulary --------------------------
RE_PRETOKENS = re.compile(
    r"(?:[^\w\r\n]|_)?[A-Z]*[a-z]+(?:'(?:[st]|re|ve|m|ll|d))?"
    r"|(?:[^\w\r\n]|_)?[A-Z]+[a-z]*"
    r"|(?:[^\w\r\n]|_)?[^\W\d_]+"
    r"|\d{1,3}"
    r"| ?(?:[^\s\w]|_)+[\r\n/]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)
"""o200k's pre-tokenizer approximated with the standard library's ``re`` (no Unicode
letter categories: case is told apart for ASCII only)."""


class RePretokenEstimator:
    """Pre-tokens found by ``RE_PRETOKENS``, each costing its shape's mean from a table
    (memoized per distinct pre-token); framing as ``HeuristicCounter``."""

    def __init__(self, means: Mapping[str, float], margin: float) -> None:
        self.cost = by_shape(means)
        self.margin = margin
        self.cache: dict[str, float] = {}

    @classmethod
    def fitted(cls, table: PieceTable, docs: Sequence[Doc], margin: float) -> RePretokenEstimator:
        """Shape means over ``docs`` pre-tokenized the way the estimator will see text."""
        own = PieceTable(table.encoding, RE_PRETOKENS)
        kinds = sorted({d.kind for d in docs})
        counts = [own.count(d.text for d in docs if d.kind == k) for k in kinds]
        return cls(own.means(counts), margin)

    def text(self, text: str) -> float:
        total, cache = 0.0, self.cache
        for piece, n in Counter(RE_PRETOKENS.findall(text)).items():
            value = cache.get(piece)
            if value is None:
                value = cache[piece] = self.cost(piece)
            total += n * value
        return total

    def message(self, message: Message) -> int:
        fixed = MESSAGE_OVERHEAD + TOOL_CALL_OVERHEAD * len(message.tool_calls)
        content = sum(self.text(t) for t in message_texts(message))
        return fixed + math.ceil(content * (1 + self.margin) - 1e-9)


def uncalibrated_line(name: str, traces: Sequence[Trace], margin: float) -> str:
    """Whole-session error without any report, per half (the uncalibrated targets)."""
    cells = []
    for half, group in halves(traces)[:2]:
        errors = [tr.est[-1] / tr.truth[len(tr.est) - 1] - 1 for tr in group]
        cells.append(
            f"{half} half worst {pct(min(errors))}, median {pct(statistics.median(errors))}"
        )
    return f"Uncalibrated, {name} with margin {margin:g}: {'; '.join(cells)}."


def re_traces(
    sessions: Sequence[Session], o200k: TiktokenCounter, estimator: RePretokenEstimator
) -> list[Trace]:
    out = []
    for s in sessions:
        true = [o200k.message(m) for m in s.messages]
        est = [estimator.message(m) for m in s.messages]
        out.append(make_trace(s, est, dict(enumerate(prefix_sums(true))), true))
    return out


def speed_line(sessions: Sequence[Session], estimator: RePretokenEstimator) -> str:
    """ms per MB of message text: the heuristic, and the ``re`` estimator cold and warm."""
    text = "".join(t for s in sessions for m in s.messages for t in message_texts(m))
    megabytes = len(text.encode()) / 1e6

    def best(fn: Callable[[], object], runs: int = 3) -> float:
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times) * 1000 / megabytes

    heuristic = best(lambda: estimate_tokens(text, safety_margin=0.0))
    estimator.cache.clear()
    cold = best(lambda: estimator.text(text), runs=1)
    warm = best(lambda: estimator.text(text))
    return (
        f"Speed on the sessions' {megabytes:.1f} MB of message text: heuristic "
        f"{heuristic:.0f} ms/MB; `re` pre-token estimator {cold:.0f} ms/MB with an empty "
        f"memo, {warm:.0f} ms/MB warm ({warm / heuristic:.1f}x the heuristic; "
        f"`RE_PRETOKENS.findall` alone takes most of it)."
    )
