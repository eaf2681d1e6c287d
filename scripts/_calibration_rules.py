"""Calibration rules and their error tables: what one early usage report does to the estimate."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from _timing import interpolated
from _token_data import (
    Session,
    anchor_index,
    pct,
    prefix_sums,
)

from shared.core.calibration import CALIBRATION_MAX_RATIO, CALIBRATION_MIN_RATIO
from shared.core.tokens import (
    Calibration,
    HeuristicCounter,
    TokenCounter,
    hybrid_estimate,
)
from shared.core.tokens_exact import TiktokenCounter

TARGET = 0.03


EARLY = 3
"""The report comes with the request that produced this assistant message."""


LATE = (10, 20)


@dataclass(frozen=True)
class Trace:
    """One session seen through one estimator.

    ``est[k]`` and ``tool[k]`` are the estimate of the request ``messages[:k]``
    and the part of it spent on tool results; ``truth`` holds the true prompt
    tokens where they are known (every prefix for o200k, the reported calls
    for Gemini); ``truth_tool`` the true tokens of tool results (o200k only).
    """

    session: Session
    est: list[int]
    tool: list[int]
    truth: dict[int, int]
    truth_tool: list[int] | None = None

    def anchor(self, after_assistant: int) -> int | None:
        """The first prefix with a known truth at or after the given assistant message."""
        start = anchor_index(self.session.messages, after_assistant)
        if self.truth_tool is None:  # a reported call covers the prefix before its reply
            start -= 1
        return next((k for k in sorted(self.truth) if k >= start), None)


Rule = Callable[[Trace, int, int], float]
"""(trace, anchor prefix, later prefix) -> predicted prompt tokens of the later prefix."""


def tool_flags(session: Session) -> list[bool]:
    return [m.role == "tool" for m in session.messages]


def cumulative(values: Iterable[int]) -> list[int]:
    """``out[k]`` is the sum of the first ``k`` values."""
    out = [0]
    for n in values:
        out.append(out[-1] + n)
    return out


def make_trace(
    session: Session,
    per_message: Sequence[int],
    truth: dict[int, int],
    true_per_message: Sequence[int] | None = None,
) -> Trace:
    flags = tool_flags(session)

    def tools_only(values: Sequence[int]) -> list[int]:
        return cumulative(n if f else 0 for n, f in zip(values, flags, strict=True))

    return Trace(
        session,
        prefix_sums(per_message),
        tools_only(per_message),
        truth,
        None if true_per_message is None else tools_only(true_per_message),
    )


# -- the rules -------------------------------------------------------------------------
def single_ratio(tr: Trace, a: int, k: int) -> float:
    """Production: one ``Calibration.update`` and ``hybrid_estimate``."""
    calibration = Calibration().update(tr.truth[a], tr.est[a])
    return hybrid_estimate(tr.truth[a], tr.est[a], tr.est[k], calibration)


@dataclass(frozen=True)
class Shrunk:
    """Idea 2: ratio = prior + w (reported / estimated - prior), w = E / (E + strength).

    ``strength`` (estimated tokens) is the size of a report as informative as
    the prior: observation variance per token over the prior's variance.
    """

    prior: float
    strength: float

    def __call__(self, tr: Trace, a: int, k: int) -> float:
        e = tr.est[a]
        weight = e / (e + self.strength) if math.isfinite(self.strength) else 0.0
        ratio = self.prior + weight * (tr.truth[a] / e - self.prior)
        return tr.truth[a] + ratio * (tr.est[k] - tr.est[a])


def clamp(ratio: float) -> float:
    return min(max(ratio, CALIBRATION_MIN_RATIO), CALIBRATION_MAX_RATIO)


@dataclass(frozen=True)
class ClassSplit:
    """Idea 1: one class keeps the prior ratio, the report's residual is charged to the other.

    ``solve="tool"``: prose at the prior, tool results get the solved ratio
    (shrunk toward the prior with weight E_tool / (E_tool + strength)).
    ``solve="prose"``: the reverse. Each class is then scaled by its own ratio.
    """

    prior: float
    solve: str = "tool"
    strength: float = 0.0

    def ratios(self, tr: Trace, a: int) -> tuple[float, float]:
        """(prose ratio, tool ratio) learned from the report at prefix ``a``."""
        tool, prose = tr.tool[a], tr.est[a] - tr.tool[a]
        solved_part, fixed_part = (tool, prose) if self.solve == "tool" else (prose, tool)
        if solved_part == 0:
            return self.prior, self.prior
        raw = clamp((tr.truth[a] - self.prior * fixed_part) / solved_part)
        solved = self.prior + solved_part / (solved_part + self.strength) * (raw - self.prior)
        return (self.prior, solved) if self.solve == "tool" else (solved, self.prior)

    def __call__(self, tr: Trace, a: int, k: int) -> float:
        prose_ratio, tool_ratio = self.ratios(tr, a)
        d_tool = tr.tool[k] - tr.tool[a]
        d_prose = tr.est[k] - tr.est[a] - d_tool
        return tr.truth[a] + prose_ratio * d_prose + tool_ratio * d_tool


@dataclass(frozen=True)
class Linear:
    """Reference, not a rule: the rest's ratio as a least-squares linear function of the
    report's *true per-class* ratios (more than a report tells), fitted in hindsight."""

    coef: tuple[float, float, float]
    prior: float

    def features(self, tr: Trace, a: int) -> tuple[float, float]:
        assert tr.truth_tool is not None
        true_tool, est_tool = tr.truth_tool[a], tr.tool[a]
        prose = (tr.truth[a] - true_tool) / (tr.est[a] - est_tool)
        return prose, (true_tool / est_tool if est_tool else self.prior)

    def __call__(self, tr: Trace, a: int, k: int) -> float:
        prose, tool = self.features(tr, a)
        ratio = self.coef[0] + self.coef[1] * prose + self.coef[2] * tool
        return tr.truth[a] + ratio * (tr.est[k] - tr.est[a])


