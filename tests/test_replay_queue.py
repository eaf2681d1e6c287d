"""compaction replay keeps to COMPACTION_QUEUE: a replay on a shared broker must neither
take the production queue's jobs (its workers run a fake summarizer) nor leave its own
jobs, warm-up included, for production workers."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from shared.enqueue import QUEUE, TASK_MAYBE_SUMMARIZE, publisher_app
from tests.replay_support import synthetic_session, write_jsonl
from workers.harness.replay.run import ReplayOptions, run_replay
from workers.harness.stack.worker_process import WorkerProcess
from workers.settings import load_settings
from workers.urls import with_db


@pytest.fixture
def broker(own_redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(with_db(own_redis_url, 10))
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def test_a_worker_listens_on_the_queue_it_is_given() -> None:
    command = WorkerProcess("w", {}, queue="replayq").command()
    assert command[command.index("-Q") + 1] == "replayq"
    default = WorkerProcess("w", {}).command()
    assert default[default.index("-Q") + 1] == QUEUE


@pytest.mark.celery
@pytest.mark.slow
def test_configured_replay_keeps_to_its_queue(tmp_path: Path, own_redis_url: str,
                                              broker: redis.Redis) -> None:
    queue = "replayq" + secrets.token_hex(3)
    broker_url = with_db(own_redis_url, 10)
    production = publisher_app(broker_url, timeout=2.0)  # a production job, queued before
    production.send_task(TASK_MAYBE_SUMMARIZE, args=["prod-session"],
                         kwargs={"tenant": "prod"}, queue=QUEUE, ignore_result=True)
    settings = load_settings(redis_url=with_db(own_redis_url, 9), broker_url=broker_url,
                             key_prefix="t" + secrets.token_hex(5), queue=queue)
    path = write_jsonl(tmp_path / "s.jsonl", [synthetic_session(30, 3)])
    report = run_replay(path, ReplayOptions(window=8000, drain_timeout=60,
                                            summarizer="offline"),
                        settings, base_env={"PATH": "/usr/bin:/bin"}, configured=True)
    jobs = [j for s in report.sessions for j in s.jobs]
    assert report.drained and jobs, (report.totals, report.worker_logs)
    left = broker.lrange(QUEUE, 0, -1)  # production's job untouched, nothing of the replay's
    assert len(left) == 1 and b"prod-session" in left[0], len(left)
