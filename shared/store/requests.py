"""What a compaction job was asked to do, as it waits in a session's ``dirty`` flag.

One line per request (:mod:`shared.store.lease`): encoded here, decoded
leniently (a flag written by an older version is a plain rerun).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class Request:
    """What one job was asked to do; left in the dirty flag when the lease is busy."""

    force: bool = False
    keep_recent: int | None = None
    manual: bool = False

    def encode(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def decode(cls, line: str) -> Request:
        """Anything unreadable (a flag from an older version: "1") is a plain rerun."""
        try:
            data = json.loads(line)
            keep = data.get("keep_recent")
            return cls(force=data.get("force") is True, manual=data.get("manual") is True,
                       keep_recent=keep if isinstance(keep, int) and not isinstance(keep, bool)
                       and keep >= 0 else None)
        except (ValueError, AttributeError):
            return cls()


def distinct(lines: list[str]) -> list[Request]:
    """The requests to run, each once, in arrival order; a plain rerun goes last."""
    seen = dict.fromkeys(map(Request.decode, lines or [""]))  # ordered, each once
    return sorted(seen, key=lambda r: r == Request())


__all__ = ["Request", "distinct"]
