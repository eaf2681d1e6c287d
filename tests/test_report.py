"""``compaction report``: a real session's page, opened in a real headless Chromium.

The session is made by the real guard on a real Redis with a worker's
compactor run inline for every job it enqueues (an LLM summarizer behind the
real OpenAI SDK, with an outage), plus a worker outage and an overflow
recovery, so every kind of event is on the page.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from shared.core.config import StoreConfig
from shared.enqueue import CallbackEnqueuer
from shared.store.sessions import SessionStore
from workers.cli.main import main
from workers.cli.report import collect, render, write_report
from workers.compactor import Compactor
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, demo_turns
from workers.harness.fakes.openai_server import FakeOpenAIServer
from workers.harness.fakes.summaries import SummarizerResponder
from workers.summarizer.engine import SummaryEngine
from workers.summarizer.providers import OpenAIClient

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SID = "r1"
OVERFLOW = ("This model's maximum context length is 12000 tokens. However, your messages "
            "resulted in 13500 tokens. Please reduce the length of the messages.")


def make_session(store: SessionStore, llm: FakeOpenAIServer,
                 make_guard: Callable[..., Any]) -> None:
    """60 turns, 16k window, an LLM summarizer (a fake OpenAI server behind the real SDK).

    The LLM is unreachable for turns 18-26 (the worker falls back to the offline
    summarizer, later rebuilt by the LLM), the worker is down for turns 38-45 (the
    guard truncates on its own meanwhile) and the provider rejects turn 40 (recovery,
    learned 12k window)."""
    client = OpenAIClient("gpt-4o-mini", api_key="k", base_url=llm.base_url, timeout=10)
    compactor = Compactor(store, SummaryEngine(client, counter=store.counter))
    worker_up, llm_up = [True], [True]

    def job(tenant: str, session_id: str) -> None:
        store.clear_pending(session_id)  # what the worker's claim does
        if worker_up[0]:
            compactor.run(session_id, use_llm=llm_up[0])

    guard = make_guard(store, CallbackEnqueuer(job), overrides={"gpt-4o": 16_000})
    for i, turn in enumerate(demo_turns(60)):
        worker_up[0] = not 38 <= i <= 45
        llm_up[0] = not 18 <= i <= 26
        guard.prepare(SID, SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
        if i == 40:
            assert guard.recover(SID, OVERFLOW, SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o",
                                 pending=turn[:1]) is not None
        guard.record_turn(SID, turn)


@pytest.fixture
def store(real_redis: redis.Redis, key_prefix: str,
          make_guard: Callable[..., Any]) -> SessionStore:
    store = SessionStore(real_redis, StoreConfig(key_prefix=key_prefix))
    with FakeOpenAIServer(responder=SummarizerResponder()) as llm:
        make_session(store, llm, make_guard)
    return store


def test_the_report_is_what_the_store_holds(store: SessionStore) -> None:
    report = collect(store, SID)
    records = store.summaries(SID)
    assert len(report.compactions) == len(records) >= 3
    assert {c.record.kind for c in report.compactions} == {"llm", "offline", "truncation"}
    assert report.messages[-1] == store.length(SID)
    assert len(report.sent) == len(report.log_tokens) == 60
    # the whole log at the end is the running total kept beside it
    assert report.log_tokens[-1] - report.fixed == store.range_tokens(SID, 0, store.length(SID))
    # compaction is what keeps the view inside the budget; the log alone is far over it
    assert report.over_window_without > 20
    assert max(report.sent) <= report.window
    assert report.saved > sum(report.log_tokens) // 2
    turns = [c.turn for c in report.compactions]
    assert turns == sorted(turns)
    for c in report.compactions:
        if c.record.kind != "truncation":
            assert c.after < c.before
    llm = [c.record for c in report.compactions if c.record.kind == "llm"]
    assert all(r.input_tokens > 0 and r.model for r in llm)
    assert report.state.learned_window == 12_000


def test_the_page_is_self_contained(store: SessionStore) -> None:
    page = render(collect(store, SID))
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page, re.I)
    assert "@import" not in page and "url(" not in page
    assert page.count("<svg") == 2
    assert page.count('class="compaction"') == len(store.summaries(SID))
    assert "learned window 12.0k" in page
    data = store.load_view(SID)
    assert f"{len(data.cheap)} (" in page.split("cheap-stage placeholders now", 1)[1][:80]


def test_the_cli_writes_it(store: SessionStore, key_prefix: str, redis_url: str,
                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COMPACTION_REDIS_URL", redis_url)
    monkeypatch.setenv("COMPACTION_KEY_PREFIX", key_prefix)
    monkeypatch.setattr("workers.cli.main.COMMANDS",
                        {"report": "A session's life on one HTML page."})
    out = tmp_path / "report.html"
    assert main(["report", SID, "-o", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert out.read_text().startswith("<!doctype html>")
    assert main(["report", "nope", "-o", str(out)]) == 1


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit PNG, decoded without Pillow."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8
            channels = {2: 3, 6: 4}[colour]
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw, stride, rows = zlib.decompress(idat), width * channels, []
    prev = bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, [bytes(r) for r in rows] if channels == 3 else [
        b"".join(r[i:i + 3] for i in range(0, len(r), 4)) for r in rows]


def screenshot(page: Path, out: Path, profile: Path) -> None:
    assert CHROMIUM is not None
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                    "--hide-scrollbars", "--window-size=1040,1500",
                    f"--screenshot={out}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_chromium_renders_the_charts(store: SessionStore, tmp_path: Path) -> None:
    page = write_report(store, SID, tmp_path / "report.html")
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                          "--disable-background-networking", "--disable-component-update",
                          "--disable-sync", "--no-first-run",
                          f"--user-data-dir={tmp_path / 'profile-dom'}", "--dump-dom",
                          page.as_uri()], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    assert dom.count("<polyline") == 4 and "Tokens sent against the window" in dom
    png = tmp_path / "report.png"
    screenshot(page, png, tmp_path / "profile")
    width, height, rows = png_pixels(png)
    assert (width, height) == (1040, 1500)
    # the "tokens sent" line (#1c6dd0) and the truncation markers (#d9480f) are drawn
    pixels = b"".join(rows)
    colours = {pixels[i:i + 3] for i in range(0, len(pixels), 3)}
    assert bytes.fromhex("1c6dd0") in colours
    assert bytes.fromhex("d9480f") in colours
    target = os.environ.get("COMPACTION_REPORT_SCREENSHOT")
    if target:  # regenerate docs/report.png: COMPACTION_REPORT_SCREENSHOT=docs/report.png
        shutil.copyfile(png, target)
