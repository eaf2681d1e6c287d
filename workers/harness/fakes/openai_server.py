"""A local OpenAI-compatible chat completions server for tests and replays.

The real ``openai`` SDK talks to it over HTTP::

    with FakeOpenAIServer(window=8192) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test")

It behaves like the provider where the project depends on it: it validates
the request (messages present, tool results answering the preceding
assistant's tool calls), counts prompt tokens, rejects a request that does not
fit the context window with OpenAI's exact ``context_length_exceeded`` body
(or, in ``truncate`` mode, silently drops the oldest messages like some
OpenAI-compatible servers do), reports ``usage``, and fails on demand with the
provider's real error bodies (see :mod:`workers.harness.fakes.behaviour`).

Run standalone: ``python -m workers.harness.fakes.openai_server --port 8001 --window 8192``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import threading
import time
import uuid
from typing import Any

from shared.core.errors import InvalidInput
from workers.harness.fakes.behaviour import Fault, Reply, Responder, Script, generated_text
from workers.harness.fakes.counting import PromptCounter, completion_tokens, default_counter
from workers.harness.fakes.http_base import (
    Exchange,
    FakeServerBase,
    Outcome,
    apply_content_fault,
    json_outcome,
)

ROLES = ("system", "assistant", "user", "function", "tool", "developer")
TOOL_NOT_PRECEDED = (
    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
    "with 'tool_calls'."
)
NO_API_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header "
    "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)
BAD_JSON = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using "
    "your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not "
    "valid JSON.)"
)


def openai_error(
    status: int,
    message: str,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Outcome:
    """OpenAI's error envelope: ``{"error": {message, type, param, code}}``."""
    error = {"message": message, "type": type_, "param": param, "code": code}
    return json_outcome(status, {"error": error}, headers)


def overflow_message(window: int, prompt: int, completion: int | None) -> str:
    """OpenAI's context_length_exceeded text; the completion variant when max_tokens tips it."""
    if completion is None or prompt > window:
        return (
            f"This model's maximum context length is {window} tokens. However, your messages "
            f"resulted in {prompt} tokens. Please reduce the length of the messages."
        )
    return (
        f"This model's maximum context length is {window} tokens. However, you requested "
        f"{prompt + completion} tokens ({prompt} in the messages, {completion} in the "
        "completion). Please reduce the length of the messages or completion."
    )


def validate_chat(body: Any) -> Outcome | None:
    """The 400 OpenAI would answer for a malformed chat request, or None when it is fine."""
    if not isinstance(body, dict):
        return openai_error(400, BAD_JSON)
    if not body.get("model"):
        return openai_error(400, "you must provide a model parameter")
    messages = body.get("messages")
    if messages is None:
        return openai_error(
            400, "Missing required parameter: 'messages'.", param="messages",
            code="missing_required_parameter",
        )
    if not isinstance(messages, list) or not messages:
        return openai_error(
            400, "Invalid 'messages': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.", param="messages", code="empty_array",
        )
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None and (not isinstance(value, int) or value < 1):
            return openai_error(
                400, f"Invalid '{key}': integer below minimum value. Expected a value >= 1, "
                f"but got {value} instead.", param=key, code="integer_below_min_value",
            )
    return _validate_messages(messages)


def _validate_messages(messages: list[Any]) -> Outcome | None:
    """Roles are known; tool results answer the ids of the assistant message before them."""
    open_ids: set[str] | None = None  # ids of the assistant tool_calls whose results follow
    answered: set[Any] = set()
    opener = -1
    for i, message in enumerate([*messages, None]):
        role = message.get("role") if isinstance(message, dict) else None
        if message is not None and role not in ROLES:
            supported = ", ".join(f"'{r}'" for r in ROLES[:-1]) + f", and '{ROLES[-1]}'"
            return openai_error(
                400, f"Invalid value: '{role}'. Supported values are: {supported}.",
                param=f"messages[{i}].role", code="invalid_value",
            )
        if role == "tool":
            assert isinstance(message, dict)
            if open_ids is None:
                return openai_error(400, TOOL_NOT_PRECEDED, param=f"messages.[{i}].role")
            call_id = message.get("tool_call_id")
            if call_id not in open_ids and call_id not in answered:
                return openai_error(
                    400, f"Invalid parameter: 'tool_call_id' of '{call_id}' not found in "
                    "'tool_calls' of previous message.", param=f"messages.[{i}].tool_call_id",
                )
            open_ids.discard(call_id)
            answered.add(call_id)
            continue
        if open_ids:
            return openai_error(
                400, "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(sorted(open_ids))}",
                param=f"messages.[{opener}].role",
            )
        open_ids, answered, opener = None, set(), i
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if role == "assistant" and calls:
            open_ids = {
                str(c.get("id")) for c in calls if isinstance(c, dict) and c.get("id") is not None
            }
    return None


