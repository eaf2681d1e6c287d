"""Can one early usage report calibrate the estimator to 3%? The ideas, side by side.

The target (BENCHMARKS.md, "Token estimation"): after one provider report of
the prompt tokens of the request that produced the 3rd assistant message,
every later prefix of the session is estimated within 3% at the 95th
percentile. ``bench_tokens.py`` measures the production rule (one ratio,
``hybrid_estimate``); this script measures the alternatives against it on
the same 40 dev sessions (o200k with OpenAI framing as truth) and on the
prompt tokens Gemini itself reported in the 28 coding sessions:

- class split: the report's residual is charged to tool results (prose keeps
  the prior ratio), raw or shrunk, and the reverse;
- shrinkage: the report's ratio pulled toward the prior with the weight a
  report of its size deserves (prior strength estimated on the fit half);
- ceilings of a better heuristic: a perfect estimate of tool output, and
  estimators that know o200k's exact pre-tokenization with none, 20k, 50k or
  all of its vocabulary;
- what the early report knows: correlations with the rest of the session.

Every fitted constant (prior strengths) comes from the even-numbered
sessions ("fit half"); figures are printed for both halves. The prior ratio
is ``1 / (1 + margin)``: the heuristic without its margin, taken as unbiased.

    .venv/bin/python scripts/bench_calibration.py [--data ../shared/data] [--no-probes]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import regex  # type: ignore[import-untyped]  # tiktoken's own dependency
from bench_tokens import (
    Session,
    anchor_index,
    load_sessions,
    pct,
    percentile,
    prefix_sums,
)

from shared.calibration import CALIBRATION_MAX_RATIO, CALIBRATION_MIN_RATIO
from shared.errors import ConfigError
from shared.messages import Message
from shared.tokens import (
    DEFAULT_SAFETY_MARGIN,
    Calibration,
    HeuristicCounter,
    hybrid_estimate,
)
from shared.tokens_exact import KNOWN_ENCODINGS, TiktokenCounter, load_encoding

TARGET = 0.03
EARLY = 3
"""The report comes with the request that produced this assistant message."""
LATE = (10, 20)
VOCABULARIES = (0, 20_000, 50_000, 200_000)


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
        out.append(f"{pct(percentile(errors, 0.95))} / {pct(max(errors))}")
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


# -- estimators that know o200k's pre-tokenization (ceilings of a better heuristic) -------
def category(piece: str) -> str:
    """Shape of one pre-token: letters (by count and what precedes them), digits,
    whitespace, newlines, punctuation (by length)."""
    letters = sum(ch.isalpha() for ch in piece)
    if letters:
        lead = " " if piece[0] == " " else ("." if not piece[0].isalpha() else "")
        return f"w{lead}{min(letters, 16)}"
    if piece.isdigit():
        return f"d{len(piece)}"
    if piece.isspace():
        return "nl" if ("\n" in piece or "\r" in piece) else "ws"
    return f"p{min(len(piece), 6)}"


class PieceTable:
    """Every distinct o200k pre-token of the sessions with its true token count and
    its rank if it is a single token."""

    def __init__(self, encoding: Any) -> None:
        self.encoding = encoding
        self.pattern = regex.compile(KNOWN_ENCODINGS["o200k_base"].pat_str)
        self.tokens: dict[str, int] = {}
        self.rank: dict[str, int | None] = {}

    def pieces(self, message: Message) -> Counter[str]:
        found: Counter[str] = Counter()
        for text in (message.text(), *(c.arguments for c in message.tool_calls)):
            found.update(self.pattern.findall(text))
        for piece in found:
            if piece not in self.tokens:
                ids = self.encoding.encode_ordinary(piece)
                self.tokens[piece] = len(ids)
                self.rank[piece] = ids[0] if len(ids) == 1 else None
        return found


def probe_traces(
    sessions: Sequence[Session],
    o200k: TiktokenCounter,
    table: PieceTable,
) -> dict[int, list[Trace]]:
    """One trace per vocabulary size: a pre-token among the ``size`` lowest-ranked o200k
    tokens costs 1, any other the fit half's mean for its category; framing is exact."""
    pieces = [[table.pieces(m) for m in s.messages] for s in sessions]
    framing = [
        [
            o200k.message(m) - sum(table.tokens[p] * n for p, n in c.items())
            for m, c in zip(s.messages, per, strict=True)
        ]
        for s, per in zip(sessions, pieces, strict=True)
    ]
    truths = [[o200k.message(m) for m in s.messages] for s in sessions]
    out: dict[int, list[Trace]] = {}
    for size in VOCABULARIES:

        def known(piece: str, size: int = size) -> bool:
            rank = table.rank[piece]
            return rank is not None and rank < size

        sums: dict[str, list[int]] = {}
        for s, per in zip(sessions, pieces, strict=True):
            if s.held_out:
                continue
            for found in per:
                for piece, n in found.items():
                    if not known(piece):
                        acc = sums.setdefault(category(piece), [0, 0])
                        acc[0] += n
                        acc[1] += n * table.tokens[piece]
        mean = {c: t / n for c, (n, t) in sums.items()}
        out[size] = []
        for s, per, frame, true in zip(sessions, pieces, framing, truths, strict=True):
            est = [
                f
                + round(
                    sum(
                        n * (1.0 if known(p) else mean.get(category(p), 2.0))
                        for p, n in found.items()
                    )
                )
                for f, found in zip(frame, per, strict=True)
            ]
            sums_true = prefix_sums(true)
            out[size].append(make_trace(s, est, dict(enumerate(sums_true)), true))
    return out


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


