"""The system over TLS (``rediss://``), as managed Redis services are reached.

A redis-server of the module's own with a certificate signed by a throwaway CA
(Debian's redis-server is built with TLS; one without it fails the module, never skips).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from shared.core.config import StoreConfig
from shared.enqueue import CeleryEnqueuer, publisher_app, redis_server, tls_verified
from shared.guard import AsyncContextGuard, ContextGuard
from shared.store.aio import AsyncSessionStore, connect_async
from shared.store.sessions import SessionStore, connect
from workers.cli.main import main
from workers.harness.demo_session import SYSTEM_PROMPT, TOOLS, demo_turns
from workers.harness.stack.redis_server import free_port, redis_binary
from workers.harness.stack.tls_files import make_tls_files
from workers.harness.stack.worker_process import WorkerProcess, purge_queue, worker_env
from workers.harness.timing import wait_for
from workers.settings import Settings
from workers.urls import with_db

TURN = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(args, cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway CA (also as a hashed CA directory), a server certificate for
    127.0.0.1, and a client certificate whose key is encrypted (pass phrase ``secret``)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("the TLS tests need openssl")
    where = make_tls_files(tmp_path_factory.mktemp("tls")).directory
    (where / "cadir").mkdir()
    shutil.copy(where / "ca.crt", where / "cadir" / "ca.crt")
    _run(openssl, "rehash", "cadir", cwd=where)
    return where


@contextlib.contextmanager
def _tls_server(where: Path, *, auth_clients: bool) -> Iterator[int]:
    """The port of a TLS-only redis-server (client certificates required or not)."""
    binary = redis_binary()
    if binary is None:
        pytest.fail("the TLS tests need a redis-server binary")
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", "server.crt", "--tls-key-file", "server.key",
         "--tls-ca-cert-file", "ca.crt", "--tls-auth-clients",
         "yes" if auth_clients else "no", "--save", "", "--appendonly", "no"],
        cwd=where, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    client = redis.Redis(port=port, ssl=True, ssl_ca_certs=str(where / "ca.crt"),
                         ssl_certfile=str(where / "client.crt"),
                         ssl_keyfile=str(where / "client.key"), socket_connect_timeout=0.5)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if process.poll() is not None:
                out = process.stdout.read().decode() if process.stdout else ""
                pytest.fail(f"redis-server refused its TLS options (built without TLS?): "
                            f"{out[-500:]}")
            time.sleep(0.05)
    else:
        pytest.fail("the TLS redis-server did not answer")
    client.close()
    try:
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def tls_redis(certs: Path) -> Iterator[tuple[int, Path]]:
    """(port, CA certificate) of a TLS-only redis-server."""
    with _tls_server(certs, auth_clients=False) as port:
        yield port, certs / "ca.crt"


@pytest.fixture(scope="module")
def mtls_url(certs: Path) -> Iterator[str]:
    """A store URL for a TLS-only redis-server that requires a client certificate: the
    CA as a directory (``ssl_ca_path``), the client key encrypted (``ssl_password``)."""
    with _tls_server(certs, auth_clients=True) as port:
        yield (f"rediss://127.0.0.1:{port}/0?ssl_ca_path={certs / 'cadir'}"
               f"&ssl_certfile={certs / 'client.crt'}&ssl_keyfile={certs / 'client-enc.key'}"
               f"&ssl_password=secret")


def url(tls: tuple[int, Path], db: int = 0) -> str:
    return f"rediss://127.0.0.1:{tls[0]}/{db}?ssl_ca_certs={tls[1]}"


def views_seen(write: Any, read: Any, session: str, rounds: int = 20) -> int:
    """How many of ``rounds`` writes by one guard the other's next view holds."""
    seen = 0
    for _ in range(rounds):
        length = write.record_turn(session, TURN)
        seen += read(session).report.length == length
    return seen


