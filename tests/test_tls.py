"""The system over TLS (``rediss://``), as managed Redis services are reached.

A redis-server of the module's own with a certificate signed by a throwaway CA
(Debian's redis-server is built with TLS; one without it fails the module, never skips).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from shared.core.config import StoreConfig
from shared.enqueue import publisher_app, tls_verified
from shared.guard import AsyncContextGuard, ContextGuard
from shared.store.aio import AsyncSessionStore, connect_async
from shared.store.sessions import SessionStore, connect
from workers.harness.stack.redis_server import free_port, redis_binary
from workers.settings import Settings

TURN = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(args, cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """(port, CA certificate) of a TLS-only redis-server."""
    openssl, binary = shutil.which("openssl"), redis_binary()
    if openssl is None or binary is None:
        pytest.fail("the TLS tests need openssl and a redis-server binary")
    where = tmp_path_factory.mktemp("tls")
    _run(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
         "-out", "ca.crt", "-days", "2", "-subj", "/CN=compaction-test-ca", cwd=where)
    _run(openssl, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
         "-out", "server.csr", "-subj", "/CN=localhost", cwd=where)
    (where / "ext.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _run(openssl, "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
         "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "ext.cnf",
         cwd=where)
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", "server.crt", "--tls-key-file", "server.key",
         "--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no", "--save", "",
         "--appendonly", "no"], cwd=where, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    client = redis.Redis(port=port, ssl=True, ssl_ca_certs=str(where / "ca.crt"),
                         socket_connect_timeout=0.5)
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
    yield port, where / "ca.crt"
    process.terminate()
    process.wait(timeout=10)


def url(tls: tuple[int, Path], db: int = 0) -> str:
    return f"rediss://127.0.0.1:{tls[0]}/{db}?ssl_ca_certs={tls[1]}"


def views_seen(write: Any, read: Any, session: str, rounds: int = 20) -> int:
    """How many of ``rounds`` writes by one guard the other's next view holds."""
    seen = 0
    for _ in range(rounds):
        length = write.record_turn(session, TURN)
        seen += read(session).report.length == length
    return seen


def test_sync_guards_share_sessions_through_the_change_feed(tls_redis: tuple[int, Path],
                                                            key_prefix: str) -> None:
    config = StoreConfig(key_prefix=key_prefix)
    guards = [ContextGuard(SessionStore(connect(url(tls_redis), config), config),
                           overrides={"m": 100_000}) for _ in range(2)]
    assert guards[0].feed is not None
    guards[0].record_turn("s", TURN)
    guards[0].prepare("s", "sys", model="m")
    assert views_seen(guards[1], lambda s: guards[0].prepare(s, "sys", model="m"), "s") == 20
    client = guards[0].store.redis
    before = int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    for _ in range(20):  # nothing written: the feed vouches for the cached view
        guards[0].prepare("s", "sys", model="m")
    after = int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    assert after - before <= 1  # the info call's own connection aside, no view read


def test_the_async_guard_over_tls(tls_redis: tuple[int, Path], key_prefix: str) -> None:
    config = StoreConfig(key_prefix=key_prefix)
    writer = ContextGuard(SessionStore(connect(url(tls_redis), config), config))

    async def main() -> int:
        guard = AsyncContextGuard(AsyncSessionStore(connect_async(url(tls_redis), config),
                                                    config), overrides={"m": 100_000})
        await guard.warm_up()
        try:
            seen = 0
            for _ in range(10):
                length = writer.record_turn("s", TURN)
                view = await guard.prepare("s", "sys", model="m")
                seen += view.report.length == length
            return seen
        finally:
            await guard.aclose()

    assert asyncio.run(main()) == 10


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
