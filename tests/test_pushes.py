"""Draining a RESP3 connection's pushes: one poll when none arrived, one read when some
did, and redis-py's own path for everything unusual (a reply cut short, a closed or
replaced connection), with the same pushes handed to the same handler either way."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import shared.store.pushes as pushes_module
from shared.store.pushes import Pushes


class Watched:
    """A tracking connection (BCAST on ``prefix``), its pushes collected, and spies on the
    two ways of reading them: one ``readv`` per read here, redis-py's ``can_read``."""

    def __init__(self, url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
        kwargs = redis.Redis.from_url(url).connection_pool.connection_kwargs
        self.conn = redis.Connection(host=kwargs.get("host", "127.0.0.1"),
                                     port=kwargs.get("port", 6379), db=kwargs.get("db", 0),
                                     protocol=3, socket_timeout=5)
        self.conn.connect()
        self.keys: list[bytes] = []
        self.conn._parser.set_invalidation_push_handler(
            lambda push: self.keys.extend(push[1] or [b"*"]))
        self.conn.send_command("CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", prefix)
        assert self.conn.read_response() == b"OK"
        self.pushes = Pushes(self.conn)
        self.reads = 0
        self.checks = 0
        real_readv, real_can_read = os.readv, self.conn.can_read

        def readv(fd: int, buffers: Any) -> int:
            self.reads += 1
            return real_readv(fd, buffers)

        def can_read(timeout: float = 0) -> bool:
            self.checks += 1
            return bool(real_can_read(timeout))

        monkeypatch.setattr(pushes_module.os, "readv", readv)
        monkeypatch.setattr(self.conn, "can_read", can_read)

    def settle(self, client: redis.Redis) -> None:
        """Wait until pushes sent before now have reached the socket (a round trip of
        the writer's, then a short pause: the server writes them in the same loop)."""
        client.ping()
        time.sleep(0.05)


@pytest.fixture
def watched(redis_url: str, key_prefix: str,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Watched]:
    w = Watched(redis_url, key_prefix + ":", monkeypatch)
    yield w
    w.conn.disconnect()


def test_nothing_waiting_is_one_poll_and_no_read(watched: Watched) -> None:
    for _ in range(5):
        watched.pushes.drain()
    assert (watched.reads, watched.checks, watched.keys) == (0, 0, [])


def test_pushes_that_arrived_are_read_at_once_and_handed_over(
        watched: Watched, real_redis: redis.Redis, key_prefix: str) -> None:
    names = [f"{key_prefix}:{{s}}:k{i}".encode() for i in range(20)]
    for name in names:  # twenty writes, twenty pushes
        real_redis.set(name, "v")
    watched.settle(real_redis)
    watched.pushes.drain()
    assert watched.keys == names
    assert watched.reads == 1 and watched.checks == 0  # one system call, not redis-py's
    watched.pushes.drain()
    assert watched.reads == 1 and watched.keys == names  # nothing twice


def test_a_push_cut_short_is_finished_by_redis_py(watched: Watched, real_redis: redis.Redis,
                                                  key_prefix: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"{key_prefix}:{{s}}:cut".encode()
    real_redis.set(name, "v")
    watched.settle(real_redis)
    counted = os.readv  # the fixture's spy (os is one module: patched there already)

    def first_bytes(fd: int, buffers: Any) -> int:  # a push split across two segments
        return counted(fd, [memoryview(buffers[0])[:7]])

    monkeypatch.setattr(pushes_module.os, "readv", first_bytes)
    watched.pushes.drain()
    assert watched.keys == [name] and watched.reads == 1 and watched.checks >= 1


def test_a_closed_connection_raises_as_redis_py_does(watched: Watched,
                                                     real_redis: redis.Redis) -> None:
    watched.conn.send_command("CLIENT", "ID")
    client_id = watched.conn.read_response()
    assert real_redis.client_kill_filter(_id=client_id) == 1
    watched.settle(real_redis)
    with pytest.raises(redis.ConnectionError):
        watched.pushes.drain()
    assert watched.reads == 1  # end of file on the one read: redis-py's path reports it


def test_a_replaced_socket_is_never_read_through_the_old_descriptor(
        watched: Watched, real_redis: redis.Redis, key_prefix: str) -> None:
    """After a reconnect the kept descriptor names another socket (the lowest free number is
    the old one's): only redis-py reads that."""
    fd = watched.conn._sock.fileno()
    watched.conn.disconnect()
    watched.conn.connect()
    assert watched.conn._sock.fileno() == fd
    watched.conn.send_command("PING")  # a reply waiting on the new socket
    time.sleep(0.05)
    watched.pushes.drain()
    assert watched.reads == 0 and watched.checks >= 1


def test_a_reply_other_than_a_push_is_dropped_as_before(watched: Watched,
                                                        real_redis: redis.Redis,
                                                        key_prefix: str) -> None:
    """A drain never held replies back (redis-py's path drops them too); the pushes around
    one still reach the handler."""
    name = f"{key_prefix}:{{s}}:around".encode()
    real_redis.set(name, "1")
    watched.settle(real_redis)
    watched.conn.send_command("PING")
    time.sleep(0.05)
    real_redis.set(name, "2")
    watched.settle(real_redis)
    watched.pushes.drain()
    assert watched.keys == [name, name] and watched.checks == 0
    watched.conn.send_command("PING")  # the connection is in step: the next reply is ours
    assert watched.conn.read_response() == b"PONG"


def test_an_error_reply_waiting_is_raised_as_redis_py_does(watched: Watched) -> None:
    """An error on a connection that should hold only pushes: raised (the feed then stops
    vouching and reconnects later), the connection closed."""
    watched.conn.send_command("GET")  # wrong number of arguments: an error reply
    time.sleep(0.05)
    with pytest.raises(redis.ResponseError):
        watched.pushes.drain()
    assert watched.reads == 1 and watched.conn._sock is None
