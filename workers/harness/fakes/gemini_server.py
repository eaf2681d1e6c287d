"""A local Gemini / Vertex AI ``generateContent`` server for tests.

The real ``google-genai`` SDK talks to it over HTTP in both of its modes::

    with FakeGeminiServer(window=1_048_576) as server:
        # Gemini API (API key): POST {base}/v1beta/models/{model}:generateContent
        client = genai.Client(api_key="test", http_options=server.http_options())
        # Vertex AI: POST {base}/v1beta1/projects/{p}/locations/{l}/publishers/google/
        #            models/{model}:generateContent with a Bearer token
        client = genai.Client(vertexai=True, project="p", location="us-central1",
                              credentials=server.credentials(), http_options=server.http_options())

Vertex mode needs OAuth credentials: the SDK calls ``google.auth.default()``
unless it is given credentials. :meth:`FakeGeminiServer.credentials` returns
a ``google.oauth2.credentials.Credentials`` holding a fixed token and no
expiry, which the SDK uses as is (no refresh, no network); Vertex express
mode (``vertexai=True, api_key=...``) works too. The fake counts prompt
tokens (its ``contents`` converted to the OpenAI form the counter takes),
rejects inputs beyond ``window`` with Gemini's real INVALID_ARGUMENT text,
answers with ``candidates`` / ``usageMetadata``, and shares fault injection,
scripts and request recording with the OpenAI fake.
"""

from __future__ import annotations

import json
import math
import re
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

_METHODS = "generateContent|countTokens"
GEMINI_PATH = re.compile(
    rf"^/(?P<version>v1[a-z0-9]*)/models/(?P<model>[^/:]+):(?P<method>{_METHODS})$"
)
VERTEX_PATH = re.compile(
    rf"^/(?P<version>v1[a-z0-9]*)/(?:projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/)?"
    rf"publishers/google/models/(?P<model>[^/:]+):(?P<method>{_METHODS})$"
)
FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP"}
FAKE_TOKEN = "fake-vertex-token"  # a placeholder the fake accepts, not a secret
UNREGISTERED = (
    "Method doesn't allow unregistered callers (callers without established identity). "
    "Please use API Key or other form of API consumer identity to call this API."
)
UNAUTHENTICATED = (
    "Request is missing required authentication credential. Expected OAuth 2 access token, "
    "login cookie or other valid authentication credential."
)


def gemini_error(
    code: int, message: str, status: str, details: list[Any] | None = None,
    headers: dict[str, str] | None = None,
) -> Outcome:
    """Google's error envelope: ``{"error": {code, message, status[, details]}}``."""
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details:
        error["details"] = details
    return json_outcome(code, {"error": error}, headers)


def overflow_message(prompt: int, window: int) -> str:
    return (
        f"The input token count ({prompt}) exceeds the maximum number of tokens allowed ({window})."
    )


def contents_as_messages(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any] | None]:
    """The request in the OpenAI form the prompt counter takes: (messages, tools)."""
    config = body.get("generationConfig")
    config = config if isinstance(config, dict) else {}
    messages: list[dict[str, Any]] = []
    instruction = body.get("systemInstruction") or config.get("systemInstruction")
    if isinstance(instruction, dict):
        messages.append({"role": "system", "content": _parts(instruction.get("parts"))[0]})
    for content in body.get("contents") or []:
        if not isinstance(content, dict):
            continue
        parts, calls = _parts(content.get("parts"))
        role = "assistant" if content.get("role") == "model" else "user"
        message: dict[str, Any] = {"role": role, "content": parts}
        if calls:
            message["tool_calls"] = calls
        messages.append(message)
    tools = body.get("tools") or config.get("tools")
    return messages, tools if isinstance(tools, list) and tools else None


