"""Tool-call ids made unique per session, once, at the store boundary (sans-I/O).

Providers do not promise ids that are unique across a session: Gemini
omits them and :mod:`shared.core.wire.gemini` makes positional ones
(``gemini-<content>-<part>``) that repeat every turn; some OpenAI-compatible
servers number calls ``call_0`` per response. Pairing by a repeated id sends
cheap-stage placeholders to the wrong results and forces a full repair of
every view. So calls and their results get a session-unique stored id when
they are appended, and every later stage pairs by it for free.

- A call whose id the session has not seen keeps it (the common case costs
  nothing). A repeated one becomes ``<id>-r<nonce><n>`` (characters every
  provider accepts); the provider's id is kept in the message's metadata
  (``wire_ids``: stored id -> provider id).
- Gemini's synthetic (positional) ids are renamed always: they never go on
  the wire (the adapter pairs by name and order), so renaming them is free
  and needs no knowledge of the session.
- A result is paired with the newest call of its id: in the same batch if
  there, else the session's mapping (``known``).
- A Gemini result whose id was made up (the adapter's marker) is paired by function
  name, never by that positional id: with the newest unanswered call of its name in
  the batch, else the session's (``known`` under :func:`name_key`; the k-th call of a
  name in the newest message calling it), in order. A synthetic call is claimed under
  its name key, not its positional id, which another turn's made-up ids repeat.

The store checks the batch's assumptions atomically (``claims``): a call
id kept as is must be new to the session, a result's stored id must be
what the session maps its provider id to, and a batch renamed for a log
position (:func:`position_nonce`, the guard's pending turn) must land there.
A failed check returns the session's mapping and the batch is renamed again
(:func:`disambiguate`, with a random nonce).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.core.messages import Message

WIRE_IDS = "wire_ids"
SYNTHETIC_KEY = "gemini_synthetic_ids"  # shared.core.wire.gemini.SYNTHETIC_KEY
SIGNATURES_KEY = "gemini_signatures"  # shared.core.wire.gemini.SIGNATURES_KEY: "call:<id>"
MAX_ID = 256


@dataclass(frozen=True, slots=True)
class Claims:
    """What a batch assumes about the session's ids, for the store to check.

    ``calls``: (provider id, stored id) of every call in the batch, in order;
    ``results``: (provider id, stored id) of results whose call is not in
    the batch; ``at_length``: the log length its renamed ids were made for, when
    their nonce is that position (a pending turn's, :func:`position_nonce`):
    unique only if the batch lands there.
    """

    calls: tuple[tuple[str, str], ...] = ()
    results: tuple[tuple[str, str], ...] = ()
    at_length: int | None = None

    def provider_ids(self) -> list[str]:
        return sorted({p for p, _ in self.calls} | {p for p, _ in self.results})


def position_nonce(length: int) -> str:
    """The nonce of ids renamed for a batch appended at log position ``length``: the
    same for every guard (a turn's prepares send the ids its append stores), unique in
    the session as long as the batch lands there (``Claims.at_length``); the ``p`` and
    ``_`` keep it apart from random hex nonces and from other positions."""
    return f"p{length}_"


def name_key(name: str, k: int) -> str:
    """The session mapping's key of the ``k``-th call of function ``name`` in the newest
    message calling it with made-up ids (Gemini's): what an unmatched Gemini result
    answers. Kept apart from positional ids (``gemini-<n>-<n>``) by the letters."""
    return f"gemini-fn{k}-{name}"


def _fresh(provider: str, nonce: str, n: int) -> str:
    tail = f"-r{nonce}{n}"
    return provider[: MAX_ID - len(tail)] + tail


class Renaming:
    """:func:`disambiguate` as a state that can be fed more messages: the pending turn
    of a tool chain grows by a call and its result per model call, and is renamed once
    per message, not once per call (:meth:`copy` before feeding a shared one)."""

    __slots__ = ("calls", "known", "latest", "n", "named", "nonce", "results", "taken",
                 "waiting")

    def __init__(self, nonce: str, known: Mapping[str, str] | None = None) -> None:
        self.nonce = nonce
        self.known: Mapping[str, str] = known or {}
        self.latest: dict[str, str] = {}  # provider id -> stored id, within the batch
        # provider id -> stored ids of the newest calling message's calls of it not yet
        # answered, in order: one message calling an id twice gets its results in order
        self.waiting: dict[str, list[str]] = {}
        self.calls: list[tuple[str, str]] = []
        self.results: list[tuple[str, str]] = []
        self.n = 0
        # function name -> (provider id, stored id) of the newest calling message's calls
        # of it not yet answered, in order: where a made-up Gemini result goes first
        self.named: dict[str, list[tuple[str, str]]] = {}
        self.taken: dict[str, int] = {}  # function name -> name keys this batch answered

    def copy(self) -> Renaming:
        other = Renaming(self.nonce, self.known)
        other.latest, other.calls, other.results = dict(self.latest), list(self.calls), \
            list(self.results)
        other.waiting = {p: list(q) for p, q in self.waiting.items()}
        other.named = {f: list(q) for f, q in self.named.items()}
        other.n, other.taken = self.n, dict(self.taken)
        return other

    def claims(self) -> Claims:
        return Claims(tuple(self.calls), tuple(self.results))

    def feed(self, messages: Sequence[Message]) -> list[Message]:
        """The messages with session-unique call ids (the same objects where unchanged)."""
        return [self._one(message) for message in messages]

    def _one(self, message: Message) -> Message:
        known, latest = self.known, self.latest
        if message.tool_calls:
            synthetic = message.metadata.get(SYNTHETIC_KEY)
            synthetic = synthetic if isinstance(synthetic, list) else []
            renamed: dict[str, str] = {}
            new_calls = []
            calling: dict[str, list[str]] = {}
            named: dict[str, list[tuple[str, str]]] = {}
            for call in message.tool_calls:
                p = call.id
                if p in synthetic or p in known or p in latest:
                    stored = _fresh(p, self.nonce, self.n)
                    self.n += 1
                    renamed[stored] = p
                    new_calls.append(call.model_copy(update={"id": stored}))
                else:
                    stored = p
                    new_calls.append(call)
                latest[p] = stored
                calling.setdefault(p, []).append(stored)
                same = named.setdefault(call.name, [])
                # a made-up id is claimed by name (results find it so), not by position
                self.calls.append((name_key(call.name, len(same)) if p in synthetic else p,
                                   stored))
                same.append((p, stored))
            self.waiting.update(calling)
            self.named.update(named)
            if renamed:
                meta = dict(message.metadata)
                meta[WIRE_IDS] = {**meta.get(WIRE_IDS, {}), **renamed}
                if synthetic:
                    meta[SYNTHETIC_KEY] = [*synthetic, *(s for s, p in renamed.items()
                                                         if p in synthetic)]
                signed = meta.get(SIGNATURES_KEY)
                if isinstance(signed, dict):  # a call's thought signature follows its id
                    keys = {f"call:{p}": f"call:{s}" for s, p in renamed.items()}
                    meta[SIGNATURES_KEY] = {keys.get(k, k): v for k, v in signed.items()}
                message = message.model_copy(update={"tool_calls": new_calls, "metadata": meta})
        elif message.role == "tool" and message.tool_call_id:
            p = message.tool_call_id
            queue = self.waiting.get(p)
            if message.name and message.metadata.get(SYNTHETIC_KEY) is True:
                stored = self._by_name(message.name)
            elif queue:
                stored = queue.pop(0)
                self._answered(message.name, stored)
            elif p in latest:
                stored = latest[p]
            else:
                stored = known.get(p, p)
                self.results.append((p, stored))
            if stored != p:
                meta = dict(message.metadata)
                meta[WIRE_IDS] = {stored: p}
                message = message.model_copy(update={"tool_call_id": stored, "metadata": meta})
        return message

    def _by_name(self, name: str) -> str:
        """The stored id a made-up Gemini result of function ``name`` answers: the newest
        unanswered call of that name in the batch, else the session's (``known``), in
        order: the first name key the session maps that this batch has not answered."""
        queue = self.named.get(name)
        if queue:
            p, stored = queue.pop(0)
            waiting = self.waiting.get(p)
            if waiting and stored in waiting:
                waiting.remove(stored)
            return stored
        k = self.taken.get(name, 0)
        while name_key(name, k) not in self.known and any(
                name_key(name, j) in self.known for j in range(k + 1, k + 16)):
            k += 1  # an earlier call of the name was answered before this batch
        key = name_key(name, k)
        self.taken[name] = k + 1
        stored = self.known.get(key, key)
        self.results.append((key, stored))
        return stored

    def _answered(self, name: str | None, stored: str) -> None:
        """Take an answered call out of its name's queue (a made-up result not to get it)."""
        queue = self.named.get(name or "")
        if queue:
            self.named[name or ""] = [e for e in queue if e[1] != stored]


def disambiguate(messages: Sequence[Message], nonce: str,
                 known: Mapping[str, str] | None = None) -> tuple[list[Message], Claims]:
    """The batch with session-unique call ids, and the claims the store must check.

    ``known``: the session's mapping (provider id -> stored id of its newest
    call) for the ids of this batch, as far as the caller knows it (empty on
    the optimistic first attempt). ``nonce`` makes renamed ids unique.
    """
    renaming = Renaming(nonce, known)
    out = renaming.feed(messages)
    return out, renaming.claims()


def wire_id(message: Message, stored: str) -> str:
    """The provider's id for a stored call id of ``message`` (itself when not renamed)."""
    ids = message.metadata.get(WIRE_IDS)
    if isinstance(ids, Mapping):
        found = ids.get(stored)
        if isinstance(found, str):
            return found
    return stored


class KnownIds:
    """Each session's id mapping as this process last saw it (provider id -> stored id
    of its newest call), from the claims of its own appends, which the store checked.

    A hint for the first attempt of the next append: a call whose id the session has
    seen is renamed at once and a result is claimed under its call's stored id, so a
    repeated id that left the cached view (summarized away) costs no ``ID_CONFLICT``
    round trip. A stale hint is harmless: a needless rename is still unique, and a
    wrong claim is refused by the store and renamed again. Bounded: the
    ``per_session`` newest ids of the ``sessions`` most recently used sessions,
    shared by the :meth:`scoped` views of one instance (a server's tenants).
    """

    def __init__(self, sessions: int = 256, per_session: int = 256) -> None:
        self.sessions, self.per_session = sessions, per_session
        self._maps: OrderedDict[Any, dict[str, str]] = OrderedDict()
        self._lock = threading.Lock()
        self._scope = ""

    def scoped(self, scope: str) -> KnownIds:
        """The same hints as seen by one namespace: its session ids its own, the bounds
        and the order in which sessions leave shared with every other scope."""
        if not scope:
            raise ValueError("a scope of the id hints needs a name")
        view = KnownIds.__new__(KnownIds)
        view.__dict__.update(self.__dict__)
        view._scope = scope
        return view

    def _key(self, session_id: str) -> Any:
        return (self._scope, session_id) if self._scope else session_id

    def of(self, session_id: str, provider_ids: Iterable[str]) -> dict[str, str]:
        """The known stored ids of ``provider_ids`` (those this process saw)."""
        key = self._key(session_id)
        with self._lock:
            found = self._maps.get(key)
            if not found:
                return {}
            self._maps.move_to_end(key)
            return {p: found[p] for p in provider_ids if p in found}

    def learn(self, session_id: str, claims: Claims) -> None:
        """The mapping after an append with ``claims`` was written."""
        if (not claims.calls and not claims.results) or not self.sessions:
            return
        key = self._key(session_id)
        with self._lock:
            found = self._maps.pop(key, None) or {}
            for provider, stored in (*claims.results, *claims.calls):  # newest call last
                found.pop(provider, None)
                found[provider] = stored
            while len(found) > self.per_session:
                del found[next(iter(found))]
            self._maps[key] = found
            while len(self._maps) > self.sessions:
                self._maps.popitem(last=False)

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._maps.pop(self._key(session_id), None)


__all__ = ["WIRE_IDS", "Claims", "KnownIds", "Renaming", "disambiguate", "name_key",
           "position_nonce", "wire_id"]