def evalsha_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def assert_feed_and_own_writes(guards: list[ContextGuard]) -> None:
    """Each guard's next view holds the other's turn; while nothing changes, and after
    the guard's own turns, a warm guard reads no view (the feed and the own-writes
    connection vouch for it): the feed is active, not read-every-call."""
    assert guards[0].feed is not None
    guards[0].record_turn("s", TURN)
    guards[0].prepare("s", "sys", model="m")
    assert views_seen(guards[1], lambda s: guards[0].prepare(s, "sys", model="m"), "s") == 20
    assert views_seen(guards[0], lambda s: guards[1].prepare(s, "sys", model="m"), "s") == 20
    client = guards[0].store.redis
    guards[0].prepare("s", "sys", model="m")
    before = evalsha_calls(client)
    for _ in range(20):  # nothing written: the feed vouches for the cached view
        guards[0].prepare("s", "sys", model="m")
    assert evalsha_calls(client) - before <= 2  # of 20 (a feed check timing out aside)
    before = evalsha_calls(client)
    for _ in range(10):  # the own-writes connection vouches after the guard's own turns
        guards[0].record_turn("s", TURN)
        guards[0].prepare("s", "sys", model="m")
    assert evalsha_calls(client) - before <= 10 + 2  # the appends (of 20 commands)


def test_sync_guards_share_sessions_through_the_change_feed(tls_redis: tuple[int, Path],
                                                            key_prefix: str) -> None:
    config = StoreConfig(key_prefix=key_prefix)
    assert_feed_and_own_writes([
        ContextGuard(SessionStore(connect(url(tls_redis), config), config),
                     overrides={"m": 100_000}) for _ in range(2)])


def test_the_feed_uses_every_tls_option_of_the_store(mtls_url: str, key_prefix: str) -> None:
    """A CA directory and a client key's pass phrase reach the feed's and the own-writes
    connections too (they kept only some ``ssl_*`` options: with these the feed failed,
    after OpenSSL asked for the pass phrase on the terminal, and the guard read on every
    call)."""
    config = StoreConfig(key_prefix=key_prefix)
    assert_feed_and_own_writes([
        ContextGuard(SessionStore(connect(mtls_url, config), config),
                     overrides={"m": 100_000}) for _ in range(2)])


def async_views(store_url: str, key_prefix: str) -> tuple[int, int]:
    """(how many of 10 turns of a sync guard the async guard's next view holds, how many
    view reads 20 idle async prepares made: none while the feed vouches)."""
    config = StoreConfig(key_prefix=key_prefix)
    writer = ContextGuard(SessionStore(connect(store_url, config), config))
    client = writer.store.redis

    async def main() -> tuple[int, int]:
        guard = AsyncContextGuard(AsyncSessionStore(connect_async(store_url, config),
                                                    config), overrides={"m": 100_000})
        await guard.warm_up()
        try:
            seen = 0
            for _ in range(10):
                length = writer.record_turn("s", TURN)
                view = await guard.prepare("s", "sys", model="m")
                seen += view.report.length == length
            await guard.prepare("s", "sys", model="m")
            before = evalsha_calls(client)
            for _ in range(20):
                await guard.prepare("s", "sys", model="m")
            return seen, evalsha_calls(client) - before
        finally:
            await guard.aclose()

    return asyncio.run(main())


def test_the_async_guard_over_tls(tls_redis: tuple[int, Path], key_prefix: str) -> None:
    seen, reads = async_views(url(tls_redis), key_prefix)
    assert seen == 10 and reads <= 2


def test_the_async_guard_with_a_client_certificate(mtls_url: str, key_prefix: str) -> None:
    seen, reads = async_views(mtls_url, key_prefix)
    assert seen == 10 and reads <= 2


def test_a_rediss_broker_checks_the_servers_certificate(tls_redis: tuple[int, Path]) -> None:
    """kombu connects to a bare ``rediss://`` broker without checking its certificate
    ("defaulting to insecure SSL behaviour"); redis-py, the store's client, checks it."""
    bare = f"rediss://127.0.0.1:{tls_redis[0]}/1"
    assert tls_verified(bare) == bare + "?ssl_cert_reqs=required"
    assert tls_verified(bare + "?ssl_cert_reqs=none") == bare + "?ssl_cert_reqs=none"
    assert Settings(broker_url=bare).broker_url == bare + "?ssl_cert_reqs=required"
    untrusted = publisher_app(bare, timeout=2.0)
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"), \
            untrusted.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1)
    trusted = publisher_app(url(tls_redis, 1), timeout=2.0)
    with trusted.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1)
        assert conn.connected


