"""``recover`` and ``prepare`` against the HTTP shell audit's findings, at the library level
(both guard shells, fakeredis and a real Redis): a limit one session's error states stays
that session's (in its state, read by every process) where the model's window is known; a
recognised overflow of a request that had history to drop is retried, whatever other
sessions taught the guard; a retry is never larger than the refused request; a prepare of
a session never recorded writes nothing. (Sessions are sized to the windows their errors
state: a request the guard counts far below the provider, with nothing to drop, is not
retried.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shared.core.messages import Message
from shared.store.sessions import SessionStore

MODEL = "gpt-4o"  # a registry window of 128,000
SYSTEM = "You are a support agent."
LLAMA_CPP = "Requested tokens (2285) exceed context window of 2048"
VLLM_RESERVE = ("This model's maximum context length is 65536 tokens. However, you requested "
                "64000 output tokens and your prompt contains at least 1537 input tokens, for "
                "a total of at least 65537 tokens. Please reduce the length of the input "
                "prompt or the number of requested output tokens. (parameter=input_tokens, "
                "value=1537)")
ZAI = "model_context_window_exceeded"  # states no numbers


def record(store: SessionStore, guard: Any, session_id: str, turns: int = 1,
           words: int = 5) -> None:
    for i in range(turns):
        guard.record_turn(session_id, [
            Message(role="user", content=f"question {i} " + "detail " * words),
            Message(role="assistant", content=f"answer {i} " + "detail " * words)])


def window(guard: Any, session_id: str) -> tuple[int, str]:
    report = guard.prepare(session_id, SYSTEM, max_tokens=100, model=MODEL).report
    return report.budget.window, report.limits_source


def test_a_stated_limit_below_a_known_window_is_the_sessions_alone_in_every_process(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """F2: a llama.cpp server with a 2k context refuses one session's request: that session
    gets the 2048 window (stored in its state), in this process and in a new one alike;
    the model's other sessions, recorded or new, keep the registry's 128000."""
    guard = make_guard(store)
    record(store, guard, "other")
    record(store, guard, "victim", turns=10, words=100)  # ~2.1k tokens
    assert window(guard, "other") == (128_000, "registry")
    view = guard.recover("victim", LLAMA_CPP, SYSTEM, max_tokens=100, model=MODEL)
    assert view is not None and view.report.budget.window == 2048
    assert store.state("victim").learned_window == 2048
    assert guard.limits.get(MODEL) is None
    assert window(guard, "other") == (128_000, "registry")
    assert window(guard, "brand-new") == (128_000, "registry")
    assert window(guard, "victim") == (2048, "learned")
    restarted = make_guard(store)  # another process (or this one after a restart)
    assert window(restarted, "victim") == (2048, "learned")
    assert window(restarted, "other") == (128_000, "registry")


def test_a_later_larger_stated_limit_does_not_raise_the_sessions_window(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """F2: with the limit kept in the session's state alone, an error stating a larger one
    (another endpoint behind the same model name) is measured against the session's
    window, not the registry's: an overflow never raises the window."""
    guard = make_guard(store)
    record(store, guard, "s", turns=10, words=100)
    assert guard.recover("s", LLAMA_CPP, SYSTEM, max_tokens=100, model=MODEL) is not None
    guard.recover("s", "Requested tokens (5000) exceed context window of 4096", SYSTEM,
                  max_tokens=100, model=MODEL)
    assert store.state("s").learned_window == 2048
    assert window(guard, "s") == (2048, "learned")


