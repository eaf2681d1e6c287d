"""Ceilings of a better heuristic: o200k's pre-tokens, its vocabulary, drift between sessions."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import _timing  # noqa: F401  (puts this checkout first on sys.path)
import regex  # type: ignore[import-untyped]  # tiktoken's own dependency
from _calibration_rules import EARLY, Trace, make_trace
from _token_data import (
    Session,
    anchor_index,
    pct,
    prefix_sums,
)

from shared.core.messages import Message
from shared.core.tokens import (
    estimate_tokens,
)
from shared.core.tokens_exact import KNOWN_ENCODINGS, TiktokenCounter

VOCABULARIES = (20_000, 50_000, 200_000)


# -- estimators that see o200k's pre-tokens (what a better heuristic could know) -----------
def shape(piece: str) -> str:
    """What a vocabulary-free estimator can see of one pre-token. Words: what precedes
    the letters (nothing, a space, another character), their case pattern (lower,
    Capitalized, UPPER, mixed), ASCII or not, and how many (to 24). Digits by count,
    whitespace by kind and length (to 16), punctuation by length (to 8) and a leading
    space."""
    letters = "".join(ch for ch in piece if ch.isalpha())
    if letters:
        lead = " " if piece[0] == " " else ("" if piece[0].isalpha() else ".")
        if letters.islower():
            case = "l"
        elif letters.isupper():
            case = "U"
        elif letters[0].isupper() and letters[1:].islower():
            case = "C"
        else:
            case = "m"
        script = "" if letters.isascii() else "n"
        return f"w{lead}{case}{script}{min(len(letters), 24)}"
    if piece.isdigit():
        return f"d{len(piece)}"
    if piece.isspace():
        kind = "nl" if ("\n" in piece or "\r" in piece) else "ws"
        return f"{kind}{min(len(piece), 16)}"
    return f"p{piece[0] == ' '}{min(len(piece), 8)}"


def is_word(piece: str) -> bool:
    return any(ch.isalpha() for ch in piece)


class PieceTable:
    """Distinct pre-tokens with their true o200k token count and their rank if they are
    a single token. ``pattern`` is o200k's own pre-tokenizer unless another is given."""

    def __init__(self, encoding: Any, pattern: Any = None) -> None:
        self.encoding = encoding
        self.pattern = pattern or regex.compile(KNOWN_ENCODINGS["o200k_base"].pat_str)
        self.tokens: dict[str, int] = {}
        self.rank: dict[str, int | None] = {}

    def count(self, texts: Iterable[str]) -> Counter[str]:
        found: Counter[str] = Counter()
        for text in texts:
            found.update(self.pattern.findall(text))
        for piece in found:
            if piece not in self.tokens:
                ids = self.encoding.encode_ordinary(piece)
                self.tokens[piece] = len(ids)
                self.rank[piece] = ids[0] if len(ids) == 1 else None
        return found

    def pieces(self, message: Message) -> Counter[str]:
        return self.count(message_texts(message))

    def means(
        self, counts: Iterable[Counter[str]], keep: Callable[[str], bool] = lambda p: True
    ) -> dict[str, float]:
        """Mean true tokens per shape; each counter weighs the same whatever its size, so
        one kind of text does not drown the others."""
        sums: dict[str, list[float]] = {}
        for found in counts:
            scale = 1.0 / max(sum(found.values()), 1)
            for piece, n in found.items():
                if keep(piece):
                    acc = sums.setdefault(shape(piece), [0.0, 0.0])
                    acc[0] += n * scale
                    acc[1] += n * scale * self.tokens[piece]
        return {k: t / n for k, (n, t) in sums.items()}


def message_texts(message: Message) -> list[str]:
    """Every text of a message the heuristic counts (content, name, reasoning, calls)."""
    texts = [message.text(), message.name or "", message.reasoning or ""]
    for call in message.tool_calls:
        texts += [call.name, call.arguments]
    return [t for t in texts if t]


def by_shape(means: Mapping[str, float]) -> Callable[[str], float]:
    """Cost of a pre-token: its shape's mean (a third of its length for unseen shapes)."""
    return lambda piece: means.get(shape(piece), max(1.0, len(piece) / 3))


