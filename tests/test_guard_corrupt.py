"""A log entry that is not a stored message: one clear error naming where it is."""

from __future__ import annotations

import fakeredis
import pytest

from shared.core.config import StoreConfig
from shared.core.errors import StoreError
from shared.store.sessions import SessionStore
from tests.guard_shells import SHELLS, make

SYSTEM = "be brief"
TURN = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(("entry", "why"), [(b"not json{", "not JSON"),
                                             (b"5", "not a JSON object with a role")])
def test_a_corrupt_entry_is_a_store_error_naming_its_position(
        key_prefix: str, shell: str, entry: bytes, why: str) -> None:
    client = fakeredis.FakeRedis()
    store = SessionStore(client, StoreConfig(key_prefix=key_prefix))
    store.append("s", TURN)
    warm = make(shell, store, overrides={"m": 100_000})
    warm.prepare("s", SYSTEM, model="m")
    store.append("s", TURN)
    client.lset(store.keys("s").log, 3, entry)  # written by another program
    for guard in (warm, make(shell, store, overrides={"m": 100_000})):  # read on, and cold
        with pytest.raises(StoreError, match=f"log entry #3 of this session .*{why}"):
            guard.prepare("s", SYSTEM, model="m")
    store.truncate_after("s", 3)  # what the message says to do
    assert len(warm.prepare("s", SYSTEM, model="m").messages) == 4
