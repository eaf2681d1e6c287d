"""What the pool tests share: a forked child's calls on a pool it inherited."""

from __future__ import annotations

import os
from typing import Any

import redis


def child_after_release(pool: Any, held: Any) -> int:
    """Fork while ``held`` (a connection of ``pool``, a pool of one) is in use; the child
    releases it, takes the one connection, and asks for another: the exit status of the
    child, 0 when that last call failed on the pool's bound (it waited its turn), 1 when
    the release raised, 2 when the first call did, 4 when the last one failed otherwise
    (redis-py's 'Too many connections': a turn too many), 5 when it got a connection."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            pool.release(held)
            status = 2
            first = pool.get_connection()
            status = 5
            try:
                pool.get_connection()
            except redis.ConnectionError as exc:
                status = 0 if "no connection of the pool's 1" in str(exc) else 4
            pool.release(first)
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
