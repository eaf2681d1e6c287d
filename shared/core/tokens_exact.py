"""Optional exact token counter: OpenAI's BPE (tiktoken) with chat framing.

Why it exists: the heuristic in :mod:`shared.core.tokens` is what the hot path
uses; this counter is the ground truth it is measured against
(``scripts/bench_tokens.py``) and an opt-in for deployments that want exact
OpenAI counts and can afford BPE on every message.

tiktoken is an optional extra (``pip install context-compaction[tiktoken]``)
and is imported only when a counter is built. Encodings load either

- from ``encoding_dir/<name>.tiktoken`` (offline; the file is checked
  against the official sha256 before use), or
- through tiktoken's own registry and cache (``tiktoken.get_encoding``),
  which downloads the file on first use when it is not cached.

Framing follows the OpenAI cookbook ("How to count tokens with tiktoken"):
every message costs 3 tokens of framing plus its role, content and name
(a name costs 1 more); every request costs 3 more for the primed reply.
OpenAI does not publish how tool calls and tool schemas are rendered, so
they are counted as the text the model plausibly sees: each call is framed
like a message of its own with the recipient ``functions.<name>`` and its
JSON arguments; each tool definition as its name, description and compact
JSON schema plus the same fixed overheads the heuristic assumes
(``TOOL_DEFINITION_OVERHEAD``, ``TOOLS_BLOCK_OVERHEAD``): an upper-bound
approximation, as OpenAI renders schemas in a terser TypeScript-like form.
Images and files cost what the heuristic's ``openai`` profile says: an inline image by
its pixel size (OpenAI's tiles), a remote one and a file by a flat figure.

``build_counter`` is how an edge turns a setting into a counter: one
function for the workers and the guard's process, so the two cannot differ
in how they build the same choice.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.core.errors import ConfigError
from shared.core.messages import FilePart, ImagePart, Message
from shared.core.tokens import (
    DEFAULT_COUNTER,
    DEFAULT_SAFETY_MARGIN,
    TOOL_DEFINITION_OVERHEAD,
    TOOLS_BLOCK_OVERHEAD,
    TokenCounter,
    extra_tokens,
    file_tokens,
    image_tokens,
    normalize_tool,
)

TOKENS_PER_MESSAGE = 3
"""``<|im_start|>``, the separator after the role, ``<|im_end|>`` (cookbook figure for gpt-4o)."""
TOKENS_PER_NAME = 1
"""Extra cost of a message ``name`` (cookbook figure)."""
TOKENS_PER_REQUEST = 3
"""The reply is primed with ``<|im_start|>assistant<|message|>`` (cookbook figure)."""
COUNTER_KINDS = ("heuristic", "tiktoken")
"""What ``build_counter`` accepts."""


@dataclass(frozen=True)
class _EncodingSpec:
    sha256: str
    pat_str: str
    special_tokens: Mapping[str, int]


# Published parameters of the two encodings used by current OpenAI chat models
# (rank-file sha256, pre-tokenizer pattern, special tokens), as tiktoken defines
# them. Holding them here lets an encoding be built from a local rank file
# without tiktoken downloading anything.
_O200K_PATTERN = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
_CL100K_PATTERN = (
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+"
    r"| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"
)
KNOWN_ENCODINGS: Mapping[str, _EncodingSpec] = {
    "o200k_base": _EncodingSpec(
        sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        pat_str=_O200K_PATTERN,
        special_tokens={"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    ),
    "cl100k_base": _EncodingSpec(
        sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        pat_str=_CL100K_PATTERN,
        special_tokens={
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    ),
}


def _import_tiktoken() -> Any:
    try:
        import tiktoken
    except ImportError:
        raise ConfigError(
            "the exact token counter needs tiktoken: pip install 'context-compaction[tiktoken]'"
        ) from None
    return tiktoken


def _parse_ranks(raw: bytes, path: Path) -> dict[bytes, int]:
    """``<base64 token> <rank>`` per line, the format of ``.tiktoken`` files."""
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split()
        try:
            if len(fields) != 2:
                raise ValueError("expected two fields")
            ranks[base64.b64decode(fields[0], validate=True)] = int(fields[1])
        except (ValueError, binascii.Error) as exc:
            raise ConfigError(f"{path}: line {number} is not '<base64> <rank>': {exc}") from None
    return ranks


def _from_file(tiktoken: Any, name: str, directory: Path) -> Any:
    spec = KNOWN_ENCODINGS.get(name)
    if spec is None:
        raise ConfigError(
            f"encoding {name!r} cannot be loaded from a directory: its checksum is not known "
            f"(known: {', '.join(sorted(KNOWN_ENCODINGS))})"
        )
    path = directory / f"{name}.tiktoken"
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"encoding file {path} is not readable: {exc.strerror}") from None
    digest = hashlib.sha256(raw).hexdigest()
    if digest != spec.sha256:
        raise ConfigError(f"encoding file {path} has sha256 {digest}, expected {spec.sha256}")
    return tiktoken.Encoding(
        name=name,
        pat_str=spec.pat_str,
        mergeable_ranks=_parse_ranks(raw, path),
        special_tokens=dict(spec.special_tokens),
    )


@functools.lru_cache(maxsize=8)
def _load(name: str, directory: str | None) -> Any:
    tiktoken = _import_tiktoken()
    if directory is not None:
        return _from_file(tiktoken, name, Path(directory))
    try:
        return tiktoken.get_encoding(name)
    except Exception as exc:  # unknown name, no network, corrupt cache: all mean "not usable"
        raise ConfigError(
            f"tiktoken could not provide encoding {name!r} ({type(exc).__name__}: {exc}); "
            "pass encoding_dir pointing at a directory holding "
            f"{name}.tiktoken to load it offline"
        ) from None


def load_encoding(name: str = "o200k_base", encoding_dir: str | Path | None = None) -> Any:
    """The ``tiktoken.Encoding`` called ``name`` (cached per name and directory).

    Raises :class:`ConfigError` when tiktoken is missing, the file is absent
    or altered, or tiktoken cannot fetch the encoding.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError("encoding: expected a non-empty encoding name")
    directory = None if encoding_dir is None else str(Path(encoding_dir).resolve())
    return _load(name, directory)


