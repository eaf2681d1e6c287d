"""Summarizer models behind the ``LLMClient`` protocol.

- :class:`OpenAIClient`: OpenAI and any OpenAI-compatible endpoint
  (``base_url``: vLLM, Ollama, OpenRouter, LiteLLM, Azure OpenAI's v1
  endpoint) through the ``openai`` SDK.
- :class:`GeminiClient`: Gemini through ``google-genai``, in Vertex AI mode
  (``vertexai=True`` with project and location) or API-key mode.
  google-genai is the successor of ``vertexai.generative_models`` from
  google-cloud-aiplatform, which is deprecated (removal announced for
  June 2026).

Celery owns retries (backoff with jitter): the SDKs' own retries are off,
and every call ends within the client timeout, because the threads pool
enforces no time limit. The SDKs' timeouts bound each socket operation, so a
reply trickled in slowly would outlive them: both clients send through an
httpx client whose transport bounds the whole call
(:mod:`workers.summarizer.deadline`); its ``ReadTimeout`` is a retried
``SummarizerUnavailable`` like any timeout. Errors are mapped onto the project's tree by what
retrying would do:

- ``SummarizerUnavailable`` (retried later): timeouts, connection errors,
  HTTP 408, 429 and 5xx, and a body that is not a completion at all (cut
  JSON, a proxy's page served with status 200), which is a transport fault;
- ``SummarizerOverflow`` (the engine splits the range smaller): the
  request overflowed the summarizer's own window, whatever the status
  (``shared.core.overflow`` reads the error; rate limits are never taken for it);
- ``BadSummary``: a reply cut off at its token cap (at temperature 0 the
  same request runs into the cap again);
- ``SummarizerError`` for the rest (400, 401, 403, 404...): the request or
  the configuration is wrong, and the same call would fail the same way,
  so the job falls back to the offline summarizer at once.

Each error is tagged (:mod:`workers.summarizer.failures`) with its bounded
class (``rate_limited``, ``server_error``, ``timeout``, ...), the HTTP status
and the wait the provider asked for (``retry-after-ms`` / ``Retry-After``
headers; a Google ``RetryInfo`` ``retryDelay``), which the task honours
before its retry. The SDKs' own retries are off (``max_retries=0``,
``HttpRetryOptions(attempts=1)``): one summarizer call is one HTTP request,
and only Celery retries.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from shared.core.errors import BadSummary, ConfigError, SummarizerError, SummarizerUnavailable
from shared.core.limits import model_limits
from shared.core.overflow import parse_overflow
from workers.summarizer.deadline import deadline_http_client
from workers.summarizer.engine import Completion, LLMClient, SummarizerOverflow
from workers.summarizer.failures import (
    status_class,
    tag,
    wait_from_headers,
    wait_from_retry_info,
)

NORMAL_STOPS = frozenset({"stop", "eos", "eos_token", "end_turn", "stop_sequence", None})
"""OpenAI-compatible finish reasons of a reply that ended by itself (``None``: a server
that does not say); any other (``content_filter``, ``tool_calls``, ...) leaves a partial
reply, never stored as a summary."""
SDK_RETRIES = 0


def _transient_status(status: int | None) -> bool:
    return status is not None and (status == 429 or status == 408 or status >= 500)


def status_error(name: str, status: int | None, message: str,
                 error: BaseException, *, retry_after: float | None = None) -> SummarizerError:
    """The project's error for an HTTP error answer of the summarizer (see the module doc),
    tagged with its class, ``status`` and the wait the provider asked (``retry_after``)."""
    text = f"{name}: HTTP {status}: {message}"
    overflow = parse_overflow(error)
    if overflow is not None:
        return tag(SummarizerOverflow(text, limit=overflow.limit,
                                      requested=overflow.prompt_tokens or overflow.requested),
                   "context_overflow", status=status)
    if _transient_status(status):
        if retry_after is not None:
            text += f" (asked to retry after {retry_after:g} s)"
        return tag(SummarizerUnavailable(text), status_class(status), status=status,
                   retry_after=retry_after)
    return tag(SummarizerError(text), status_class(status), status=status)


def _finish_class(finish: str) -> str:
    """The error class of a reply that did not end normally."""
    upper = finish.upper()
    if upper.endswith(("LENGTH", "MAX_TOKENS")):
        return "truncated"
    if any(word in upper for word in ("FILTER", "SAFETY", "RECITATION", "BLOCKLIST",
                                      "PROHIBITED", "SPII")):
        return "content_filter"
    return "bad_summary"


def _openai_httpx() -> ModuleType:
    """The httpx flavour the installed openai SDK sends through (httpx2 from openai 3 on).

    Read from the SDK's own client class, not from what is importable: google-genai 3
    installs httpx2 beside an openai 2 that takes only an ``httpx.Client``."""
    import openai

    base = openai.DefaultHttpxClient.__mro__[1]  # httpx.Client or httpx2.Client
    return importlib.import_module(base.__module__.partition(".")[0])


class OpenAIClient:
    """Chat Completions on any OpenAI-compatible server.

    ``http_client``: an ``httpx.Client`` of the caller's (proxies, custom
    TLS); it is used as given, so the whole-call deadline is then the
    caller's to set (wrap its transport in ``DeadlineTransport``). By
    default each call ends within about ``timeout`` seconds.
    """

    name = "openai"

    def __init__(self, model: str, *, api_key: str | None = None, base_url: str | None = None,
                 timeout: float = 60.0, context_window: int | None = None,
                 http_client: Any = None) -> None:
        try:
            import openai
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigError("COMPACTION_SUMMARIZER=openai needs the 'openai' extra: "
                              "pip install 'context-compaction[openai]'") from exc
        from openai.types.chat import ChatCompletion

        self._openai = openai
        self._completion_type = ChatCompletion
        self.model = model
        self.context_window = context_window or model_limits(model).context_window
        self.client = openai.OpenAI(api_key=api_key or "unused", base_url=base_url,
                                    timeout=timeout, max_retries=SDK_RETRIES,
                                    http_client=http_client or deadline_http_client(
                                        timeout, _openai_httpx()))

    def complete(self, messages: list[dict[str, Any]], max_output_tokens: int) -> Completion:
        openai = self._openai
        body = {"model": self.model, "messages": messages, "max_tokens": max_output_tokens,
                "temperature": 0}
        try:
            # The SDK's documented request method for a body built by hand, not
            # ``chat.completions.create``: create() first walks the whole body
            # against its TypedDict params (``maybe_transform``), ~0.5 ms of
            # GIL-holding CPU for a 40 kB summary request, which changes nothing
            # in a body of plain strings. Same URL, body, headers, timeouts,
            # error classes and parsed ChatCompletion (tests/test_adapters.py).
            response = self.client.post("/chat/completions", body=body,
                                        cast_to=self._completion_type)
        except openai.APITimeoutError as exc:  # before its base class, APIConnectionError
            raise tag(SummarizerUnavailable(f"{self.name}: {type(exc).__name__}: {exc}"),
                      "timeout") from exc
        except openai.APIConnectionError as exc:
            raise tag(SummarizerUnavailable(f"{self.name}: {type(exc).__name__}: {exc}"),
                      "connection") from exc
        except openai.APIStatusError as exc:
            raise status_error(self.name, exc.status_code, exc.message, exc,
                               retry_after=wait_from_headers(exc.response.headers)) from exc
        except (openai.OpenAIError, ValueError) as exc:  # garbage bodies (JSONDecodeError)
            raise tag(SummarizerUnavailable(f"{self.name}: {type(exc).__name__}: {exc}"),
                      "bad_response") from exc
        choices = getattr(response, "choices", None)
        if not choices:
            raise tag(SummarizerUnavailable(f"{self.name}: reply without choices"),
                      "bad_response")
        choice = choices[0]
        if choice.finish_reason == "length":
            raise tag(BadSummary(f"{self.name}: summary cut off at max_tokens"), "truncated")
        if choice.finish_reason not in NORMAL_STOPS:
            raise tag(BadSummary(f"{self.name}: the reply ended with finish_reason "
                                 f"{choice.finish_reason!r}, not a normal stop (partial)"),
                      _finish_class(str(choice.finish_reason)))
        usage = response.usage
        return Completion(text=choice.message.content or "",
                          input_tokens=usage.prompt_tokens if usage else 0,
                          output_tokens=usage.completion_tokens if usage else 0,
                          model=response.model or self.model)


class GeminiClient:
    """Gemini through google-genai: Vertex AI (project/location) or an API key.

    google-genai takes an ``httpx.Client`` in ``HttpOptions.httpx_client``
    and sends every synchronous call through it, so the whole-call deadline
    applies as for OpenAI. One consequence: with an injected client,
    google-genai does not use its mTLS channel (Vertex AI with a client
    certificate, ``GOOGLE_API_USE_CLIENT_CERTIFICATE``); such a deployment
    passes ``whole_call_deadline=False`` and keeps only the per-operation
    timeout (a trickled reply can then outlive it).
    """

    name = "gemini"

    def __init__(self, model: str, *, vertexai: bool, project: str | None = None,
                 location: str | None = None, api_key: str | None = None,
                 timeout: float = 60.0, base_url: str | None = None,
                 credentials: Any = None, context_window: int | None = None,
                 whole_call_deadline: bool = True) -> None:
        try:
            from google import genai
            from google.genai import types
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigError("COMPACTION_SUMMARIZER=vertex needs the 'vertex' extra: "
                              "pip install 'context-compaction[vertex]'") from exc
        self._types = types
        self.model = model
        self.context_window = context_window or model_limits(model).context_window
        options = types.HttpOptions(
            timeout=int(timeout * 1000), base_url=base_url,
            retry_options=types.HttpRetryOptions(attempts=1),
            httpx_client=deadline_http_client(timeout) if whole_call_deadline else None)
        try:  # google-genai checks its arguments here (ValueError): a setting is wrong
            if vertexai:
                self.client = genai.Client(vertexai=True, project=project, location=location,
                                           credentials=credentials, http_options=options)
            else:
                self.client = genai.Client(api_key=api_key, http_options=options)
        except ValueError as exc:
            mode = ("COMPACTION_VERTEX_PROJECT / _LOCATION" if vertexai else
                    "COMPACTION_SUMMARIZER_API_KEY (or GOOGLE_API_KEY / GEMINI_API_KEY)")
            raise ConfigError(f"google-genai refused the summarizer's configuration, "
                              f"check {mode}: {exc}") from exc

    def complete(self, messages: list[dict[str, Any]], max_output_tokens: int) -> Completion:
        from google.genai import errors

        types = self._types
        system = "\n\n".join(str(m["content"]) for m in messages if m["role"] == "system")
        contents = [types.Content(role="model" if m["role"] == "assistant" else "user",
                                  parts=[types.Part(text=str(m["content"]))])
                    for m in messages if m["role"] != "system"]
        config = types.GenerateContentConfig(system_instruction=system or None,
                                             max_output_tokens=max_output_tokens,
                                             temperature=0)
        try:
            response = self.client.models.generate_content(
                model=self.model, contents=contents, config=config)
        except errors.APIError as exc:
            wait = wait_from_retry_info(exc.details)
            if wait is None:
                wait = wait_from_headers(getattr(exc.response, "headers", None))
            raise status_error(self.name, exc.code, str(exc.message), exc,
                               retry_after=wait) from exc
        except Exception as exc:  # httpx timeouts, connection errors, bad bodies
            raise tag(SummarizerUnavailable(f"{self.name}: {type(exc).__name__}: {exc}"),
                      _transport_class(exc)) from exc
        candidates = response.candidates or []
        finish = str(candidates[0].finish_reason or "") if candidates else ""
        if finish.endswith("MAX_TOKENS"):
            raise tag(BadSummary(f"{self.name}: summary cut off at max_output_tokens"),
                      "truncated")
        if finish and not finish.endswith("STOP"):  # SAFETY, RECITATION, ... with partial text
            raise tag(BadSummary(f"{self.name}: the reply ended with finishReason {finish}, "
                                 "not STOP (partial)"), _finish_class(finish))
        usage = response.usage_metadata
        return Completion(text=response.text or "",
                          input_tokens=(usage.prompt_token_count or 0) if usage else 0,
                          output_tokens=(usage.candidates_token_count or 0) if usage else 0,
                          model=self.model)


def _transport_class(exc: BaseException) -> str:
    """The class of a failure below HTTP (google-genai lets httpx's exceptions through)."""
    import httpx

    if isinstance(exc, (httpx.TimeoutException, TimeoutError)):
        return "timeout"
    if isinstance(exc, (httpx.TransportError, ConnectionError)):
        return "connection"
    return "bad_response"


def client_from_settings(settings: Any) -> LLMClient | None:
    """The configured summarizer model, or None for the offline summarizer."""
    key = settings.summarizer_api_key.get_secret_value() if settings.summarizer_api_key else None
    if settings.summarizer == "offline":
        return None
    if settings.summarizer == "openai":
        return OpenAIClient(settings.summarizer_model_name, api_key=key,
                            base_url=settings.summarizer_base_url,
                            timeout=settings.summarizer_timeout)
    return GeminiClient(settings.summarizer_model_name, vertexai=settings.summarizer == "vertex",
                        project=settings.vertex_project, location=settings.vertex_location,
                        api_key=key, timeout=settings.summarizer_timeout,
                        base_url=settings.summarizer_base_url)


__all__ = ["GeminiClient", "OpenAIClient", "client_from_settings", "status_error"]