def vocabulary_lines(sessions: Sequence[Session], table: PieceTable, top: int = 4) -> list[str]:
    """Pre-tokens that move a whole session's ratio: tokens they cost beyond their
    category's mean, as a share of the session's tokens."""
    totals: dict[str, list[int]] = {}
    found = []
    for s in sessions:
        c: Counter[str] = Counter()
        for m in s.messages:
            c.update(table.pieces(m))
        found.append(c)
        for piece, n in c.items():
            acc = totals.setdefault(category(piece), [0, 0])
            acc[0] += n
            acc[1] += n * table.tokens[piece]
    mean = {k: t / n for k, (n, t) in totals.items()}
    rows = []
    for s, c in zip(sessions, found, strict=True):
        true = sum(n * table.tokens[p] for p, n in c.items())
        excess = {p: n * (table.tokens[p] - mean[category(p)]) for p, n in c.items()}
        rows.append((sum(excess.values()) / true, s, c, excess, true))
    rows.sort(key=lambda r: r[0])
    out = ["| session | tokens beyond the shape means | largest contributions |", "|---|---:|---|"]
    for share, s, c, excess, true in [*rows[:2], *rows[-2:]]:
        worst = sorted(excess.items(), key=lambda kv: -abs(kv[1]))[:top]
        listed = ", ".join(
            f"`{p!r}` x{c[p]}, {table.tokens[p]} tok each ({pct(x / true)})" for p, x in worst
        )
        out.append(f"| {s.id} | {pct(share)} | {listed} |")
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
    counter = HeuristicCounter("gemini", safety_margin=margin)
    out = []
    for s in sessions:
        truth = {i: n for i, n in enumerate(s.usage) if n}
        if len(truth) > 1:
            out.append(make_trace(s, [counter.message(m) for m in s.messages], truth))
    return out


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
                pct(percentile([abs(e) for e in signed_errors(g, rule, EARLY)], 0.95))
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
                    pct(percentile([abs(e) for e in signed_errors(g, rule, n)], 0.95))
                    for _, g in halves(traces)[:2]
                )
            )
        out.append(f"| {name} | {' | '.join(row)} |")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data"
    )
    parser.add_argument("--margin", type=float, default=DEFAULT_SAFETY_MARGIN)
    parser.add_argument(
        "--no-probes",
        action="store_true",
        help="skip the pre-tokenizer ceilings (the slow part, ~30 s)",
    )
    args = parser.parse_args(argv)
    transcripts = args.data / "transcripts.dev.jsonl"
    if not transcripts.is_file():
        print(f"no transcripts at {transcripts}: pass --data", file=sys.stderr)
        return 2
    try:
        o200k = TiktokenCounter("o200k_base", args.data / "tokenizers")
        encoding = load_encoding("o200k_base", args.data / "tokenizers")
    except ConfigError as exc:
        print(f"exact counter unavailable: {exc}", file=sys.stderr)
        return 2
    sessions = load_sessions(transcripts)
    prior = 1 / (1 + args.margin)
    heur = heuristic_traces(sessions, o200k, args.margin, exact_tools=False)
    gemini = gemini_traces(sessions, args.margin)
    strength = prior_strength(heur, prior)
    tool_strength = prior_strength(heur, prior, "tool")
    shrunk = Shrunk(prior, strength)
    split_shrunk = ClassSplit(prior, "tool", tool_strength)
    ignored = Shrunk(prior, math.inf)
    rows: list[Row] = [
        (
            "production: one ratio (`Calibration.update`, `hybrid_estimate`)",
            heur,
            single_ratio,
            gemini,
        ),
        (
            "1. class split: prose at the prior, the residual solves a tool-result ratio",
            heur,
            ClassSplit(prior, "tool"),
            gemini,
        ),
        (
            f"1. same, tool ratio shrunk (strength {tool_strength:,.0f} est. tokens, fit half)",
            heur,
            split_shrunk,
            gemini,
        ),
        (
            "1. reversed: tool results at the prior, the residual solves a prose ratio",
            heur,
            ClassSplit(prior, "prose"),
            gemini,
        ),
        (
            f"2. shrinkage toward the prior (strength {strength:,.0f} est. tokens, fit half)",
            heur,
            shrunk,
            gemini,
        ),
        (
            "2. limit: report ignored beyond its anchor (prior ratio for what follows)",
            heur,
            ignored,
            gemini,
        ),
        (
            "reference: linear in the report's *true* per-class ratios, least squares in "
            "hindsight on all 40",
            heur,
            fit_linear(heur, prior),
            None,
        ),
        (
            f"3. ceiling: tool results estimated exactly (x {1 + args.margin:g}), one ratio",
            heuristic_traces(sessions, o200k, args.margin, exact_tools=True),
            single_ratio,
            None,
        ),
    ]
    table: PieceTable | None = None
    if not args.no_probes:
        table = PieceTable(encoding)
        probes = probe_traces(sessions, o200k, table)
        for size, traces in probes.items():
            known = "no vocabulary" if size == 0 else f"its {size:,} lowest-ranked tokens"
            rows.append(
                (
                    f"3. ceiling: exact o200k pre-tokens, {known}, one ratio",
                    traces,
                    single_ratio,
                    None,
                )
            )
    rows.append(("hindsight: the best single ratio per session", heur, Hindsight(), gemini))
    later_rules: list[tuple[str, Rule]] = [
        ("production: one ratio", single_ratio),
        ("1. class split, tool ratio shrunk", split_shrunk),
        ("1. class split reversed", ClassSplit(prior, "prose")),
        ("2. shrinkage toward the prior", shrunk),
        ("2. limit: prior ratio after the anchor", ignored),
    ]
    signed = signed_errors(heur, single_ratio, EARLY)
    lines = [
        f"Prior ratio {prior:.4f} = 1 / (1 + margin {args.margin}). Gemini column: the same "
        f"rules with `HeuristicCounter('gemini')` against the prompt tokens Gemini reported "
        f"({len(gemini)} coding sessions; the report is the first call at or after assistant "
        f"message {EARLY}, errors at every later reported call).",
        "",
        *main_table(rows),
        "",
        *anchor_table(heur, later_rules),
        "",
        "The same with Gemini's reported prompt tokens as truth:",
        "",
        *anchor_table(gemini, later_rules),
        "",
        f"Production rule, report after assistant message {EARLY}: "
        f"{sum(e < 0 for e in signed) / len(signed):.0%} of later prefixes underestimated, "
        f"{sum(e < -TARGET for e in signed) / len(signed):.0%} by more than 3%, worst "
        f"{pct(min(signed))}.",
        "",
        *knowledge_lines(heur, prior),
    ]
    if table is not None:
        lines += ["", *vocabulary_lines(sessions, table)]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