def test_a_guessed_window_is_still_corrected_for_every_session(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """F2's other half: where the window is a guess (an unknown model's fallback), the
    stated limit is shared with the model's other sessions in this process, as before."""
    guard = make_guard(store)
    record(store, guard, "a", turns=10, words=100)
    record(store, guard, "b")
    model = "my-local-model"
    assert guard.recover("a", LLAMA_CPP, SYSTEM, max_tokens=100, model=model) is not None
    assert guard.limits.get(model) == 2048
    report = guard.prepare("b", SYSTEM, max_tokens=100, model=model).report
    assert report.budget.window == 2048


def test_a_sessions_own_smaller_window_beats_the_processes_learned_one(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """A guessed window the process learned from one session's error (4096) does not raise
    another session's own smaller one, which its endpoint stated (2048, in its state: set
    by another process, or before the process learned its figure)."""
    model = "my-local-model"
    guard = make_guard(store)
    record(store, guard, "small", turns=10, words=100)
    record(store, guard, "other", turns=24, words=100)  # ~4.9k
    assert guard.recover("small", LLAMA_CPP, SYSTEM, max_tokens=100, model=model) is not None
    assert store.state("small").learned_window == 2048
    elsewhere = make_guard(store)  # another process: its book learns 4096 from "other"
    assert elsewhere.recover("other", "Requested tokens (5000) exceed context window of 4096",
                             SYSTEM, max_tokens=100, model=model) is not None
    assert elsewhere.limits.get(model) == 4096
    report = elsewhere.prepare("small", SYSTEM, max_tokens=100, model=model).report
    assert report.budget.window == 2048


def long_session(store: SessionStore, guard: Any, session_id: str) -> int:
    """A session of ~10k tokens; the estimate of its next request's view."""
    record(store, guard, session_id, turns=40, words=120)
    pending = [Message(role="user", content="and now?")]
    return int(guard.prepare(session_id, SYSTEM, max_tokens=1000, model=MODEL,
                             pending=pending).report.estimated_prompt_tokens)


def test_a_numberless_overflow_is_retried_after_other_sessions_taught_a_window(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """F3: another session's vLLM output-reserve error states 65536, and this process's
    book holds it (an older guard learned it for every session; an integration, a caller's
    book still may). A z.ai overflow stating no numbers on a ~10k-token view compacted to
    a fifth of 65536 (13107 tokens), more than the whole refused view: nothing dropped,
    not retried. It is compacted to a fifth of the refused request and retried."""
    guard = make_guard(store)
    record(store, guard, "reserve")
    guard.recover("reserve", VLLM_RESERVE, SYSTEM, max_tokens=64_000, model=MODEL)
    guard.limits.learn(MODEL, 65_536)
    refused = long_session(store, guard, "s")
    assert 8_000 < refused < 0.2 * 65_536
    pending = [Message(role="user", content="and now?")]
    view = guard.recover("s", ZAI, SYSTEM, max_tokens=1000, model=MODEL, pending=pending,
                         prepared_tokens=refused)
    assert view is not None and view.report.recovery and view.report.dropped_messages
    assert view.report.estimated_prompt_tokens < refused / 2


def test_an_overflow_restating_the_known_window_is_retried_smaller(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """F3: "maximum context length is 128000 tokens" on a ~10k-token view (the provider
    counted far more than the guard): nothing learned (it is the window the guard knows),
    and the view is compacted below the refused one and retried, not given up on."""
    guard = make_guard(store)
    refused = long_session(store, guard, "s")
    pending = [Message(role="user", content="and now?")]
    view = guard.recover("s", "This model's maximum context length is 128000 tokens",
                         SYSTEM, max_tokens=1000, model=MODEL, pending=pending,
                         prepared_tokens=refused)
    assert view is not None and view.report.budget.window == 128_000
    assert view.report.estimated_prompt_tokens < refused / 2


def _docs_flow(guard: Any) -> tuple[dict[str, Any], list[dict[str, str]], int]:
    """docs/server.md's flow: one turn recorded with the provider's 812 prompt tokens (a
    steep calibration), then the next turn's view (~831 tokens)."""
    fig: dict[str, Any] = {"system_prompt": "You are terse.", "model": "gpt-4o-2024-11-20",
                           "max_tokens": 500}
    first = [{"role": "user", "content": "What is in /src?"}]
    guard.prepare("d", pending=first, **fig)
    guard.record_turn("d", [*first, {"role": "assistant", "content": "a.py and b.py."}],
                      usage={"prompt_tokens": 812, "completion_tokens": 9})
    pending = [{"role": "user", "content": "And /lib?"}]
    refused = guard.prepare("d", pending=pending, **fig).report.estimated_prompt_tokens
    return fig, pending, refused


def test_a_retry_is_never_larger_than_the_refused_request(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """F4: the cut's notice outweighs the one short turn it drops, by the guard's own
    count; the error states nothing that says the guard's count is off: a retry of ~1.9k
    tokens against a refused ~830 was returned. None now (the "no smaller view" path)."""
    guard = make_guard(store)
    fig, pending, refused = _docs_flow(guard)
    view = guard.recover("d", "context_length_exceeded", pending=pending, **fig)
    assert view is None or view.report.estimated_prompt_tokens < refused


def test_a_provider_counting_far_more_than_plain_text_explains_is_not_retried(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """The same flow refused as 131000 tokens: the provider counts ~130k the guard never
    saw. The view that drops the first turn was sent as the estimates "do not measure the
    retry"; but what it drops is plain text, which they do measure, so the ~130k are still
    in it and it was refused again. Not retried now, nothing written
    (tests/test_guard_recover_sendable.py: the same where a tool's output is dropped)."""
    guard = make_guard(store)
    fig, pending, _ = _docs_flow(guard)
    view = guard.recover("d", "This model's maximum context length is 128000 tokens. "
                         "However, your messages resulted in 131000 tokens.",
                         pending=pending, **fig)
    assert view is None
    assert store.summaries("d") == [] and store.state("d").watermark == 0


def test_a_prepare_of_a_session_never_recorded_is_no_session_to_list(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """F6: a prepare of a session never recorded writes its request figures (the worker a
    record in another process starts budgets with them), and the session is none to
    ``compaction sessions`` as to ``stats`` until a turn is recorded."""
    from workers.cli.sessions import list_page

    guard = make_guard(store)
    guard.prepare("ghost", SYSTEM, max_tokens=100, model="qa-model-8k")
    assert [r.session_id for r in list_page(store).sessions] == []
    other = make_guard(store)  # another process records the first turn
    other.record_turn("ghost", [{"role": "user", "content": "q1 " + "tok " * 1500},
                                {"role": "assistant", "content": "a1"}])
    state = store.state("ghost")
    assert (state.model, state.window, state.max_tokens) == ("qa-model-8k", 8000, 100)
    assert [r.session_id for r in list_page(store).sessions] == ["ghost"]


def test_a_learned_window_stays_with_the_model_it_was_learned_for(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """QA: the state keeps one ``model``, which every prepare rewrites: a gpt-4o session
    that learned 8192 and went on with claude got 8192 for claude from its second prepare
    on (and the worker budgeted claude's summaries with it), and lost it on returning to
    gpt-4o. The window now belongs to the model it was learned for."""
    from workers.compactor import Compactor
    from workers.summarizer.engine import SummaryEngine

    guard = make_guard(store)
    record(store, guard, "switch", turns=40, words=110)  # ~9k
    assert guard.recover("switch", "Requested tokens (9285) exceed context window of 8192",
                         SYSTEM, max_tokens=100, model=MODEL) is not None
    claude = "claude-sonnet-4-5"

    def window_of(model: str) -> int:
        view = guard.prepare("switch", SYSTEM, max_tokens=100, model=model,
                             pending=[Message(role="user", content="next")])
        return int(view.report.budget.window)

    assert window_of(MODEL) == 8192
    assert [window_of(claude) for _ in range(3)] == [200_000] * 3
    assert Compactor(store, SummaryEngine(None))._window(store.state("switch"))[0] == 200_000
    assert window_of(MODEL) == 8192
    assert make_guard(store).prepare("switch", SYSTEM, max_tokens=100,
                                     model=MODEL).report.budget.window == 8192


def test_a_window_learned_before_the_upgrade_stays_with_its_model(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """QA: a state written before ``learned_model`` existed names the model only in
    ``model``, which the first prepare for another model rewrote: that model then got the
    learned window. The window is pinned to the state's model first."""
    record(store, make_guard(store), "old")
    # as the old code left it (a window plausible for gpt-4o's 128,000: audit F1's rule)
    store.update_state("old", learned_window=48_000, model=MODEL)
    guard = make_guard(store)
    claude = "claude-sonnet-4-5"
    windows = [guard.prepare("old", SYSTEM, max_tokens=100, model=model,
                             pending=[Message(role="user", content="next")]
                             ).report.budget.window for model in (MODEL, claude, claude, MODEL)]
    assert windows == [48_000, 200_000, 200_000, 48_000]
    assert store.state("old").learned_model == MODEL


# The state hash as b6a157e and 95c2620 leave it (audit F1's repro, scenario L3): an old
# guard learned 16,000 for gpt-4o (24,000 override), then served the session's first
# gpt-4.1 call, rewriting ``model`` and ``window`` and keeping the unowned window.
OLD_STATE = {"model": "gpt-4.1", "window": "1047576", "learned_window": "16000",
             "max_tokens": "2000", "system_tokens": "40", "tool_tokens": "120",
             "last_overflow_at": "1700000000.0"}
OVERRIDES = {"gpt-4o": 24_000}


def _budget(guard: Any, session_id: str, model: str) -> tuple[int, str]:
    report = guard.prepare(session_id, SYSTEM, max_tokens=2000, model=model,
                           pending=[Message(role="user", content="next")]).report
    return report.budget.window, report.limits_source


def test_a_window_an_old_guard_carried_over_a_model_switch_is_not_the_new_models(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """Audit F1: the old version's state names gpt-4.1 next to gpt-4o's unowned 16,000; the
    new guard and worker budgeted gpt-4.1 at 16,000 (65x too small) and the guard pinned
    it to gpt-4.1 for good. Implausible for gpt-4.1, it is ignored by both and dropped
    when the session moves on (gpt-4o overflows once more to learn it with its owner)."""
    from workers.compactor import Compactor
    from workers.summarizer.engine import SummaryEngine

    record(store, make_guard(store), "l3")
    store.redis.hset(store.keys("l3").state, mapping=OLD_STATE)
    worker = Compactor(store, SummaryEngine(None))
    assert worker._window(store.state("l3"))[0] == 1_047_576
    guard = make_guard(store, overrides=OVERRIDES)
    assert _budget(guard, "l3", "gpt-4.1") == (1_047_576, "registry")
    assert worker._window(store.state("l3"))[0] == 1_047_576
    assert _budget(guard, "l3", "gpt-4o") == (24_000, "override")
    state = store.state("l3")
    assert (state.learned_window, state.learned_model) == (0, "")  # dropped, not pinned
    assert _budget(make_guard(store, overrides=OVERRIDES), "l3", "gpt-4.1") \
        == (1_047_576, "registry")


def test_an_old_guards_second_call_after_the_switch_is_undone_by_the_new_guard(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """Audit F1, later in the deploy window: an old guard's next gpt-4.1 call took the
    16,000 for gpt-4.1 and stored it as ``window``. The new guard budgets gpt-4.1 at its
    registry window and rewrites ``window``, and the worker follows it."""
    from workers.compactor import Compactor
    from workers.summarizer.engine import SummaryEngine

    record(store, make_guard(store), "l3b")
    store.redis.hset(store.keys("l3b").state, mapping={**OLD_STATE, "window": "16000"})
    assert _budget(make_guard(store, overrides=OVERRIDES), "l3b", "gpt-4.1") \
        == (1_047_576, "registry")
    assert Compactor(store, SummaryEngine(None))._window(store.state("l3b"))[0] == 1_047_576


def test_an_old_window_plausible_for_its_model_is_kept_and_pinned_to_it(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """Audit F1's rule keeps what the old version got right: 16,000 for gpt-4o (24,000
    override) stays gpt-4o's in the guard and the worker, and is pinned to it when the
    session moves on to gpt-4.1."""
    from workers.compactor import Compactor
    from workers.summarizer.engine import SummaryEngine

    record(store, make_guard(store), "l0")
    store.redis.hset(store.keys("l0").state,
                     mapping={**OLD_STATE, "model": "gpt-4o", "window": "16000"})
    assert Compactor(store, SummaryEngine(None))._window(store.state("l0"))[0] == 16_000
    guard = make_guard(store, overrides=OVERRIDES)
    assert _budget(guard, "l0", "gpt-4o") == (16_000, "learned")
    assert _budget(guard, "l0", "gpt-4.1") == (1_047_576, "registry")
    state = store.state("l0")
    assert (state.learned_window, state.learned_model) == (16_000, "gpt-4o")
    assert _budget(guard, "l0", "gpt-4o") == (16_000, "learned")


def test_a_prepare_of_a_session_never_recorded_expires_with_the_sessions_ttl(
        make_guard: Callable[..., Any], any_redis: Any, key_prefix: str) -> None:
    """QA: the figures such a prepare writes made a state hash with no expiry even where
    the store has a session TTL: every id prepared and never recorded stayed forever."""
    from shared.core.config import StoreConfig

    store = SessionStore(any_redis, StoreConfig(key_prefix=key_prefix, ttl_seconds=60))
    make_guard(store).prepare("ghost", SYSTEM, max_tokens=100, model=MODEL)
    assert 0 < any_redis.ttl(store.keys("ghost").state) <= 60
    store.update_state("ghost", model="gpt-4o-mini")
    assert 0 < any_redis.ttl(store.keys("ghost").state) <= 60


def test_sessions_pages_are_not_ended_by_states_without_a_log(
        make_guard: Callable[..., Any], store: SessionStore) -> None:
    """QA: states without a log counted toward a page's limit and were dropped after, so
    pages came back empty with a cursor to the next one."""
    from workers.cli.sessions import list_page

    guard = make_guard(store)
    for i in range(60):
        guard.prepare(f"ghost-{i:02d}", SYSTEM, max_tokens=100, model=MODEL)
    record(store, guard, "real")
    cursor, seen, pages = 0, [], 0
    while True:
        page = list_page(store, limit=5, cursor=cursor)
        pages += 1
        assert page.sessions or page.cursor == 0, "an empty page that goes on"
        seen += [r.session_id for r in page.sessions]
        cursor = page.cursor
        if cursor == 0:
            break
    assert seen == ["real"]
