"""The read that the guard's own append makes unnecessary (pure, no I/O).

After ``record_turn`` the next ``prepare`` used to read the session again,
only to get back the turn it had just written. The append's reply already
says everything that read would: the log length and token total before the
batch, the state hash and the pending flag after it. When those show that the cached view is
still the view just before the batch (same epoch, log generation, version,
watermark and cheap-stage generation; the log ended where the cache ends, by
the append the cache knows ended it: the state's ``tail``, since a failover
can lose that append and another writer's batch of as many tokens take its place),
:func:`appended_read` builds the read's result from the batch itself, and
:func:`shared.core.viewcache.decode_view` extends the cache with it as with
any incremental read. When anything else changed, it returns None and the
guard reads as before. Whether the next call may skip its read altogether is
for :mod:`shared.store.own_writes` to vouch.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from shared.core.records import AppendResult, RawView
from shared.core.viewcache import CachedView


def appended_read(cached: CachedView, batch: Sequence[tuple[str | bytes, int]],
                  result: AppendResult) -> RawView | None:
    """What an incremental read against ``cached`` returns right after the append of
    ``batch`` (stored JSON, store token count) that answered ``result``; None when
    the reply shows that the view changed otherwise (or says too little)."""
    state = result.state_raw
    if state is None or result.duplicate or not batch:
        return None
    if (result.length != cached.end + len(batch) or result.tokens_before != cached.total
            or state.get("epoch", "") != cached.epoch
            or int(state.get("gen") or 0) != cached.gen
            or int(state.get("version") or 0) != cached.version
            or int(state.get("watermark") or 0) != cached.start
            or state.get("cheap_gen", "") != cached.cheap_gen
            or (result.tail_before is not None and cached.end > 0
                and result.tail_before != cached.tail)):
        return None
    totals = list(itertools.accumulate((tokens for _, tokens in batch), initial=cached.total))
    stored = [raw if isinstance(raw, bytes) else raw.encode() for raw, _ in batch]
    return RawView(
        state_raw=dict(state), messages=stored, start=cached.end,
        tokens_before_watermark=cached.tokens_before, tokens_total=totals[-1],
        length=result.length, summary_json=None, summary_included=False, cheap_raw={},
        pending=result.pending if result.pending is not None else (cached.pending
                                                                   or result.marked),
        incremental=True,
        totals=totals if cached.end > 0 else totals[1:], cheap_included=False)


__all__ = ["appended_read"]
