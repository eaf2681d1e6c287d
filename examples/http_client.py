"""An agent loop in "any language": only HTTP and JSON, against ``compaction serve``.

Each turn: ``prepare`` gives the view to send (OpenAI format here;
``anthropic`` and ``gemini`` work the same), the model is called, a
context-overflow error goes to ``recover`` for one retry with a harder
compacted view, and the turn is ``record``ed with the provider's usage.
Nothing here imports the project: port it to TypeScript, Go or curl as is
(docs/server.md has curl and TypeScript versions).

Offline by default: the server runs in this process (uvicorn on a free
port, sessions in fakeredis) and the model is the project's fake
OpenAI-compatible server, which enforces an 8k window.

    python examples/http_client.py [--turns 80]
    python examples/http_client.py --server http://127.0.0.1:8080 --token "$TOKEN" \\
        --provider https://api.openai.com/v1 --api-key "$OPENAI_API_KEY" --model gpt-4o-mini
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

SYSTEM = "You are a release assistant. Answer in one short paragraph."
TOKEN = "example-token-0123456789abcdef"


def agent_turn(server: httpx.Client, provider: httpx.Client, session: str, model: str,
               question: str) -> tuple[str, bool]:
    """One turn; returns the answer and whether an overflow was recovered."""
    user = {"role": "user", "content": question}
    figures = {"system_prompt": SYSTEM, "model": model, "max_tokens": 400, "pending": [user]}
    view = server.post(f"/v1/sessions/{session}/prepare", json=figures)
    view.raise_for_status()
    messages = view.json()["messages"]
    reply = provider.post("/chat/completions", json={"model": model, "messages": messages,
                                                     "max_tokens": 400})
    recovered = False
    if reply.status_code == 400:  # maybe a context overflow: ask the server
        retry = server.post(f"/v1/sessions/{session}/recover",
                            json={**figures, "error": reply.text, "status": 400}).json()
        if not retry["recovered"]:
            reply.raise_for_status()  # some other 400: the caller's problem
        recovered = True
        reply = provider.post("/chat/completions", json={
            "model": model, "messages": retry["view"]["messages"], "max_tokens": 400})
    reply.raise_for_status()
    body = reply.json()
    answer = body["choices"][0]["message"]
    server.post(f"/v1/sessions/{session}/record", json={
        "messages": [user, {"role": "assistant", "content": answer.get("content") or ""}],
        "usage": body.get("usage")}).raise_for_status()
    return answer.get("content") or "", recovered


@contextlib.contextmanager
def embedded_server() -> Iterator[str]:
    """``compaction serve``'s app in this process on a free port, sessions in fakeredis."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import fakeredis
    import uvicorn

    from shared import SessionStore
    from workers.server.app import create_app
    from workers.server.config import ServerConfig
    from workers.server.process import free_port

    app = create_app(ServerConfig(), SessionStore(fakeredis.FakeRedis()),
                     overrides={"gpt-4o-fake": 8192}, tokens={TOKEN: "examples"})
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextlib.contextmanager
def fake_provider() -> Iterator[str]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from workers.harness.fakes import FakeOpenAIServer

    def reply(request: dict[str, Any]) -> dict[str, Any]:
        asked = request["messages"][-1]["content"]
        return {"role": "assistant", "content": f"On '{asked[:40]}': " + "details " * 120}

    with FakeOpenAIServer(window=8192, responder=reply, model="gpt-4o-fake") as fake:
        yield fake.base_url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", help="a running `compaction serve` (default: embedded)")
    parser.add_argument("--token", default=TOKEN)
    parser.add_argument("--provider", help="OpenAI-compatible base URL (default: the fake)")
    parser.add_argument("--api-key", default="test")
    parser.add_argument("--model", default="gpt-4o-fake")
    parser.add_argument("--session", default="release-notes")
    parser.add_argument("--turns", type=int, default=80)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        server_url = args.server or stack.enter_context(embedded_server())
        provider_url = args.provider or stack.enter_context(fake_provider())
        server = stack.enter_context(httpx.Client(
            base_url=server_url, headers={"Authorization": f"Bearer {args.token}"}, timeout=30))
        provider = stack.enter_context(httpx.Client(
            base_url=provider_url, headers={"Authorization": f"Bearer {args.api_key}"},
            timeout=120))
        recoveries = 0
        for k in range(args.turns):
            _, recovered = agent_turn(server, provider, args.session, args.model,
                                      f"What changed in release 1.{k}?")
            recoveries += recovered
        stats = server.get(f"/v1/sessions/{args.session}/stats").json()
    print(f"{args.turns} turns, {stats['length']} messages stored, view at "
          f"{stats['usage_ratio']:.0%} of the input budget, watermark {stats['watermark']}, "
          f"{recoveries} overflow recoveries")


if __name__ == "__main__":
    main()