def _parts(parts: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Text-like parts (function responses as JSON text, media as placeholders) and calls."""
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for part in parts if isinstance(parts, list) else []:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            texts.append({"type": "text", "text": part["text"]})
        elif isinstance(part.get("functionCall"), dict):
            call = part["functionCall"]
            arguments = json.dumps(call.get("args") or {})
            calls.append({"function": {"name": str(call.get("name", "")), "arguments": arguments}})
        elif isinstance(part.get("functionResponse"), dict):
            texts.append({"type": "text", "text": json.dumps(part["functionResponse"])})
        else:
            texts.append({"type": "media"})
    return texts, calls


def validate_contents(body: Any) -> str | None:
    """Gemini's INVALID_ARGUMENT text for a malformed request, or None when it is fine."""
    if not isinstance(body, dict):
        return "Invalid JSON payload received."
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return "* GenerateContentRequest.contents: contents is not specified\n"
    previous_calls = 0
    for i, content in enumerate(contents):
        if not isinstance(content, dict) or content.get("role", "user") not in ("user", "model"):
            return "Please use a valid role: user, model."
        parts = [p for p in content.get("parts") or [] if isinstance(p, dict)]
        if not parts:
            field = f"GenerateContentRequest.contents[{i}].parts"
            return f"* {field}: contents.parts must not be empty.\n"
        responses = sum(1 for p in parts if "functionResponse" in p)
        if responses and previous_calls == 0:
            return (
                "Please ensure that function response turn comes immediately after a function "
                "call turn."
            )
        if responses and responses != previous_calls:
            return (
                "Please ensure that the number of function response parts is equal to the number "
                "of function call parts of the function call turn."
            )
        previous_calls = sum(1 for p in parts if "functionCall" in p)
    return None


class FakeGeminiServer(FakeServerBase):
    """Gemini API and Vertex AI ``generateContent`` / ``countTokens`` on 127.0.0.1.

    Same knobs as the OpenAI fake: ``window`` (input tokens), ``counter``,
    ``responder`` (replies in OpenAI assistant form, converted to ``parts``),
    ``latency`` and ``faults``. Output is capped by ``maxOutputTokens`` when the
    request sets it (``finishReason`` MAX_TOKENS), as Gemini does.
    """

    def __init__(
        self,
        *,
        window: int = 1_048_576,
        responder: Responder | Script | list[Any] | None = None,
        counter: PromptCounter | None = None,
        latency: float = 0.0,
        require_auth: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if window < 1:
            raise InvalidInput("must be >= 1", field="window")
        super().__init__(responder=responder, latency=latency, host=host, port=port)
        self.window = window
        self.counter: PromptCounter = counter if counter is not None else default_counter()
        self.require_auth = require_auth

    def http_options(self, timeout_ms: int | None = None, api_version: str | None = None) -> Any:
        """``google.genai.types.HttpOptions`` pointing the SDK here (the SDK's default: no retries).

        ``api_version`` forces e.g. ``"v1beta"``; by default the SDK picks (``v1beta`` or
        ``v1`` for the Gemini API depending on its version, ``v1beta1`` for Vertex).
        """
        from google.genai import types

        return types.HttpOptions(
            base_url=self.base_url, timeout=timeout_ms, api_version=api_version
        )

    @staticmethod
    def credentials() -> Any:
        """OAuth credentials for Vertex mode that never refresh: a fixed token, no expiry."""
        from google.oauth2.credentials import Credentials

        return Credentials(token=FAKE_TOKEN)  # type: ignore[no-untyped-call]

    # -- routing ---------------------------------------------------------------
    def route(self, exchange: Exchange) -> Outcome:
        match = GEMINI_PATH.match(exchange.path) if exchange.method == "POST" else None
        vertex = VERTEX_PATH.match(exchange.path) if exchange.method == "POST" else None
        found = match or vertex
        if found is None:
            return gemini_error(404, f"Method not found: {exchange.method} {exchange.path}",
                                "NOT_FOUND")
        exchange.flavor = "vertex" if vertex else "gemini"
        exchange.model = found["model"]
        has_key = bool(exchange.headers.get("x-goog-api-key")) or "key=" in exchange.query
        has_token = exchange.headers.get("authorization", "").startswith("Bearer ")
        if self.require_auth and not (has_key or has_token):
            if vertex:
                return gemini_error(401, UNAUTHENTICATED, "UNAUTHENTICATED")
            return gemini_error(403, UNREGISTERED, "PERMISSION_DENIED")
        try:
            body = json.loads(exchange.raw)
        except ValueError:
            body = None
        exchange.parsed = body
        if found["method"] == "countTokens":
            return self._count(body)
        return self._generate(exchange, body)

    def _count(self, body: Any) -> Outcome:
        if isinstance(body, dict) and isinstance(body.get("generateContentRequest"), dict):
            body = body["generateContentRequest"]
        invalid = validate_contents(body)
        if invalid is not None:
            return gemini_error(400, invalid, "INVALID_ARGUMENT")
        assert isinstance(body, dict)
        return json_outcome(200, {"totalTokens": self.counter(*contents_as_messages(body))})

    # -- faults ----------------------------------------------------------------
    def error_outcome(
        self, fault: Fault, exchange: Exchange, message: str | None = None
    ) -> Outcome:
        if fault.kind == "rate_limit":
            delay = math.ceil(fault.seconds)
            headers = {"retry-after": str(delay)}
            if exchange.flavor == "vertex":
                text = message or (
                    "Resource exhausted. Please try again later. Please refer to "
                    "https://cloud.google.com/vertex-ai/generative-ai/docs/error-code-429 for "
                    "more details."
                )
                return gemini_error(429, text, "RESOURCE_EXHAUSTED", headers=headers)
            text = message or (
                "You exceeded your current quota, please check your plan and billing details. "
                "For more information on this error, head to: "
                "https://ai.google.dev/gemini-api/docs/rate-limits."
            )
            retry = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{delay}s"}
            return gemini_error(429, text, "RESOURCE_EXHAUSTED", [retry], headers)
        if fault.kind in ("unavailable", "overloaded"):
            return gemini_error(503, message or "The model is overloaded. Please try again later.",
                                "UNAVAILABLE")
        if fault.kind == "http_error" and fault.status is not None:
            return Outcome(fault.status, (fault.body or "").encode())
        return gemini_error(
            500, message or "An internal error has occurred. Please retry or report in "
            "https://developers.generativeai.google/guide/troubleshooting", "INTERNAL",
        )

    not_completion_body: Any = {"promptFeedback": {"blockReason": "OTHER"}}

    # -- generateContent -------------------------------------------------------
    def _generate(self, exchange: Exchange, body: Any) -> Outcome:
        fault, early = self.take_fault(exchange)
        if early is not None:
            return early
        invalid = validate_contents(body)
        if invalid is not None:
            return gemini_error(400, invalid, "INVALID_ARGUMENT")
        assert isinstance(body, dict)
        prompt = self.counter(*contents_as_messages(body))
        exchange.prompt_tokens = prompt
        if prompt > self.window:
            return gemini_error(400, overflow_message(prompt, self.window), "INVALID_ARGUMENT")
        config = body.get("generationConfig") or {}
        max_tokens = config.get("maxOutputTokens") if isinstance(config, dict) else None
        max_tokens = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else None
        if fault is not None and fault.kind in ("refusal", "empty", "endless"):
            reply: Reply | Outcome = apply_content_fault({}, fault, max_tokens)
        else:
            reply = self.reply_or_outcome(exchange, body, max_tokens)
        if isinstance(reply, Outcome):
            return reply
        return json_outcome(200, self._response(exchange, prompt, reply, max_tokens))

    def _response(
        self, exchange: Exchange, prompt: int, reply: Reply, max_tokens: int | None
    ) -> dict[str, Any]:
        text = reply.get("content") or ""
        calls = reply.get("tool_calls") or []
        used = reply.get("completion_tokens") or completion_tokens(
            self.counter, generated_text(reply)
        )
        finish = FINISH.get(str(reply.get("finish_reason") or "stop"), "STOP")
        if max_tokens is not None and used > max_tokens and text:
            text, used, finish, calls = text[: max_tokens * 4], max_tokens, "MAX_TOKENS", []
        parts: list[dict[str, Any]] = [{"text": text}] if text else []
        parts += [
            {"functionCall": {"name": c["function"]["name"],
                              "args": json.loads(c["function"]["arguments"] or "{}")}}
            for c in calls
        ]
        content: dict[str, Any] = {"role": "model"}
        if parts:
            content["parts"] = parts
        usage: dict[str, Any] = {
            "promptTokenCount": prompt,
            "candidatesTokenCount": used,
            "totalTokenCount": prompt + used,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
        }
        response: dict[str, Any] = {
            "candidates": [{"content": content, "finishReason": finish, "index": 0}],
            "usageMetadata": usage,
            "modelVersion": exchange.model,
            "responseId": uuid.uuid4().hex[:22],
        }
        if exchange.flavor == "vertex":
            usage["trafficType"] = "ON_DEMAND"
            response["createTime"] = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        return response


__all__ = ["FAKE_TOKEN", "FakeGeminiServer", "contents_as_messages", "gemini_error"]