@dataclass(frozen=True)
class SessionPieces:
    """A session cut into o200k pre-tokens: per message the pre-token counts, the true
    tokens and the framing (true tokens not in any pre-token: roles, separators)."""

    session: Session
    pieces: list[Counter[str]]
    true: list[int]
    framing: list[int]

    def trace(self, cost: Callable[[str], float], cache: dict[str, float]) -> Trace:
        """Exact framing plus ``cost`` of every pre-token (memoized in ``cache``)."""
        est = []
        for frame, found in zip(self.framing, self.pieces, strict=True):
            total = 0.0
            for piece, n in found.items():
                value = cache.get(piece)
                if value is None:
                    value = cache[piece] = cost(piece)
                total += n * value
            est.append(frame + round(total))
        return make_trace(self.session, est, dict(enumerate(prefix_sums(self.true))), self.true)


def session_pieces(
    sessions: Sequence[Session], o200k: TiktokenCounter, table: PieceTable
) -> list[SessionPieces]:
    out = []
    for s in sessions:
        pieces = [table.pieces(m) for m in s.messages]
        true = [o200k.message(m) for m in s.messages]
        framing = [
            t - sum(table.tokens[p] * n for p, n in c.items())
            for t, c in zip(true, pieces, strict=True)
        ]
        out.append(SessionPieces(s, pieces, true, framing))
    return out


def probe_rows(
    cut: Sequence[SessionPieces], table: PieceTable, neutral: Sequence[Counter[str]]
) -> list[tuple[str, list[Trace]]]:
    """Estimators that split text exactly as o200k does and differ in what they know of
    each pre-token's cost; framing is exact, no margin (one ratio cancels any scale)."""
    fit = [c for sp in cut if not sp.session.held_out for c in sp.pieces]
    fit_total: Counter[str] = Counter()
    for c in fit:
        fit_total.update(c)
    neutral_shape = by_shape(table.means(neutral))
    fit_shape = by_shape(table.means([fit_total]))

    def exact(piece: str) -> float:
        return float(table.tokens[piece])

    variants: list[tuple[str, Callable[[str], float]]] = [
        ("every pre-token at its shape's mean, shapes from neutral text", neutral_shape),
        ("the same, shape means from the fit half", fit_shape),
        (
            "where the error is: words exact, other pre-tokens at their shape's mean "
            "(neutral text)",
            lambda p: exact(p) if is_word(p) else neutral_shape(p),
        ),
        (
            "where the error is: words at their shape's mean (neutral text), other "
            "pre-tokens exact",
            lambda p: neutral_shape(p) if is_word(p) else exact(p),
        ),
    ]
    for size in VOCABULARIES:
        variants.append(
            (
                f"vocabulary: o200k's {size:,} lowest-ranked tokens cost 1, other pre-tokens "
                "their shape's mean (fit half)",
                vocabulary_cost(table, fit_total, size),
            )
        )
    variants.append(
        (
            "leakage: every pre-token seen in the fit half at its true count, others at "
            "their shape's mean (a table learnt from the fit half)",
            lambda p: exact(p) if p in fit_total else fit_shape(p),
        )
    )
    return [(name, [sp.trace(cost, {}) for sp in cut]) for name, cost in variants]


def vocabulary_cost(
    table: PieceTable, fit_total: Counter[str], size: int
) -> Callable[[str], float]:
    """1 for a pre-token among o200k's ``size`` lowest-ranked tokens, else the fit half's
    mean for its shape over the pre-tokens not in that vocabulary."""

    def known(piece: str) -> bool:
        rank = table.rank[piece]
        return rank is not None and rank < size

    rest = by_shape(table.means([fit_total], keep=lambda p: not known(p)))
    return lambda piece: 1.0 if known(piece) else rest(piece)


def vocabulary_lines(sessions: Sequence[Session], table: PieceTable, top: int = 4) -> list[str]:
    """Pre-tokens that move a whole session's ratio: tokens they cost beyond their
    shape's mean, as a share of the session's tokens."""
    totals: dict[str, list[int]] = {}
    found = []
    for s in sessions:
        c: Counter[str] = Counter()
        for m in s.messages:
            c.update(table.pieces(m))
        found.append(c)
        for piece, n in c.items():
            acc = totals.setdefault(shape(piece), [0, 0])
            acc[0] += n
            acc[1] += n * table.tokens[piece]
    mean = {k: t / n for k, (n, t) in totals.items()}
    rows = []
    for s, c in zip(sessions, found, strict=True):
        true = sum(n * table.tokens[p] for p, n in c.items())
        excess = {p: n * (table.tokens[p] - mean[shape(p)]) for p, n in c.items()}
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