class FakeOpenAIServer(FakeServerBase):
    """OpenAI-compatible ``/v1/chat/completions`` and ``/v1/models`` on 127.0.0.1.

    ``window`` is the context window in tokens; ``counter`` counts a request's
    prompt (``count(messages, tools) -> int``, default o200k with OpenAI's framing);
    ``responder`` is a :class:`Script`, a list of assistant messages, a callable
    ``(request_json) -> reply``, or None for echo/summary replies; ``latency`` is
    slept per request (concurrent requests overlap); ``truncate`` drops the oldest
    messages instead of rejecting an overflow.
    """

    url_prefix = "/v1"

    def __init__(
        self,
        *,
        window: int = 128_000,
        responder: Responder | Script | list[Any] | None = None,
        counter: PromptCounter | None = None,
        model: str = "gpt-4o-fake",
        latency: float = 0.0,
        truncate: bool = False,
        require_auth: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if window < 1:
            raise InvalidInput("must be >= 1", field="window")
        super().__init__(responder=responder, latency=latency, host=host, port=port)
        self.window = window
        self.counter: PromptCounter = counter if counter is not None else default_counter()
        self.model = model
        self.truncate = truncate
        self.require_auth = require_auth

    # -- routing ---------------------------------------------------------------
    def route(self, exchange: Exchange) -> Outcome:
        if self.require_auth and not exchange.headers.get("authorization", "").strip():
            return openai_error(401, NO_API_KEY)
        path = exchange.path.rstrip("/")
        if exchange.method == "GET" and path == "/v1/models":
            return json_outcome(200, {"object": "list", "data": [self._model_card(self.model)]})
        if exchange.method == "GET" and path.startswith("/v1/models/"):
            return json_outcome(200, self._model_card(path.removeprefix("/v1/models/")))
        if exchange.method == "POST" and path == "/v1/chat/completions":
            return self._chat(exchange)
        return openai_error(404, f"Invalid URL ({exchange.method} {exchange.path})")

    def _model_card(self, model: str) -> dict[str, Any]:
        return {"id": model, "object": "model", "created": 1_700_000_000, "owned_by": "fake"}

    # -- faults ----------------------------------------------------------------
    def error_outcome(
        self, fault: Fault, exchange: Exchange, message: str | None = None
    ) -> Outcome:
        model = exchange.model or self.model
        if fault.kind == "rate_limit":
            wait = fault.seconds
            text = message or (
                f"Rate limit reached for {model} in organization org-fake on tokens per min "
                f"(TPM): Limit 30000, Used 30000, Requested 1000. Please try again in {wait:g}s. "
                "Visit https://platform.openai.com/account/rate-limits to learn more."
            )
            headers = {"retry-after": str(math.ceil(wait)), "retry-after-ms": str(int(wait * 1000))}
            return openai_error(429, text, "tokens", code="rate_limit_exceeded", headers=headers)
        if fault.kind == "unavailable":
            return openai_error(503, message or "The server is overloaded or not ready yet.",
                                "server_error")
        if fault.kind == "overloaded":  # what Anthropic-backed compatible gateways pass through
            error = {"type": "overloaded_error", "message": message or "Overloaded"}
            return json_outcome(529, {"type": "error", "error": error})
        if fault.kind == "http_error" and fault.status is not None:
            return Outcome(fault.status, (fault.body or "").encode())
        return openai_error(
            500, message or "The server had an error while processing your request. Sorry about "
            "that!", "server_error",
        )

    # -- chat completions ------------------------------------------------------
    def _chat(self, exchange: Exchange) -> Outcome:
        try:
            body = json.loads(exchange.raw)
        except ValueError:
            body = None
        exchange.parsed = body
        model = str(body.get("model") or self.model) if isinstance(body, dict) else self.model
        exchange.model = model
        fault, early = self.take_fault(exchange)
        if early is not None:
            return early
        invalid = validate_chat(body)
        if invalid is not None:
            return invalid
        assert isinstance(body, dict)
        messages: list[dict[str, Any]] = body["messages"]
        tools = body.get("tools") or None
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        prompt = self.counter(messages, tools)
        if prompt + (max_tokens or 0) > self.window and self.truncate:
            kept, kept_prompt, dropped = self._truncate(messages, tools, max_tokens)
            if kept_prompt + (max_tokens or 0) <= self.window:  # else reject the original
                messages, prompt, exchange.dropped_messages = kept, kept_prompt, dropped
        exchange.prompt_tokens = prompt
        if prompt + (max_tokens or 0) > self.window:
            return openai_error(
                400, overflow_message(self.window, prompt, max_tokens), param="messages",
                code="context_length_exceeded",
            )
        request = {**body, "messages": messages}
        if fault is not None and fault.kind in ("refusal", "empty", "endless"):
            reply: Reply | Outcome = apply_content_fault({}, fault, max_tokens)
        else:
            reply = self.reply_or_outcome(exchange, request, max_tokens)
        if isinstance(reply, Outcome):
            return reply
        completion = self._completion(model, prompt, reply, max_tokens)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return Outcome(200, _sse(completion, include_usage), "text/event-stream")
        return json_outcome(200, completion)

    def _truncate(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, max_tokens: Any
    ) -> tuple[list[dict[str, Any]], int, int]:
        """Drop the oldest non-system messages (keeping the last) until the request fits.

        The fewest drops are found by bisection: the count only shrinks as more is dropped.
        Returns the kept messages, their prompt tokens and how many were dropped.
        """
        system = [m for m in messages if m.get("role") in ("system", "developer")]
        rest = [m for m in messages if m.get("role") not in ("system", "developer")]

        def kept(drop: int) -> list[dict[str, Any]]:
            tail = rest[drop:]
            while len(tail) > 1 and tail[0].get("role") == "tool":  # no orphan results first
                tail = tail[1:]
            return system + tail

        low, high = 0, max(len(rest) - 1, 0)
        while low < high:
            mid = (low + high) // 2
            if self.counter(kept(mid), tools) + (max_tokens or 0) <= self.window:
                high = mid
            else:
                low = mid + 1
        result = kept(low)
        return result, self.counter(result, tools), len(messages) - len(result)

    def _completion(
        self, model: str, prompt: int, reply: Reply, max_tokens: int | None
    ) -> dict[str, Any]:
        content = reply.get("content")
        calls = reply.get("tool_calls")
        used = reply.get("completion_tokens") or completion_tokens(
            self.counter, generated_text(reply)
        )
        finish = reply.get("finish_reason") or ("tool_calls" if calls else "stop")
        if max_tokens is not None and used > max_tokens and content:
            content, used, finish, calls = content[: max_tokens * 4], max_tokens, "length", None
        message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
        if calls:
            message["tool_calls"] = calls
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": used,
                "total_tokens": prompt + used,
            },
            "system_fingerprint": "fp_fake",
        }