# -- evaluation ------------------------------------------------------------------------
def halves(traces: Sequence[Trace]) -> list[tuple[str, list[Trace]]]:
    return [
        ("fit", [t for t in traces if not t.session.held_out]),
        ("held-out", [t for t in traces if t.session.held_out]),
        ("all", list(traces)),
    ]


def signed_errors(traces: Iterable[Trace], rule: Rule, after: int) -> list[float]:
    out: list[float] = []
    for tr in traces:
        a = tr.anchor(after)
        if a is None:
            continue
        out.extend(rule(tr, a, k) / tr.truth[k] - 1 for k in sorted(tr.truth) if k > a)
    return out


def cells(traces: Sequence[Trace], rule: Rule, after: int = EARLY) -> list[str]:
    """p95 / max absolute error per half."""
    out = []
    for _, group in halves(traces):
        errors = [abs(e) for e in signed_errors(group, rule, after)]
        out.append(f"{pct(interpolated(errors, 0.95))} / {pct(max(errors))}")
    return out


def rest_ratio(tr: Trace, a: int) -> float:
    last = max(tr.truth)
    return (tr.truth[last] - tr.truth[a]) / (tr.est[last] - tr.est[a])


def prior_strength(traces: Sequence[Trace], prior: float, part: str = "all") -> float:
    """Method of moments on the fit half: strength = kappa^2 / tau^2, with tau^2 the
    spread of the rest's ratio around the prior and kappa^2 / E the variance of a
    report covering E estimated tokens around the rest's ratio."""
    tau2, kappa2 = [], []
    for tr in traces:
        a = tr.anchor(EARLY)
        if tr.session.held_out or a is None or a == max(tr.truth):
            continue
        if part == "tool":
            last = max(tr.truth)
            if tr.truth_tool is None or not tr.tool[a] or tr.tool[last] == tr.tool[a]:
                continue
            rest = (tr.truth_tool[last] - tr.truth_tool[a]) / (tr.tool[last] - tr.tool[a])
            seen = ClassSplit(prior, "tool", 0.0).ratios(tr, a)[1]
            size = tr.tool[a]
        else:
            rest, seen, size = rest_ratio(tr, a), tr.truth[a] / tr.est[a], tr.est[a]
        tau2.append((rest - prior) ** 2)
        kappa2.append((seen - rest) ** 2 * size)
    return statistics.fmean(kappa2) / statistics.fmean(tau2)


def fit_linear(traces: Sequence[Trace], prior: float) -> Linear:
    """Least squares of the rest's ratio on (1, prose ratio, tool ratio) over all sessions."""
    probe = Linear((0.0, 0.0, 0.0), prior)
    rows: list[tuple[float, float, float, float]] = []
    for tr in traces:
        a = tr.anchor(EARLY)
        if a is not None and a < max(tr.truth):
            rows.append((1.0, *probe.features(tr, a), rest_ratio(tr, a)))
    gram = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    rhs = [sum(r[i] * r[3] for r in rows) for i in range(3)]
    c = solve3(gram, rhs)
    return Linear((c[0], c[1], c[2]), prior)