# -- what the rest of a session's error is made of ---------------------------------------
def repository(session: Session) -> str:
    """``django`` for ``mini-swe-gemini3-django__django-13297``; ``airline`` for tau-bench."""
    if session.id.startswith("tau-"):
        return "airline"
    return session.id.rsplit("-gemini3-", 1)[-1].split("__", 1)[0]


def shared_vocabulary_line(sessions: Sequence[Session]) -> str:
    halves_of: dict[str, list[int]] = {}
    for s in sessions:
        halves_of.setdefault(repository(s), [0, 0])[int(s.held_out)] += 1
    both = [f"{r} {f}/{h}" for r, (f, h) in sorted(halves_of.items()) if f and h]
    return (
        "The even/odd split is not independent: sessions of the same repository (same "
        "identifiers) or the same agent (same system prompt) sit in both halves "
        f"(fit/held-out: {', '.join(both)}), so anything learnt from the fit half's words "
        "carries to the held-out half (the leakage row). Shape tables learnt from neutral "
        "text have no such path."
    )


def drift_lines(sessions: Sequence[Session], o200k: TiktokenCounter) -> list[str]:
    """The heuristic's error (no margin, text only) per coding session: on the early
    prefix the report covers, on the rest, and on the rest by kind of message."""
    kinds = ("assistant text", "tool-call arguments", "tool results")
    errors: dict[str, list[float]] = {k: [] for k in ("early", "rest", "ratio", *kinds)}
    for s in sessions:
        if repository(s) == "airline":
            continue
        a = anchor_index(s.messages, EARLY)
        sums: dict[str, list[int]] = {k: [0, 0] for k in ("early", "rest", *kinds)}
        for i, m in enumerate(s.messages):
            kind = "tool results" if m.role == "tool" else f"{m.role} text"
            parts = [(kind, m.text())]
            parts += [("tool-call arguments", c.arguments) for c in m.tool_calls]
            for name, text in parts:
                if not text:
                    continue
                pair = (o200k.text(text), estimate_tokens(text, safety_margin=0.0))
                for key in ("early" if i < a else "rest", name if i >= a else ""):
                    if key in sums:
                        sums[key][0] += pair[0]
                        sums[key][1] += pair[1]
        for key, (true, est) in sums.items():
            errors[key].append(est / true - 1)
        errors["ratio"].append((1 + errors["rest"][-1]) / (1 + errors["early"][-1]) - 1)
    labels = {
        "early": f"early prefix (up to assistant message {EARLY}: what the report covers)",
        "rest": "rest of the session",
        "assistant text": "rest: assistant text",
        "tool-call arguments": "rest: tool-call arguments",
        "tool results": "rest: tool results",
        "ratio": "rest against early: what one ratio leaves",
    }
    out = [
        f"| heuristic error, no margin, {len(errors['rest'])} coding sessions | mean | sd "
        "| min | max |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, label in labels.items():
        v = errors[key]
        out.append(
            f"| {label} | {pct(statistics.fmean(v))} | {100 * statistics.pstdev(v):.1f}% "
            f"| {pct(min(v))} | {pct(max(v))} |"
        )
    same_sign = sum(
        len({e > 0 for e in trio}) == 1
        for trio in zip(*(errors[k] for k in kinds), strict=True)
    )
    corr = statistics.correlation
    out += [
        "",
        f"Correlations across coding sessions: early prefix vs rest "
        f"{corr(errors['early'], errors['rest']):+.2f}; within the rest, assistant text vs "
        f"tool results {corr(errors['assistant text'], errors['tool results']):+.2f}, "
        f"tool-call arguments vs tool results "
        f"{corr(errors['tool-call arguments'], errors['tool results']):+.2f}; the three "
        f"kinds err in the same direction in {same_sign} of {len(errors['rest'])} sessions.",
    ]
    return out
