"""A model of one agent session against the guard and the compaction worker, step by step.

Hypothesis drives a session the way agents do: turns recorded (user text; an assistant
with parallel tool calls and their results, some bulky; provider call ids that repeat
every turn, as Gemini's positional ones and ``call_0`` numbering do; a call interrupted
before its result), a tool chain prepared call by call with the turn so far pending,
the worker's offline compaction, a provider's overflow error and the recovery, a cold
guard (a new process, or a dropped cache), the model switched between a small and a
large window; and what users do between turns: history edits (``truncate_after``), a
rewind to a kept summary, the session deleted and its id reused, recall of a compacted
output, a second session interleaved, ``stats``, a retried append, a tool output over
the whole window. Drawn per example: the store's read sizes lowered (chunked view and
edit reads on short sessions), eager cheap stages, a provider tokenizer denser than the
heuristic (usage reports calibrate it). Two worlds run the same steps: the sync guard
and the async guard, each on a store of its own. After every prepare the view is checked
against the model of the log (:func:`check_view`): what the provider would accept, what
the report promises, and that nothing recorded is lost.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import fakeredis
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from shared.core.config import CompactionPolicy, StoreConfig
from shared.core.messages import Message
from shared.core.prepared import PreparedView
from shared.core.recall import index_text
from shared.core.repair import MISSING_RESULT_TEXT, validate_view
from shared.core.tokens import DEFAULT_COUNTER
from shared.core.truncation import CLIP_MARKER
from shared.core.wire import to_anthropic, to_gemini, to_openai
from shared.enqueue import NullEnqueuer
from shared.store import commands, edits
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, make
from workers.compactor import Compactor
from workers.summarizer.engine import SummaryEngine

SID = "s"
OTHER = "o"  # a second session of the same tenant, its turns interleaved with SID's
SYSTEM = "You are a careful coding agent. Use the tools to inspect and fix the repository."
TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name}: does what its name says.",
    "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}}}}
    for name in ("bash", "read_file", "grep")]
MODELS = {"small-m": (6_000, 800), "large-m": (40_000, 2_000)}  # window, max_tokens
# the provider's own window: small-m's endpoint serves less than the guard was told
SERVED = {"small-m": 5_000, "large-m": 40_000}
OVERRIDES = {name: window for name, (window, _) in MODELS.items()}
MARK = re.compile(r"\[#(\d+)\]")
OUTPUT_LINES = (1, 3, 40, 150)  # a tool output's size: ~10 .. ~2,900 tokens
HUGE_LINES = (400, 1_500)  # ~7,700 / ~29,000 tokens: over small-m's whole window
# the store's read sizes, lowered in some examples so that short sessions take the paths
# of long ones: a view read deferred to plain reads, in chunks (a cold start of a view
# over 512 messages), an edit's reads of the log in chunks
# the cheap stages as a session with many bulky turns meets them: with the defaults (the
# newest 3 turns kept whole) small-m's window is truncated before they ever apply
EAGER = CompactionPolicy(clear_keep_recent_turns=1, clear_tool_outputs_over_tokens=200)
SMALL_READS = {(commands, "BULK_MESSAGES"): 4, (commands, "BULK_CHUNK"): 3,
               (edits, "READ_CHUNK"): 2}


def output(serial: int, lines: int) -> str:
    return "".join(f"line {k}: def f_{serial}(x): return x + {k}  # output\n"
                   for k in range(lines))


class World:
    """One shell's guard, store and worker on a fake Redis of its own."""

    def __init__(self, shell: str, policy: CompactionPolicy) -> None:
        self.shell = shell
        self.policy = policy
        self.store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="sm"))
        self.guard = self.new_guard()
        self.compactor = Compactor(self.store, SummaryEngine(None), policy=policy)

    def new_guard(self) -> Any:
        return make(self.shell, self.store, NullEnqueuer(), overrides=OVERRIDES,
                    policy=self.policy)