def exact_counter_available(
    encoding: str = "o200k_base", encoding_dir: str | Path | None = None
) -> bool:
    """Whether :class:`TiktokenCounter` can be built with these arguments.

    Without ``encoding_dir`` this asks tiktoken, which may download the file.
    """
    try:
        load_encoding(encoding, encoding_dir)
    except ConfigError:
        return False
    return True


class TiktokenCounter:
    """Exact OpenAI counts (BPE + cookbook framing); implements ``TokenCounter``."""

    provider = "openai"
    """Its counts are OpenAI's: other families' tokenizers are scaled from them
    (:func:`shared.core.calibration.prior_ratio`)."""

    def __init__(
        self, encoding: str = "o200k_base", encoding_dir: str | Path | None = None
    ) -> None:
        self._encoding = load_encoding(encoding, encoding_dir)
        self.encoding_name = encoding

    def __repr__(self) -> str:
        return f"TiktokenCounter(encoding={self.encoding_name!r})"

    def text(self, text: str) -> int:
        """Tokens of ``text``; special-token strings count as ordinary text."""
        if not text:
            return 0
        return len(self._encoding.encode_ordinary(text))

    def message(self, message: Message) -> int:
        """One message with its framing, tool calls, media and what an adapter sends beside
        it (:data:`~shared.core.tokens.EXTRA_TOKENS`, the heuristic's figure, with the
        heuristic's safety margin)."""
        n = TOKENS_PER_MESSAGE + self.text(message.role) + self.text(message.text())
        if message.name:
            n += TOKENS_PER_NAME + self.text(message.name)
        if message.reasoning:
            n += self.text(message.reasoning)
        # what an adapter sends beside it: the heuristic's estimate, so with its margin
        n += math.ceil(extra_tokens(message) * (1.0 + DEFAULT_SAFETY_MARGIN))
        for call in message.tool_calls:
            n += (
                TOKENS_PER_MESSAGE + self.text(f"functions.{call.name}") + self.text(call.arguments)
            )
        if not isinstance(message.content, str):
            for part in message.content:
                if isinstance(part, ImagePart):
                    n += image_tokens(part, "openai")
                elif isinstance(part, FilePart):
                    n += file_tokens(part, "openai")
        return n

    def messages(self, messages: Sequence[Message]) -> int:
        """A whole request: every message plus the primed reply."""
        return TOKENS_PER_REQUEST + sum(self.message(m) for m in messages)

    def tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Tool definitions, counted as name, description and compact JSON schema."""
        if not tools:
            return 0
        n = TOOLS_BLOCK_OVERHEAD
        for index, tool in enumerate(tools):
            name, description, schema = normalize_tool(tool, index)
            n += TOOL_DEFINITION_OVERHEAD + self.text(name) + self.text(description)
            if schema is not None:
                n += self.text(json.dumps(schema, ensure_ascii=False, separators=(",", ":")))
        return n


def build_counter(
    kind: str = "heuristic",
    *,
    encoding: str = "o200k_base",
    encoding_dir: str | Path | None = None,
) -> TokenCounter:
    """The counter an edge configured: ``"heuristic"`` (``DEFAULT_COUNTER``: the
    OpenAI-baseline heuristic with its safety margin) or ``"tiktoken"`` (exact,
    ``encoding`` loaded from ``encoding_dir`` or tiktoken's registry).

    Raises :class:`ConfigError` for another ``kind`` or when the encoding
    cannot be loaded; ``encoding`` and ``encoding_dir`` are not looked at for
    the heuristic.
    """
    if kind == "heuristic":
        return DEFAULT_COUNTER
    if kind == "tiktoken":
        return TiktokenCounter(encoding, encoding_dir)
    raise ConfigError(f"token counter: expected one of {', '.join(COUNTER_KINDS)}, got {kind!r}")


__all__ = [
    "COUNTER_KINDS",
    "KNOWN_ENCODINGS",
    "TOKENS_PER_MESSAGE",
    "TOKENS_PER_NAME",
    "TOKENS_PER_REQUEST",
    "TiktokenCounter",
    "build_counter",
    "exact_counter_available",
    "load_encoding",
]