def test_doctor_over_tls_with_client_certificates(
        mtls_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Every check passes over TLS (no worker runs: that one fails), the change feed
    included, and the client key's pass phrase is never printed."""
    monkeypatch.setenv("COMPACTION_REDIS_URL", mtls_url.replace("/0?", "/3?"))
    monkeypatch.setenv("COMPACTION_BROKER_URL", mtls_url.replace("/0?", "/4?"))
    code = main(["doctor", "--timeout", "1", "--json"])
    out, err = capsys.readouterr()
    found = {c["name"]: c["verdict"] for c in json.loads(out)}
    assert code == 1 and found.pop("workers") == "FAIL", out
    assert set(found.values()) == {"OK"}, out
    assert "secret" not in out + err
    assert "ssl_password=***" in out
    main(["doctor", "--timeout", "1"])
    assert "secret" not in "".join(capsys.readouterr())


def test_a_bare_rediss_broker_raises_no_insecure_warning(
        tls_redis: tuple[int, Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """A ``rediss://`` broker URL without options is checked (ssl_cert_reqs=required is
    added), so kombu's "defaulting to insecure SSL behaviour" must not be printed; a
    certificate the system does not trust is one FAIL line per check."""
    bare = f"rediss://127.0.0.1:{tls_redis[0]}"
    monkeypatch.setenv("COMPACTION_REDIS_URL", f"{bare}/3")
    monkeypatch.setenv("COMPACTION_BROKER_URL", f"{bare}/4")
    code = main(["doctor", "--timeout", "1"])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in out + err
    assert "insecure" not in out + err + caplog.text
    assert "FAIL broker" in out and "CERTIFICATE_VERIFY_FAILED" in out


@pytest.mark.celery
def test_a_worker_compacts_over_rediss_with_the_job_pushed_by_the_append(
        tls_redis: tuple[int, Path], key_prefix: str) -> None:
    """Store and broker on the same TLS server: the append script pushes each job (the
    publisher's own LPUSH is never called), and a real worker (threads pool) reached over
    ``rediss://`` only summarizes the session."""
    store_url, broker_url = url(tls_redis, 0), url(tls_redis, 1)
    purge_queue(broker_url)
    worker = WorkerProcess("tls", worker_env(broker_url=broker_url, redis_url=store_url,
                                             key_prefix=key_prefix)).start()
    config = StoreConfig(key_prefix=key_prefix)
    enqueuer = CeleryEnqueuer(publisher_app(broker_url))
    try:
        assert enqueuer.publisher is not None
        published: list[Any] = []  # jobs the publisher's own LPUSH wrote: none expected
        def lpush(*args: Any, **kwargs: Any) -> int:
            published.append(args)
            return 1

        enqueuer.publisher.client.lpush = lpush  # type: ignore[method-assign]
        store = SessionStore(connect(store_url, config), config)
        assert enqueuer.inline_job(store.tenant, "s", redis_server(store.redis)) is not None
        guard = ContextGuard(store, enqueuer, overrides={"gpt-4o": 24_000})
        for turn in demo_turns(30):
            view = guard.prepare("s", SYSTEM_PROMPT, TOOLS, 2000, "gpt-4o", pending=turn[:1])
            assert view.report.budget.within_budget
            guard.record_turn("s", turn)
            time.sleep(0.05)  # as tests/test_celery_worker.py: the worker runs in between
        assert wait_for(lambda: store.state("s").watermark > 0, 30), worker.log()[-3000:]
        assert wait_for(lambda: not store.is_pending("s"), 30)
        assert store.summaries("s")
        assert "compaction.maybe_summarize" in worker.log()
        assert "insecure" not in worker.log()
        # The append carries the job unless the change feed still vouches for a flag a
        # worker has just claimed (its push in flight): then the flag is set with no job
        # and the guard publishes it itself, as designed. Most jobs ride in the script.
        received = sum("maybe_summarize[" in line and "received" in line
                       for line in worker.log().splitlines())
        assert received > 2 * len(published), (received, len(published))
    finally:
        enqueuer.close()
        worker.stop()
        purge_queue(broker_url)


def test_the_demo_s_derived_broker_keeps_the_store_s_tls_options(mtls_url: str) -> None:
    """``compaction demo`` with only ``COMPACTION_REDIS_URL`` set puts the broker on the
    next database of that Redis (``with_db``): the CA, client certificate and key options
    must come along (they were dropped: the broker failed its certificate checks)."""
    broker = with_db(mtls_url, 1)
    client = redis.Redis.from_url(broker, socket_connect_timeout=2)
    try:
        assert client.ping() and client.connection_pool.connection_kwargs["db"] == 1
    finally:
        client.close()
    assert broker == mtls_url.replace("/0?", "/1?")