def marker(message: Message) -> int | None:
    found = MARK.match(message.text())
    return int(found.group(1)) if found else None


# -- what a provider would accept: each format checked on its own wire form --------------
def openai_pairs(wire: Sequence[dict[str, Any]]) -> list[str]:
    """Every call's results right after it (one each, any order), no result elsewhere."""
    problems: list[str] = []
    i = 0
    while i < len(wire):
        m = wire[i]
        if m["role"] == "tool":
            problems.append(f"openai[{i}]: a tool result not after its call")
            i += 1
            continue
        ids = [c["id"] for c in m.get("tool_calls") or ()]
        j = i + 1
        answered: list[str] = []
        while j < len(wire) and wire[j]["role"] == "tool":
            answered.append(wire[j]["tool_call_id"])
            j += 1
        if sorted(answered) != sorted(ids):
            problems.append(f"openai[{i}]: calls {ids} answered by {answered}")
        i = j
    return problems


def anthropic_pairs(messages: Sequence[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    if messages and messages[0]["role"] != "user":
        problems.append("anthropic: the first message is not a user message")
    for i, m in enumerate(messages):
        if i and m["role"] == messages[i - 1]["role"]:
            problems.append(f"anthropic[{i}]: two {m['role']} messages in a row")
        blocks = m["content"] if isinstance(m["content"], list) else []
        uses = [b["id"] for b in blocks if b.get("type") == "tool_use"]
        results = [b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"]
        if results:
            before = messages[i - 1]["content"] if i else []
            called = [b["id"] for b in before if isinstance(before, list)
                      and b.get("type") == "tool_use"] if isinstance(before, list) else []
            if sorted(results) != sorted(called):
                problems.append(f"anthropic[{i}]: results {results} for calls {called}")
            if any(b.get("type") != "tool_result" for b in blocks[:len(results)]):
                problems.append(f"anthropic[{i}]: tool results do not come first")
        if uses:
            after = messages[i + 1]["content"] if i + 1 < len(messages) else []
            got = [b["tool_use_id"] for b in after if b.get("type") == "tool_result"] \
                if isinstance(after, list) else []
            if sorted(got) != sorted(uses):
                problems.append(f"anthropic[{i}]: calls {uses} answered by {got}")
    return problems


def gemini_pairs(contents: Sequence[dict[str, Any]]) -> list[str]:
    """Each model turn's function calls answered by the next user turn, name for name."""
    problems: list[str] = []
    if contents and contents[0]["role"] != "user":
        problems.append("gemini: the first content is not the user's")
    for i, c in enumerate(contents):
        # neighbours alternate, but function responses share a content with nothing else
        # (Gemini 3 refuses text after them): then the user's text is a content of its own
        if i and c["role"] == contents[i - 1]["role"] and not (
                c["role"] == "user"
                and all("function_response" in p for p in contents[i - 1]["parts"])
                and not any("function_response" in p for p in c["parts"])):
            problems.append(f"gemini[{i}]: two {c['role']} contents in a row")
        calls = [p["function_call"]["name"] for p in c["parts"] if "function_call" in p]
        answers = [p["function_response"]["name"] for p in c["parts"]
                   if "function_response" in p]
        if answers:
            before = contents[i - 1]["parts"] if i else []
            called = [p["function_call"]["name"] for p in before if "function_call" in p]
            if sorted(called) != sorted(answers):
                problems.append(f"gemini[{i}]: responses {answers} to calls {called}")
        if calls:
            after = contents[i + 1]["parts"] if i + 1 < len(contents) else []
            got = [p["function_response"]["name"] for p in after if "function_response" in p]
            if sorted(got) != sorted(calls):
                problems.append(f"gemini[{i}]: calls {calls} answered by {got}")
    return problems


def fresh_tokens(view: PreparedView) -> int:
    """The heuristic count of what the view sends, counted afresh."""
    return DEFAULT_COUNTER.messages(list(view.messages)) + DEFAULT_COUNTER.tools(TOOLS)


def repair_tokens(view: PreparedView) -> int:
    """What the view's repair added (a placeholder result per interrupted call)."""
    return sum(DEFAULT_COUNTER.message(m) for m in view.messages
               if m.metadata.get("repair") in ("missing_result", "conversation_start"))


def reported(view: PreparedView, ratio: float) -> int:
    """The usage the provider reports for ``view``: its count, the repair's placeholder
    results included (the guard counts them: the ratio learned from it stays the
    tokenizer's), by a tokenizer ``ratio`` times as dense as the heuristic."""
    return round(ratio * fresh_tokens(view))


def canonical(view: PreparedView) -> list[dict[str, Any]]:
    """The view's OpenAI form with its call ids numbered by first use: a renamed repeated
    id carries a random nonce, so two stores store two different ids for one call."""
    names: dict[str, str] = {}

    def name(cid: str) -> str:
        return names.setdefault(cid, f"id{len(names)}")

    out = []
    for m in to_openai(list(view.messages)):
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "id": name(c["id"])} for c in m["tool_calls"]]
        if "tool_call_id" in m:
            m["tool_call_id"] = name(m["tool_call_id"])
        out.append(m)
    return out


class SessionMachine(RuleBasedStateMachine):
    """The session's log and pending turn, modelled; both guards checked against them."""

    @initialize(system_first=st.booleans(), small_reads=st.booleans(), eager=st.booleans(),
                ratio=st.sampled_from([1.0, 1.0, 1.15]))
    def start(self, system_first: bool, small_reads: bool, eager: bool, ratio: float) -> None:
        self.ratio = ratio  # the provider's tokenizer against the heuristic: calibration
        self.saved = {(module, name): getattr(module, name) for module, name in SMALL_READS}
        if small_reads:
            for (module, name), value in SMALL_READS.items():
                setattr(module, name, value)
        policy = EAGER if eager else CompactionPolicy()
        self.worlds = [World(shell, policy) for shell in SHELLS]
        self.serial = 0
        self.turn = 0
        self.log: list[dict[str, Any]] = []  # what was recorded, in order
        self.other: list[dict[str, Any]] = []  # what was recorded in OTHER
        self.pending: list[dict[str, Any]] = []  # the current turn, not recorded yet
        self.model = "small-m"
        self.last: list[PreparedView | None] = [None for _ in self.worlds]
        self.watermarks = [0 for _ in self.worlds]
        if system_first:  # an agent that records its own system message first
            self.record([self.msg("system", "Project rules: run the tests before done.")])

    def teardown(self) -> None:
        for (module, name), value in getattr(self, "saved", {}).items():
            setattr(module, name, value)

    # -- the model's messages ---------------------------------------------------------------
    def msg(self, role: str, text: str = "", **extra: Any) -> dict[str, Any]:
        self.serial += 1
        return {"role": role, "content": f"[#{self.serial}] {text}".rstrip(), **extra}

    def record(self, messages: list[dict[str, Any]], retried: bool = False) -> None:
        """``retried``: the append's reply was lost and the agent sends it again, with
        the same request id: stored once."""
        request_id = f"turn-{self.serial}" if retried else None
        for i, world in enumerate(self.worlds):
            last = self.last[i]
            usage = None if last is None else {"prompt_tokens": reported(last, self.ratio)}
            length = world.guard.record_turn(SID, messages, usage=usage, request_id=request_id)
            assert length == len(self.log) + len(messages)
            if retried:
                assert world.guard.record_turn(SID, messages, usage=usage,
                                               request_id=request_id) == length
        self.log += messages
        self.last = [None for _ in self.worlds]

    def prepare_all(self) -> list[PreparedView]:
        reserve = MODELS[self.model][1]
        views = [w.guard.prepare(SID, SYSTEM, TOOLS, reserve, self.model, pending=self.pending)
                 for w in self.worlds]
        r = views[0].report
        event(f"prepare: truncated={r.truncated} fits={r.budget.within_budget} "
              f"summary={r.summary_kind or '-'} cheap={bool(r.cheap_applied)}")
        for i, view in enumerate(views):
            self.check_view(self.worlds[i], view)
            self.last[i] = view
        self.same(views)
        return views

    # -- rules --------------------------------------------------------------------------------
    @precondition(lambda self: not self.pending)
    @rule(words=st.integers(1, 60))
    def user_says(self, words: int) -> None:
        self.turn += 1
        self.pending = [self.msg("user", f"turn {self.turn}: " + "please fix it " * words)]

    @precondition(lambda self: bool(self.pending))
    @rule(sizes=st.lists(st.sampled_from(OUTPUT_LINES), min_size=1, max_size=3),
          ids=st.sampled_from(["repeating", "unique"]), reverse=st.booleans())
    def tool_step(self, sizes: list[int], ids: str, reverse: bool) -> None:
        """The assistant calls 1-3 tools at once; their results follow (any order)."""
        calls = []
        for k in range(len(sizes)):
            cid = f"call_{k}" if ids == "repeating" else f"c{self.serial}_{k}"
            name = ("bash", "read_file", "grep")[(self.serial + k) % 3]
            calls.append({"id": cid, "name": name,
                          "arguments": f'{{"arg": "src/mod_{(self.serial + k) % 5}.py"}}'})
        call = self.msg("assistant", "Checking.", tool_calls=calls)
        results = [self.msg("tool", output(self.serial, lines), tool_call_id=c["id"])
                   for c, lines in zip(calls, sizes, strict=True)]
        if reverse:
            results.reverse()
        self.pending = [*self.pending, call, *results]

    @precondition(lambda self: not self.pending)
    @rule(words=st.integers(1, 60),
          steps=st.lists(st.lists(st.sampled_from(OUTPUT_LINES), min_size=1, max_size=3),
                         max_size=4),
          ids=st.sampled_from(["repeating", "unique"]), interrupted=st.booleans(),
          states=st.booleans())
    def agent_turn(self, words: int, steps: list[list[int]], ids: str,
                   interrupted: bool, states: bool) -> None:
        """A whole turn as an agent runs it: a prepare before each model call of its tool
        chain (a refused one recovered, as ``guard.call`` does), then the turn recorded."""
        self.user_says(words)
        for sizes in [*steps, None]:
            self.prepare_all()
            if self.refused():
                self.overflow(states)
            if sizes is not None:
                self.tool_step(sizes, ids, reverse=len(sizes) % 2 == 0)
        self.finish_turn(interrupted)

    @precondition(lambda self: bool(self.pending))
    @rule()
    def prepare(self) -> None:
        self.prepare_all()

    @precondition(lambda self: bool(self.pending))
    @rule(interrupted=st.booleans(), retried=st.booleans())
    def finish_turn(self, interrupted: bool, retried: bool = False) -> None:
        """The turn is recorded: the assistant's answer, or a call cut off before its
        result (the process died while the tool ran)."""
        if interrupted:
            last = self.msg("assistant", "", tool_calls=[
                {"id": "call_0", "name": "bash", "arguments": '{"arg": "make"}'}])
        else:
            last = self.msg("assistant", f"Done with turn {self.turn}.")
        turn, self.pending = [*self.pending, last], []
        self.record(turn, retried)

    @rule(force=st.booleans())
    def compact(self, force: bool) -> None:
        """The worker runs the session's job (when one is pending, or forced)."""
        for world in self.worlds:
            if force or world.store.is_pending(SID):
                world.store.clear_pending(SID)
                event(f"compaction: {world.compactor.run(SID, force=force).status}")

    def refused(self) -> bool:
        """The provider refuses the last prepared request: over the window it serves."""
        return bool(self.pending) and all(
            v is not None and v.report.model == self.model
            and reported(v, self.ratio) + v.report.budget.reserve > SERVED[self.model]
            for v in self.last)

    @precondition(refused)
    @rule(states=st.booleans())
    def overflow(self, states: bool) -> None:
        """The provider refused the last prepared request, stating its window and the
        request's size (OpenAI's wording) or nothing (Bedrock's)."""
        views = []
        for i, world in enumerate(self.worlds):
            last = self.last[i]
            assert last is not None
            reserve = last.report.budget.reserve
            sent = reported(last, self.ratio)
            error = (f"This model's maximum context length is {SERVED[self.model]} tokens. "
                     f"However, you requested {sent + reserve} tokens ({sent} in the "
                     f"messages, {reserve} in the completion). Please reduce the length of "
                     "the messages or completion." if states
                     else "Input is too long for requested model.")
            view = world.guard.recover(SID, error, SYSTEM, TOOLS, MODELS[self.model][1],
                                       self.model, pending=self.pending,
                                       prepared_tokens=last.report.estimated_prompt_tokens)
            views.append(view)
            event(f"recover: {'view' if view is not None else 'none'} "
                  f"{'stated' if states else 'unstated'}")
            if view is not None:
                self.check_view(world, view)
                # smaller than the refused request: its prompt, or (the error stated the
                # prompt's size, and compacting would clip the user's newest message) the
                # same prompt with the answer's room lowered to fit
                new, old = view.report, last.report
                assert new.estimated_prompt_tokens + new.budget.reserve < \
                    old.estimated_prompt_tokens + reserve
                if new.budget.reserve >= reserve or not states:
                    assert new.estimated_prompt_tokens < old.estimated_prompt_tokens
                if states:  # the window stated is learned, and the retry is not refused
                    assert new.budget.window <= SERVED[self.model]
                    assert reported(view, self.ratio) + new.budget.reserve \
                        <= SERVED[self.model], (reported(view, self.ratio), new.budget)
                self.last[i] = view
        if all(v is not None for v in views):
            self.same([v for v in views if v is not None])
        else:
            assert all(v is None for v in views), "one shell recovered, the other did not"

    @rule(how=st.sampled_from(["process", "cache"]))
    def cold_start(self, how: str) -> None:
        """A new process (a new guard) or a dropped cache: the next prepare reads the
        session whole, and builds the view the warm guard did."""
        before = self.prepare_all() if self.pending else None
        for world in self.worlds:
            if how == "process":
                world.guard = world.new_guard()
            else:
                world.guard.views.discard(SID)
        if before is not None:
            after = self.prepare_all()
            for warm, cold in zip(before, after, strict=True):
                if not warm.report.truncated:  # else it cut again from its recorded cut
                    assert canonical(cold) == canonical(warm)
                    assert cold.report.estimated_prompt_tokens == \
                        warm.report.estimated_prompt_tokens

    @rule()
    def switch_model(self) -> None:
        self.model = "large-m" if self.model == "small-m" else "small-m"

    @precondition(lambda self: bool(self.pending))
    @rule(lines=st.sampled_from(HUGE_LINES), ids=st.sampled_from(["repeating", "unique"]))
    def huge_tool_output(self, lines: int, ids: str) -> None:
        """One call whose output alone is over the small window (a log dumped, a file read
        whole): placeholders and the emergency truncation have to make it fit."""
        self.tool_step([lines], ids, reverse=False)

    @precondition(lambda self: not self.pending and bool(self.log))
    @rule(back=st.integers(0, 12), percent=st.integers(0, 100), deep=st.booleans())
    def edit_history(self, back: int, percent: int, deep: bool) -> None:
        """The user edits history: everything from ``index`` on is dropped (a message
        edited, a turn regenerated: the frameworks' ``rewind=True``), by the store's
        ``truncate_after``; every guard's next view must be of the shorter log."""
        index = len(self.log) * percent // 100 if deep else max(0, len(self.log) - back)
        event(f"edit: {'all' if index == 0 else 'some' if index < len(self.log) else 'none'}"
              f" dropped, below the watermark: {index < self.watermarks[0]}")
        for i, world in enumerate(self.worlds):
            edit = world.store.truncate_after(SID, index)
            assert edit.length == index
            assert edit.watermark <= index
            self.watermarks[i] = edit.watermark  # it falls back with the summary
        del self.log[index:]

    @precondition(lambda self: not self.pending and bool(self.log))
    @rule(pick=st.integers(0, 1_000))
    def rewind(self, pick: int) -> None:
        """An earlier kept summary made current (``compaction rewind``; 0: none)."""
        kept = [[0, *(r.watermark for r in w.store.summaries(SID))] for w in self.worlds]
        assert all(k == kept[0] for k in kept), kept
        target = kept[0][pick % len(kept[0])]
        for i, world in enumerate(self.worlds):
            assert world.store.rewind(SID, target).watermark == target
            self.watermarks[i] = target
        event(f"rewind: to {'none' if target == 0 else 'a summary'}")

    @precondition(lambda self: not self.pending)
    @rule()
    def delete_session(self) -> None:
        """The session deleted (an explicit user request), then its id used again: the
        guards' cached views, the id map and the recall index must not outlive it."""
        for world in self.worlds:
            world.store.delete_session(SID)
        self.log = []
        self.watermarks = [0 for _ in self.worlds]

    @precondition(lambda self: bool(self.log))
    @rule(pick=st.integers(0, 1_000_000), known=st.booleans())
    def recall_search(self, pick: int, known: bool) -> None:
        """Recall of a tool output by its identifier (``f_<serial>``): each compacted one
        is found, nothing comes back that is not the log's message at that index (one
        removed by an edit, or past the watermark), and both guards answer alike."""
        watermark = self.worlds[0].store.state(SID).watermark
        below = sorted({int(found.group(1)) for m in self.log[:watermark]
                        if m["role"] == "tool"
                        and (found := re.search(r"def f_(\d+)\(", m["content"]))})
        serial = below[pick % len(below)] if known and below else pick % self.serial + 1
        expected = {i for i, m in enumerate(self.log[:watermark]) if m["role"] == "tool"
                    and f"def f_{serial}(" in m["content"]}
        answers = []
        for world in self.worlds:
            hits = world.guard.recall(SID, f"f_{serial}", limit=10)
            answers.append([(h.index, h.role, h.text, h.score) for h in hits])
            for h in hits:
                assert h.index < watermark, (h.index, watermark)
                assert h.text in index_text(Message(**self.log[h.index])), h
            assert expected <= {h.index for h in hits}, (serial, expected, hits)
        assert all(a == answers[0] for a in answers)
        event(f"recall: {len(expected)} expected")

    @rule(lines=st.sampled_from(OUTPUT_LINES), interrupted=st.booleans())
    def other_session(self, lines: int, interrupted: bool) -> None:
        """A turn of another session in between (the same guards, the same provider ids):
        its view holds its own messages only, and nothing of it reaches SID's."""
        call = {"id": "call_0", "name": "bash", "arguments": '{"arg": "ls"}'}
        turn = [self.msg("user", "other: look around"),
                self.msg("assistant", "", tool_calls=[call])]
        if not interrupted:
            turn += [self.msg("tool", output(self.serial, lines), tool_call_id="call_0"),
                     self.msg("assistant", "Looked.")]
        pending = [self.msg("user", "other: next?")]  # not recorded
        views = []
        for world in self.worlds:
            world.guard.record_turn(OTHER, turn)
            views.append(world.guard.prepare(OTHER, SYSTEM, TOOLS, MODELS[self.model][1],
                                             self.model, pending=pending))
        self.other += turn
        known = {marker(Message(**m)) for m in [*self.other, *pending]}
        for view in views:
            wire = list(view.wire("openai"))
            assert openai_pairs(wire) == [], openai_pairs(wire)
            markers = {marker(m) for m in view.messages} - {None}
            assert markers <= known, markers - known
            assert marker(Message(**pending[0])) in markers
        self.same(views)

    @precondition(lambda self: bool(self.log))
    @rule()
    def stats(self) -> None:
        """``guard.stats``: the log's length, the store's watermark and kept summaries,
        alike in both shells (a dashboard's and ``compaction stats``'s figures)."""
        figures = []
        for world in self.worlds:
            got = world.guard.stats(SID)
            state = world.store.state(SID)
            assert got["length"] == len(self.log)
            assert got["watermark"] == state.watermark
            assert [s["watermark"] for s in got["summaries"]] == \
                [r.watermark for r in world.store.summaries(SID)]
            figures.append({k: v for k, v in got.items() if k != "summaries"})
        assert all(f == figures[0] for f in figures), figures

    # -- invariants ---------------------------------------------------------------------------
    @invariant()
    def log_is_stored_as_recorded(self) -> None:
        if not hasattr(self, "worlds"):
            return
        for i, world in enumerate(self.worlds):
            stored = world.store.messages(SID) if self.log else []
            assert [marker(m) for m in stored] == [marker(Message(**m)) for m in self.log]
            state = world.store.state(SID)
            assert state.watermark >= self.watermarks[i], "the watermark moved back"
            assert state.watermark <= len(self.log)
            self.watermarks[i] = state.watermark
            other = world.store.messages(OTHER) if self.other else []
            assert [marker(m) for m in other] == [marker(Message(**m)) for m in self.other]

    # -- the checks of one view ---------------------------------------------------------------
    def same(self, views: Sequence[PreparedView]) -> None:
        """The sync and async guards built the same view of the same steps."""
        first = views[0]
        for other in views[1:]:
            assert canonical(other) == canonical(first)
            a, b = first.report, other.report
            assert (a.estimated_prompt_tokens, a.truncated, a.watermark, a.budget.within_budget) \
                == (b.estimated_prompt_tokens, b.truncated, b.watermark, b.budget.within_budget)

    def check_view(self, world: World, view: PreparedView) -> None:
        report = view.report
        messages = list(view.messages)
        # what a provider accepts, in each wire form the view offers
        wire = list(view.wire("openai"))
        assert openai_pairs(wire) == [], openai_pairs(wire)
        assert view.openai() == to_openai(messages)
        system, anthropic = view.anthropic()
        assert anthropic_pairs(anthropic) == [], anthropic_pairs(anthropic)
        assert (system, anthropic) == to_anthropic(messages)
        instruction, contents = view.gemini()
        assert gemini_pairs(contents) == [], gemini_pairs(contents)
        assert (instruction, contents) == to_gemini(messages)
        for provider in ("openai", "anthropic", "gemini"):
            assert validate_view(messages, provider) == [], provider
        # the budget: a view said to fit does, counted as the provider counts once a
        # report taught the guard the tokenizer's ratio (before, as the heuristic does)
        budget = report.budget
        counted = fresh_tokens(view)
        if world.store.state(SID).calibration_samples:
            counted = reported(view, self.ratio)
            event(f"calibrated: ratio {self.ratio}")
        if budget.within_budget:
            assert report.estimated_prompt_tokens + budget.reserve <= budget.window
            assert counted + budget.reserve <= budget.window, (counted, budget.window)
        # the guard's running account of the view is the view's: within the ratio it
        # learned from these reports (the heuristic counts a summary's framing and the
        # system message it joins a little differently from the regions it adds up)
        assert abs(counted - report.estimated_prompt_tokens) <= max(
            100, report.estimated_prompt_tokens // 20), (counted, report.estimated_prompt_tokens)
        assert budget.window <= MODELS[report.model][0]
        # the history is the log's, in order, from the watermark, then the pending turn
        cheap: dict[int, Any] | None = None  # the store's decisions, read when needed
        w = report.watermark
        sources = [(i, Message(**m)) for i, m in enumerate(self.log) if i >= w]
        sources += [(len(self.log) + k, Message(**m)) for k, m in enumerate(self.pending)]
        at = 0
        seen: list[int] = []
        for position, m in enumerate(messages):
            if position == 0 and m.role == "system":
                continue
            if m.metadata.get("compaction") == "summary":
                assert position <= 1, "a summary inside the history"
                continue
            if m.role == "tool" and m.text() == MISSING_RESULT_TEXT:
                continue  # a repaired interrupted call
            k = marker(m)
            if k is not None:
                found = next((j for j in range(at, len(sources))
                              if marker(sources[j][1]) == k), None)
                assert found is not None, f"message [#{k}] out of order or unknown"
            elif CLIP_MARKER.split("{")[0] in m.text() and report.truncated:
                # clipped down to the marker, its head with ours: the next one of its role
                found = next((j for j in range(at, len(sources))
                              if sources[j][1].role == m.role), None)
                assert found is not None, f"a clipped message of no stored one: {m}"
            else:
                assert m.role == "tool", f"an unknown message in the view: {m}"
                if cheap is None:
                    cheap = world.store.load_view(SID).cheap if self.log else {}
                found = next((j for j in range(at, len(sources)) if sources[j][0] in cheap
                              and cheap[sources[j][0]].placeholder == m.text()), None)
                assert found is not None, f"a placeholder for no stored result: {m.text()}"
            assert sources[found][1].role == m.role
            seen.append(sources[found][0])
            at = found + 1
        missing = [i for i, _ in sources if i not in seen]
        if not report.truncated:
            assert missing == [], f"messages lost without a truncation: {missing}"
        else:
            assert len(missing) <= report.dropped_messages, (missing, report.dropped_messages)
        # the newest user message and the pending turn's newest message are there
        users = [i for i, m in sources if m.role == "user"]
        if users:
            assert users[-1] in seen, "the newest user message is missing"
        if self.pending:
            assert len(self.log) + len(self.pending) - 1 in seen, \
                "the pending turn's newest message is missing"


SessionMachine.TestCase.settings = settings(
    # ~15 s here; STATEFUL_EXAMPLES / STEPS / RANDOM=1 for a longer, randomised search
    # (with --timeout=0: a long run outlives pytest-timeout's 300 s)
    max_examples=int(os.environ.get("STATEFUL_EXAMPLES", 60)),
    stateful_step_count=int(os.environ.get("STATEFUL_STEPS", 30)), deadline=None,
    derandomize=not os.environ.get("STATEFUL_RANDOM"),
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestGuardSession = SessionMachine.TestCase


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_the_estimate_counts_the_results_repair_adds(shell: str) -> None:
    """Thirty turns each cut off after a tool call: each call goes out with a placeholder
    result the repair adds (~21 tokens), which the estimate left out (584 tokens of a
    request of 1,214: a view said to fit went over a learned window, and the provider's
    reports taught the calibration ratio the gap as if it were the tokenizer's). Counted
    since, for the kept repair, its continuation and a pending turn alike."""
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(key_prefix="r"))
    guard = make(shell, store, overrides={"m": 100_000})
    for i in range(30):
        guard.record_turn(SID, [{"role": "user", "content": f"step {i}"},
                                {"role": "assistant", "content": "", "tool_calls": [
                                    {"id": f"c{i}", "name": "bash", "arguments": "{}"}]}])
    view = guard.prepare(SID, "sys", model="m", pending=[{"role": "user", "content": "go on"}])
    assert repair_tokens(view) > 500
    assert view.report.estimated_prompt_tokens >= DEFAULT_COUNTER.messages(list(view.messages))
    guard.record_turn(SID, [{"role": "user", "content": "go on"}])  # the kept repair, extended
    pending = [{"role": "user", "content": "more"},
               {"role": "assistant", "content": "", "tool_calls": [  # interrupted: pending
                   {"id": "p1", "name": "bash", "arguments": "{}"}]},
               {"role": "user", "content": "and?"}]
    for k in (1, 3):
        view = guard.prepare(SID, "sys", model="m", pending=pending[:k])
        assert view.report.estimated_prompt_tokens >= DEFAULT_COUNTER.messages(
            list(view.messages)), k