def _sse(completion: dict[str, Any], include_usage: bool) -> bytes:
    """The completion as OpenAI's server-sent chunks (content in 64-character pieces)."""
    message = completion["choices"][0]["message"]
    base = {k: completion[k] for k in ("id", "created", "model", "system_fingerprint")}
    base["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    text = message.get("content") or ""
    chunks += [chunk({"content": text[i : i + 64]}) for i in range(0, len(text), 64)]
    for i, call in enumerate(message.get("tool_calls") or []):
        chunks.append(chunk({"tool_calls": [{"index": i, **call}]}))
    chunks.append(chunk({}, completion["choices"][0]["finish_reason"]))
    if include_usage:
        chunks.append({**base, "choices": [], "usage": completion["usage"]})
    lines = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
    return "".join(lines).encode()


def _load_script(path: str) -> Script:
    """Assistant messages from a JSON list or JSON-lines file (other roles are skipped)."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    stripped = text.lstrip()
    items = json.loads(text) if stripped.startswith("[") else [
        json.loads(line) for line in text.splitlines() if line.strip()
    ]
    return Script(items)


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted; prints the base URL first so a parent can read it."""
    parser = argparse.ArgumentParser(description="Fake OpenAI-compatible chat completions server")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--window", type=int, default=128_000, help="context window in tokens")
    parser.add_argument("--model", default="gpt-4o-fake")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added per request")
    parser.add_argument("--truncate", action="store_true", help="drop oldest messages silently")
    parser.add_argument("--tokenizer", help="path to o200k_base.tiktoken (default: shared data)")
    parser.add_argument("--script", help="JSON or JSONL file of assistant messages to replay")
    args = parser.parse_args(argv)
    server = FakeOpenAIServer(
        window=args.window, model=args.model, latency=args.latency, truncate=args.truncate,
        counter=default_counter(args.tokenizer), port=args.port,
        responder=_load_script(args.script) if args.script else None,
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with server:
        print(server.base_url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            done.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