def solve3(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting for a 3x3 system."""
    m = [[*row, b] for row, b in zip(matrix, rhs, strict=True)]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(3):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][3] / m[i][i] for i in range(3)]


# -- what the early report knows -------------------------------------------------------------
def knowledge_lines(traces: Sequence[Trace], prior: float) -> list[str]:
    out = [
        "| sessions | n | sd of the rest's ratio | corr(report ratio, rest) "
        "| corr(true prose ratio of the report, rest) | corr(true tool ratio, rest) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    probe = Linear((0.0, 0.0, 0.0), prior)
    groups = [("all", list(traces)), ("coding", [t for t in traces if "swe" in t.session.id])]
    for name, group in groups:
        rest, seen, prose, tool = [], [], [], []
        for tr in group:
            a = tr.anchor(EARLY)
            if a is None or a == max(tr.truth):
                continue
            rest.append(rest_ratio(tr, a))
            seen.append(tr.truth[a] / tr.est[a])
            p, t = probe.features(tr, a)
            prose.append(p)
            tool.append(t if tr.tool[a] else math.nan)
        pairs = [(t, r) for t, r in zip(tool, rest, strict=True) if not math.isnan(t)]
        corr_tool = statistics.correlation([t for t, _ in pairs], [r for _, r in pairs])
        out.append(
            f"| {name} | {len(rest)} | {100 * statistics.pstdev(rest):.1f}% "
            f"| {statistics.correlation(seen, rest):+.2f} "
            f"| {statistics.correlation(prose, rest):+.2f} | {corr_tool:+.2f} |"
        )
    return out


# -- the report ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Hindsight:
    """The best single ratio for the rest of each session, known in hindsight."""

    def __call__(self, tr: Trace, a: int, k: int) -> float:
        return tr.truth[a] + rest_ratio(tr, a) * (tr.est[k] - tr.est[a])


def heuristic_traces(
    sessions: Sequence[Session],
    o200k: TiktokenCounter,
    margin: float,
    *,
    exact_tools: bool,
) -> list[Trace]:
    counter = HeuristicCounter("openai", safety_margin=margin)
    out = []
    for s in sessions:
        true = [o200k.message(m) for m in s.messages]
        est = [
            math.ceil(t * (1 + margin)) if exact_tools and m.role == "tool" else counter.message(m)
            for m, t in zip(s.messages, true, strict=True)
        ]
        out.append(make_trace(s, est, dict(enumerate(prefix_sums(true))), true))
    return out


def gemini_traces(sessions: Sequence[Session], margin: float) -> list[Trace]:
    return reported_traces(sessions, HeuristicCounter("gemini", safety_margin=margin))


def reported_traces(sessions: Sequence[Session], counter: TokenCounter) -> list[Trace]:
    """``counter`` against the prompt tokens Gemini reported (sessions with 2+ reports)."""
    out = []
    for s in sessions:
        truth = {i: n for i, n in enumerate(s.usage) if n}
        if len(truth) > 1:
            out.append(make_trace(s, [counter.message(m) for m in s.messages], truth))
    return out


# -- the exact counter as the estimator (COMPACTION_TOKEN_COUNTER=tiktoken) -----------------
def counter_traces(
    sessions: Sequence[Session], counter: TokenCounter, truth: TokenCounter
) -> list[Trace]:
    """``counter`` as the estimator, ``truth`` (a tokenizer with chat framing) on every prefix."""
    out = []
    for s in sessions:
        true = [truth.message(m) for m in s.messages]
        est = [counter.message(m) for m in s.messages]
        out.append(make_trace(s, est, dict(enumerate(prefix_sums(true))), true))
    return out


def whole_session_errors(traces: Iterable[Trace]) -> list[float]:
    """Uncalibrated error of each session at its last known truth (the whole session for a
    tokenizer, the last reported call for Gemini)."""
    return [tr.est[k] / tr.truth[k] - 1 for tr in traces for k in [max(tr.truth)]]


Row = tuple[str, Sequence[Trace], Rule, Sequence[Trace] | None]
"""(name, traces, rule, Gemini traces or None when the rule needs o200k.)"""


def main_table(rows: Sequence[Row]) -> list[str]:
    out = [
        f"| one report after assistant message {EARLY} | fit p95 / max | held-out p95 / max "
        "| all p95 / max | Gemini-reported truth: fit / held-out p95 |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, traces, rule, gemini in rows:
        gem = "-"
        if gemini is not None:
            gem = " / ".join(
                pct(interpolated([abs(e) for e in signed_errors(g, rule, EARLY)], 0.95))
                for _, g in halves(gemini)[:2]
            )
        out.append(f"| {name} | {' | '.join(cells(traces, rule))} | {gem} |")
    return out


def anchor_table(traces: Sequence[Trace], rules: Sequence[tuple[str, Rule]]) -> list[str]:
    positions = (EARLY, 5, *LATE[:1], 15, *LATE[1:])
    out = [
        "| rule, p95 fit / held-out, one report after assistant message | "
        + " | ".join(str(n) for n in positions)
        + " |",
        "|---|" + "---:|" * len(positions),
    ]
    for name, rule in rules:
        row = []
        for n in positions:
            row.append(
                " / ".join(
                    pct(interpolated([abs(e) for e in signed_errors(g, rule, n)], 0.95))
                    for _, g in halves(traces)[:2]
                )
            )
        out.append(f"| {name} | {' | '.join(row)} |")
    return out
