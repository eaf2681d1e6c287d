"""Server settings: ``COMPACTION_SERVER_*``, read once at start-up (no fastapi here).

Bearer tokens map to tenants. They come from a JSON object ``{"token":
"tenant", ...}``, in a file (``COMPACTION_SERVER_TOKENS_FILE``, e.g. a
Docker/Kubernetes secret) or inline (``COMPACTION_SERVER_TOKENS``, for
tests and local runs). A server with no token refuses to start: an open
endpoint would let anyone read every tenant's sessions.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.core.errors import ConfigError
from shared.store.keys import validate_tenant

ENV_PREFIX = "COMPACTION_SERVER_"
MIN_TOKEN_LENGTH = 16
NO_TOKEN = ("no bearer token configured (COMPACTION_SERVER_TOKENS_FILE or "
            "COMPACTION_SERVER_TOKENS): refusing to serve every tenant openly")


class TokenConfig(BaseSettings):
    """The bearer tokens alone (``COMPACTION_SERVER_TOKENS_FILE`` / ``_TOKENS``): what
    ``compaction mcp --transport http`` reads, without the server's other knobs."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    tokens: SecretStr | None = Field(default=None, description="JSON {token: tenant}")
    tokens_file: Path | None = Field(default=None, description="file holding that JSON")

    @model_validator(mode="after")
    def _tokens_readable(self) -> TokenConfig:
        self.token_map()  # fail at start-up, naming the variable
        return self

    def token_map(self) -> dict[str, str]:
        """``{token: tenant}`` from the file or the inline value (the file wins)."""
        if self.tokens_file is not None:
            name = f"{ENV_PREFIX}TOKENS_FILE"
            try:
                raw = self.tokens_file.read_text(encoding="utf-8")
            except OSError as exc:
                raise ValueError(f"{name}: cannot read {self.tokens_file}: "
                                 f"{exc.strerror}") from None
        elif self.tokens is not None:
            name, raw = f"{ENV_PREFIX}TOKENS", self.tokens.get_secret_value()
        else:
            return {}
        return parse_tokens(raw, name)


C = TypeVar("C", bound=TokenConfig)


class ServerConfig(TokenConfig):
    """Every knob of ``compaction serve``; each is ``COMPACTION_SERVER_<NAME>``."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024,
                                description="larger request bodies get 413, unread")
    workers: int = Field(default=1, ge=1, description="uvicorn worker processes")
    shutdown_grace_seconds: int = Field(
        default=8, ge=1,
        description="on SIGTERM, how long requests in flight may still finish before they "
                    "are cancelled and the server exits (under Docker's default 10 s stop "
                    "timeout: a client holding a request open no longer keeps the server up)")
    cache_sessions: int = Field(
        default=1024, ge=0,
        description="sessions whose views a worker process keeps decoded, every tenant's "
                    "together (0: none, every prepare reads)")
    cache_messages: int = Field(
        default=200_000, ge=0,
        description="messages those views hold in all (~2.6 kB each with the OpenAI wire "
                    "form): the bound on a process's cache memory")
    cache_pending_tokens: int = Field(
        default=10_000_000, ge=0,
        description="tokens of the turns in progress a process remembers between their "
                    "prepares, every tenant's together (3-15 bytes a token; a turn over "
                    "it is validated and counted again at each call)")


def parse_tokens(raw: str, name: str) -> dict[str, str]:
    try:
        data: Any = json.loads(raw)
    except ValueError:
        raise ValueError(f"{name}: not JSON (expected an object {{token: tenant}})") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"{name}: expected an object {{token: tenant}}")
    out: dict[str, str] = {}
    for i, (token, tenant) in enumerate(data.items()):
        if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH:
            raise ValueError(f"{name}: token #{i + 1} is shorter than {MIN_TOKEN_LENGTH} "
                             "characters")
        if not isinstance(tenant, str):
            raise ValueError(f"{name}: the tenant of token #{i + 1} is not a string")
        try:
            out[token] = validate_tenant(tenant)
        except ValueError as exc:
            raise ValueError(f"{name}: tenant of token #{i + 1}: {exc}") from None
    return out


class TokenBook:
    """Bearer token -> tenant, compared in constant time.

    Every configured token is compared (no early exit) on SHA-256 digests,
    so neither a token's length nor its position leaks through timing.
    """

    def __init__(self, tokens: Mapping[str, str]) -> None:
        self._entries = [(hashlib.sha256(t.encode()).digest(), tenant)
                         for t, tenant in tokens.items()]

    def __len__(self) -> int:
        return len(self._entries)

    def tenant(self, token: str) -> str | None:
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found: str | None = None
        for expected, tenant in self._entries:
            if hmac.compare_digest(digest, expected):
                found = tenant
        return found


def server_variables() -> frozenset[str]:
    """Every ``COMPACTION_SERVER_*`` variable the server reads: one per field, derived so
    that the settings' unknown-variable warning never drifts from this model."""
    return frozenset(f"{ENV_PREFIX}{name.upper()}" for name in ServerConfig.model_fields)


def _shown(field: str, value: object) -> str:
    """A rejected value as a log line may show it: the tokens redacted, long ones clipped."""
    if field == "tokens":
        return "'***'"
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def load_server_config(*, flags: Mapping[str, str] | None = None,
                       **overrides: Any) -> ServerConfig:
    """Read ``COMPACTION_SERVER_*``; a bad value raises ConfigError naming the variable, or
    the command-line option it came from (``flags``: field -> option, e.g. ``--port``)."""
    return _load(ServerConfig, flags, overrides)


def load_token_config(**overrides: Any) -> TokenConfig:
    """Read only the token settings (ConfigError naming the variable when bad)."""
    return _load(TokenConfig, None, overrides)


def _load(cls: type[C], flags: Mapping[str, str] | None, overrides: Mapping[str, Any]) -> C:
    try:
        return cls(**overrides)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            message = err["msg"].removeprefix("Value error, ")
            if not field:
                problems.append(message)
                continue
            name = (flags or {}).get(field) if field in overrides else None
            problems.append(f"{name or ENV_PREFIX + field.upper()}="
                            f"{_shown(field, err.get('input'))}: {message}")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None


def require_tokens(config: ServerConfig) -> dict[str, str]:
    """The token map, or ConfigError when it is empty: a server must not start open."""
    tokens = config.token_map()
    if not tokens:
        raise ConfigError(NO_TOKEN)
    return tokens


__all__ = ["ENV_PREFIX", "NO_TOKEN", "ServerConfig", "TokenBook", "TokenConfig",
           "load_server_config", "load_token_config", "parse_tokens", "require_tokens",
           "server_variables"]
