"""Tests for workers.summarizer.quality: what may and may not be stored as a summary."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.errors import BadSummary, InvalidInput
from workers.summarizer.quality import check_summary, clean_summary, section_count

GOOD = """## Goal
Fix the crash in `src/app.py` (ZeroDivisionError).

## Constraints
- "You must not modify tests."

## Progress
### Done
- Reproduced with `python -m pytest -q`: Error: division by zero at line 3.
### In progress
- Patching `src/app.py`.

## Key decisions
- I'm sorry-style apologies from the user were ignored; the fix removes the division.

## Next steps
- Re-run the tests.

## Critical context
- Internal Server Error seen once from the staging API (HTTP 500), retried fine.

## Read files
- src/app.py

## Modified files
- src/app.py
"""


def check(text: str, input_tokens: int = 10_000) -> str:
    return check_summary(text, input_tokens=input_tokens)


def test_real_summary_mentioning_errors_and_apologies_passes() -> None:
    assert check(GOOD) == GOOD.strip()
    assert section_count(GOOD) == 10


@pytest.mark.parametrize("variant", [
    "**Goal:** fix it\n**Constraints:** none\n**Progress:** half done",
    "1. Goal\nfix it\n2. Next steps\nrun tests",
    "### Turn request\nrun the suite\n### Attempted\n`pytest`",
    "Error: the build failed at step 3.\n\n## Goal\nFix the build\n\n## Next steps\n- retry",
])
def test_other_section_styles_pass(variant: str) -> None:
    assert check(variant)


@pytest.mark.parametrize(("wrapped", "expected"), [
    (f"```markdown\n{GOOD}```", GOOD.strip()),
    (f"<summary>\n{GOOD}\n</summary>", GOOD.strip()),
    (f"<think>The user wants... let me plan.</think>\n{GOOD}", GOOD.strip()),
    (f"Here is the updated summary:\n\n{GOOD}", GOOD.strip()),
    (f"Sure! Here's the summary of the conversation:\n{GOOD}", GOOD.strip()),
    (GOOD.replace("\n", "\r\n"), GOOD.strip()),
])
def test_wrappers_are_cleaned(wrapped: str, expected: str) -> None:
    assert check(wrapped) == expected


@pytest.mark.parametrize(("reply", "reason"), [
    ("", "empty summary"),
    ("   \n\t ", "empty summary"),
    ("<think>I should summarize but the output was cut", "no summary after removing"),
    ("I'm sorry, but I can't help with that request.", "refusal"),
    ("As an AI language model, I cannot summarize private conversations.", "refusal"),
    ("Unfortunately, I am unable to process this transcript.", "refusal"),
    ("Error: upstream request timed out", "error text"),
    ("Internal Server Error", "error text"),
    ("503 Service Unavailable", "error text"),
    ("RateLimitError: Rate limit reached for gpt-4o", "error text"),
    ('{"error": {"message": "The server is overloaded", "type": "server_error"}}', "JSON error"),
    ('{"detail": "Not Found"}', "JSON error"),
    ("<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head></html>", "HTML page"),
    ("Sure! Here's the fixed code:\n\n```python\nx = 1\n```", "continues the conversation"),
    ("I'll run the test suite now and report back.", "continues the conversation"),
    ("Assistant: Your reservation JG7FMM has been downgraded.", "continues the conversation"),
    ("The user asked about flights and the agent looked them up.", "none of the required"),
])
def test_bad_replies_are_rejected_with_a_reason(reply: str, reason: str) -> None:
    with pytest.raises(BadSummary, match=reason):
        check(reply)


def test_a_summary_longer_than_its_input_is_rejected() -> None:
    with pytest.raises(BadSummary, match="longer than its input"):
        check(GOOD, input_tokens=50)
    assert check(GOOD, input_tokens=len(GOOD))  # ~4 chars per token: shorter than its input


def test_arguments_are_validated() -> None:
    with pytest.raises(InvalidInput, match="input_tokens"):
        check_summary(GOOD, input_tokens=0)
    with pytest.raises(InvalidInput, match="text"):
        check_summary(None, input_tokens=10)  # type: ignore[arg-type]


_NOISE = st.text(st.characters(codec="utf-8", exclude_characters="#*_"), max_size=200)


@settings(max_examples=200, deadline=None)
@given(_NOISE, _NOISE, _NOISE)
def test_structured_summaries_pass_whatever_they_mention(a: str, b: str, c: str) -> None:
    text = f"## Goal\n{a}\n\n## Progress\n### Done\n{b}\n\n## Critical context\n{c}\n"
    cleaned = check(text, input_tokens=100_000)
    assert check(cleaned, input_tokens=100_000) == cleaned  # cleaning is idempotent


@settings(max_examples=200, deadline=None)
@given(_NOISE)
def test_clean_never_grows(text: str) -> None:
    assert len(clean_summary(text)) <= len(text)


FULL = "\n".join(f"## {name}\n- point about {name.lower()}" for name in (
    "Goal", "Constraints", "Progress", "Key decisions", "Next steps", "Critical context",
    "Read files", "Modified files"))
STUB = "## Goal\nwork on the project\n## Constraints\nnone\n## Progress"


def test_an_update_that_loses_most_sections_of_the_previous_summary_is_rejected() -> None:
    with pytest.raises(BadSummary, match="sections"):
        check_summary(STUB, input_tokens=5000, previous=FULL)
    assert check_summary(STUB, input_tokens=5000) == STUB  # a first summary: nothing to lose
    kept = FULL.replace("## Read files\n- point about read files\n", "")
    assert check_summary(kept, input_tokens=5000, previous=FULL) == kept  # one dropped: fine


def test_an_engine_update_answered_with_a_stub_is_not_stored() -> None:
    """Through the real openai client: the stub never replaces the previous summary."""
    from shared.core.ledger import Ledger
    from shared.core.messages import Message
    from workers.harness.fakes import FakeOpenAIServer
    from workers.summarizer.engine import SummaryEngine
    from workers.summarizer.providers import OpenAIClient

    reply = {"role": "assistant", "content": STUB, "finish_reason": "stop"}
    with FakeOpenAIServer(responder=[reply]) as server:
        client = OpenAIClient("gpt-4o-mini", api_key="k", base_url=server.base_url, timeout=5)
        messages = [Message(role="user", content="step " + "word " * 300)]
        with pytest.raises(BadSummary):
            SummaryEngine(client).summarize(messages, FULL, Ledger())


def test_a_reply_well_over_the_summary_token_cap_is_rejected() -> None:
    """The plan reserves max_summary_tokens for the summary: a reply three times that
    leaves the session over its target after compacting."""
    big = FULL + "\n" + "\n".join(f"- finding {i}: /srv/app/{i}/cfg.json" for i in range(300))
    with pytest.raises(BadSummary, match="cap"):
        check_summary(big, input_tokens=100_000, max_tokens=1000)
    assert check_summary(FULL, input_tokens=100_000, max_tokens=1000) == FULL


def test_an_engine_reply_well_over_the_cap_is_not_stored() -> None:
    """Through the real openai client: the provider counts the reply under its max_tokens
    (finish_reason stop), our count is three times the cap the plan reserved."""
    from shared.core.ledger import Ledger
    from shared.core.messages import Message
    from workers.harness.fakes import FakeOpenAIServer
    from workers.summarizer.engine import SummaryEngine
    from workers.summarizer.providers import OpenAIClient

    big = FULL + "\n" + "\n".join(f"- finding {i}: /srv/app/{i}/cfg.json" for i in range(300))
    reply = {"role": "assistant", "content": big, "finish_reason": "stop",
             "completion_tokens": 990}
    with FakeOpenAIServer(responder=[reply]) as server:
        client = OpenAIClient("gpt-4o-mini", api_key="k", base_url=server.base_url, timeout=5)
        messages = [Message(role="user", content="step " + "word " * 20_000)]
        with pytest.raises(BadSummary, match="cap"):
            SummaryEngine(client, max_summary_tokens=1000).summarize(messages, None, Ledger())
