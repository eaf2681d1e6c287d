"""Settings, read once at the edges (worker start-up, CLI) from ``COMPACTION_*``.

Library code never reads the environment: the edges build a
:class:`Settings` here and pass plain config objects (``StoreConfig``,
``CompactionPolicy``) into ``shared``. An invalid value stops start-up
with one line naming the environment variable and the value (secrets
redacted); a ``COMPACTION_*`` variable that is not a setting (a typo)
gets a one-line warning naming the closest setting.

Secrets (the Redis password, the summarizer key, the URLs) may come from
files: ``COMPACTION_<NAME>_FILE=/run/secrets/...`` (Docker and Kubernetes
secrets), so they stay out of the environment of every process and out of
``docker inspect``. pydantic-settings' ``secrets_dir`` was not used: it
reads one fixed directory, file names must equal the variable names, and it
warns when the directory is missing (every run outside a container).

The secret files and the unknown-variable warning are in
:mod:`workers.settings_sources`, URL checks and redaction in
:mod:`workers.settings_urls`; their public names are importable from here.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TextIO
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from shared.core.config import CompactionPolicy, StoreConfig
from shared.core.errors import ConfigError, InvalidInput
from shared.core.tokens_exact import build_counter
from shared.enqueue import QUEUE, sentinel_broker_tls, tls_verified
from shared.store.keys import validate_tenant
from workers.settings_sources import (
    ENV_PREFIX,
    FILE_SETTINGS,
    FILE_SUFFIX,
    NOT_SETTINGS,
    SecretFileSource,
    read_secret_file,
    setting_variables,
    unknown_among,
    warn_unknown_among,
)
from workers.settings_urls import check_broker_url, check_store_url, redact_url, with_password

RETRY_BACKOFF_FACTOR = 2  # Celery retry_backoff: countdowns 2, 4, 8... s (capped, jittered)
RECALL_INDEX_TASK = "compaction.index_recall"
# Kombu's Redis transport reads priority 0 (every compaction job) before 3, 6 and 9: an
# index job waits while compactions are queued (workers.app routes it at this priority).
RECALL_INDEX_PRIORITY = 9
LEASE_MARGIN_SECONDS = 30  # lease beyond the longest job (store calls, a slow release)
REDELIVERY_MARGIN_SECONDS = 30  # visibility beyond lease + countdown (clock, scheduling)
# Shown as *** in error messages; URLs are shown with their password redacted.
SECRET_SETTINGS = frozenset({"redis_password", "summarizer_api_key"})
URL_SETTINGS = frozenset({"redis_url", "broker_url"})
# The variables google-genai reads an API key from when it is given none (its
# get_env_api_key: GOOGLE_API_KEY first, an empty value counts as unset).
GENAI_KEY_VARIABLES = ("GOOGLE_API_KEY", "GEMINI_API_KEY")
# The setting each StoreConfig field is made from (store_config), for error messages.
STORE_FIELD_SETTINGS = {"key_prefix": "key_prefix", "summary_retention": "summary_retention",
                        "ttl_seconds": "session_ttl_seconds",
                        "pending_ttl_seconds": "pending_ttl_seconds",
                        "pending_stale_seconds": "pending_stale_seconds",
                        "socket_timeout": "redis_socket_timeout",
                        "connect_timeout": "redis_socket_timeout",
                        "cluster_migration_wait": "redis_cluster_migration_wait"}


class Settings(BaseSettings):
    """Every knob of the service. Each field is ``COMPACTION_<NAME>`` in the environment.

    Token counting (``COMPACTION_TOKEN_COUNTER``): the guard and the workers
    must count with the same counter. Each append stores the running token
    total of the session's log in Redis, counted by the appender's counter
    and never recounted, and the calibration learned from provider usage is
    a ratio to *that* counter's estimates; a worker counting with another
    counter cuts and budgets on figures that do not add up with the
    guard's. So the agent's process builds its ``SessionStore`` with the
    counter this setting names (``shared.core.tokens_exact.build_counter``, the
    one function the workers use too; ``ContextGuard`` takes the store's),
    and a change is made on both sides at once; sessions already stored keep
    the old counter's totals for the messages they hold. ``tiktoken`` is
    exact only for OpenAI models of its encoding (``o200k_base``: gpt-4o,
    gpt-4.1, o-series; ``cl100k_base``: gpt-4, gpt-3.5) and has no safety
    margin: for other providers it undercounts until the first usage report
    calibrates it (BENCHMARKS.md, "Exact counter"). The heuristic stays the
    default.
    """

    # allow_inf_nan=False: ``inf`` is no timeout or ratio (math.ceil(inf) stopped start-up
    # with a traceback) and ``nan`` compares false with every bound.
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True,
                                      allow_inf_nan=False)

    # connections
    redis_url: str = Field(default="redis://127.0.0.1:6379/0",
                           description="session store: a standalone Redis, any node of a "
                           "Redis Cluster with COMPACTION_REDIS_CLUSTER, or a Sentinel "
                           "deployment: redis+sentinel://host:26379,host2:26379/<service>/<db> "
                           "(rediss+sentinel:// over TLS)")
    redis_cluster: bool = Field(default=False, description="the store is a Redis Cluster "
                                "(a session's keys share one slot); the broker stays "
                                "a standalone Redis")
    redis_cluster_migration_wait: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="seconds a call waits for "
        "its slot's migration to another master to end, then fails (default: twice "
        "COMPACTION_REDIS_SOCKET_TIMEOUT)")
    broker_url: str = Field(default="redis://127.0.0.1:6379/1",
                            description="Celery broker: a separate db or instance, noeviction "
                            "(Sentinel: sentinel://host:26379/<db>;sentinel://host2:26379/<db> "
                            "with COMPACTION_BROKER_SENTINEL_MASTER; ssl_* options for TLS)")
    broker_sentinel_master: str | None = Field(
        default=None, min_length=1, description="the service name the Sentinels of a "
        "sentinel:// COMPACTION_BROKER_URL monitor (kombu's master_name)")
    tenant: str = Field(default="default", description="tenant namespace of the keys")
    key_prefix: str = "cmp"
    redis_password: SecretStr | None = Field(
        default=None, description="added to the store and broker URLs that carry none "
        "(COMPACTION_REDIS_PASSWORD_FILE: from a Docker secret)")
    redis_socket_timeout: float = Field(default=0.5, gt=0)
    session_ttl_seconds: int | None = Field(default=None, gt=0)
    pending_ttl_seconds: int = Field(
        default=600, gt=0, description="a queued job's pending flag expires after this: a "
        "job message lost on the way (a purge, a broker that lost its lists) holds the "
        "session's next job back at most this long")
    pending_stale_seconds: int | None = Field(
        default=None, ge=0, description="a pending flag no worker claimed for this long "
        "(its job lost, or queued that long) is re-armed by the next turn, which publishes "
        "the job again; 0: never; default: half of COMPACTION_PENDING_TTL_SECONDS (300 s), "
        "above the broker's visibility timeout with the default timing")
    summary_retention: int = Field(default=50, ge=1)

    # policy
    trigger_ratio: float = Field(default=0.80, gt=0, le=1)
    target_ratio: float = Field(default=0.50, gt=0, le=1)
    keep_recent_ratio: float = Field(default=0.25, gt=0, lt=1)
    keep_recent_tokens: int | None = Field(default=None, gt=0)
    message_threshold: int = Field(default=400, gt=0)
    min_saving_ratio: float = Field(default=0.10, ge=0, lt=1)
    max_summary_tokens: int = Field(default=2000, gt=0)
    max_ledger_chars: int = Field(default=4000, gt=0)
    summary_placement: Literal["system", "message"] = "system"
    proactive: bool = Field(default=True, description="kill switch; recovery stays on")
    unrecognised_overflow_at: float | None = Field(
        default=0.90, gt=0, le=1, description="recover from an error nothing recognises "
        "when the refused request was at least this full (compaction serve)")
    recall_index: Literal["task", "job", "off"] = Field(
        default="task", description="who indexes a compacted range for recall: its own "
        "low-priority job, coalesced per session (task), the compaction job itself (job), "
        "or nobody (off: recall finds only what was indexed before)")

    # summarizer
    summarizer: Literal["offline", "openai", "vertex", "gemini"] = "offline"
    summarizer_model: str | None = Field(
        default=None, description="default: a cheap model of the provider")
    summarizer_base_url: str | None = None
    summarizer_api_key: SecretStr | None = None
    summarizer_timeout: float = Field(default=60.0, gt=0, description="per LLM call, seconds")
    summarizer_max_input_tokens: int | None = Field(default=None, gt=0)
    summarizer_cooldown: bool = Field(
        default=True, description="a wait the provider states holds every worker's calls "
        "(workers.summarizer.cooldown); false: only the job told waits")
    vertex_project: str | None = None
    vertex_location: str = "us-central1"

    # token counting (guard and workers must agree: see the class docstring)
    token_counter: Literal["heuristic", "tiktoken"] = Field(
        default="heuristic",
        description="heuristic (any provider, 5% margin) or tiktoken (exact for OpenAI models)")
    tiktoken_encoding: str = Field(default="o200k_base", min_length=1,
                                   description="encoding of COMPACTION_TOKEN_COUNTER=tiktoken")
    tiktoken_dir: Path | None = Field(
        default=None, description="directory holding <encoding>.tiktoken (offline machines); "
        "default: tiktoken's cache, downloading on first use")

    # worker (time limits, lease, retries and redelivery: see "Timing" below)
    broker_restore_sweep_seconds: int = Field(
        default=10, gt=0, description="how often unacked jobs past the timeout are requeued")
    sweep_seconds: int = Field(
        default=60, ge=0, description="how often one worker of the deployment re-publishes "
        "the jobs of sessions whose pending flag went stale with no worker on them (a job "
        "lost between the broker and a killed worker; workers.sweep); 0: never")
    queue: str = Field(default=QUEUE, min_length=1, description="Celery queue the CLI, "
                       "compaction serve and doctor publish to and check; the workers "
                       "consume it (no -Q needed)")
    broker_max_connections: int = Field(
        default=128, gt=0, description="connections per broker channel pool: every pool "
        "thread may acknowledge at the same moment (kombu's default is 10)")
    broker_visibility_timeout: int | None = Field(
        default=None, gt=0,
        description="default: lease + longest retry countdown + sweep + 30 s (about 4 min)")
    task_soft_time_limit: int = Field(
        default=120, gt=0, description="a job starts no LLM call after this many seconds")
    task_time_limit: int = Field(default=180, gt=0)
    max_retries: int = Field(default=3, ge=0)
    retry_backoff_max: int = Field(default=30, gt=0, description="cap of one retry countdown")

    # observability (workers/metrics.py, workers/logging_setup.py, docs/observability.md)
    metrics_port: int | None = Field(default=None, ge=1, le=65535, description="each worker "
                                     "process serves Prometheus /metrics on this port")
    log_format: Literal["text", "json"] = Field(
        default="text", description="json: one JSON object per line with session, tenant, "
        "job and trace ids")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then the environment, then ``COMPACTION_<NAME>_FILE`` secret files."""
        return init_settings, env_settings, SecretFileSource(settings_cls)

    @model_validator(mode="before")
    @classmethod
    def _password_into_urls(cls, data: Any) -> Any:
        """``COMPACTION_REDIS_PASSWORD`` joins the URLs before they are validated."""
        if not isinstance(data, dict):
            return data
        password = data.get("redis_password")
        if isinstance(password, SecretStr):
            password = password.get_secret_value()
        if not isinstance(password, str) or not password:
            return data
        data = dict(data)
        for name in URL_SETTINGS:
            url = data.get(name, cls.model_fields[name].default)
            if isinstance(url, str):
                data[name] = with_password(url, password)
        return data

    @field_validator("redis_url")
    @classmethod
    def _store_url(cls, value: str) -> str:
        check_store_url(value)
        return value

    @field_validator("broker_url")
    @classmethod
    def _broker_url(cls, value: str) -> str:
        """One URL, or kombu's ``;``-separated failover list of them; a ``rediss://`` one
        checks the server's certificate unless it says otherwise (:func:`tls_verified`)."""
        verified = tls_verified(value)  # first: kombu warns of a bare rediss:// it parses
        for part in verified.split(";"):
            check_broker_url(part)
        sentinel_broker_tls(verified)  # a sentinel:// list's ssl_* options, named if bad
        return verified

    @field_validator("summarizer_base_url")
    @classmethod
    def _summarizer_base_url(cls, value: str | None) -> str | None:
        """An http(s) URL with a host, checked at start-up: anything else failed every job
        as an unreachable summarizer, each retried before its offline fallback."""
        if value is None or not value.strip():
            return None
        parsed = urlsplit(value.strip())
        try:
            parsed.port  # noqa: B018 (raises on a port out of range)
        except ValueError as exc:
            raise ValueError(f"{value!r}: {exc}") from None
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"{value!r} is not an http(s) URL with a host "
                             "(e.g. http://127.0.0.1:8000/v1)")
        return value.strip()

    @field_validator("key_prefix")
    @classmethod
    def _key_prefix(cls, value: str) -> str:
        """StoreConfig's own rule, checked at start-up instead of on the first job."""
        try:
            StoreConfig(key_prefix=value)
        except ValidationError as exc:
            raise ValueError("; ".join(err["msg"] for err in exc.errors())) from None
        return value

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, value: str) -> str:
        """The store's tenant rule, checked at start-up instead of on the first job."""
        try:
            return validate_tenant(value)
        except InvalidInput as exc:
            raise ValueError(str(exc).removeprefix(f"{exc.field}: ")) from None

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.target_ratio >= self.trigger_ratio:
            raise ValueError("COMPACTION_TARGET_RATIO must be below COMPACTION_TRIGGER_RATIO")
        if self.task_soft_time_limit >= self.task_time_limit:
            raise ValueError(
                "COMPACTION_TASK_SOFT_TIME_LIMIT must be below COMPACTION_TASK_TIME_LIMIT")
        if self.redis_cluster and not self.redis_url.startswith(("redis://", "rediss://")):
            raise ValueError("COMPACTION_REDIS_CLUSTER needs a redis:// or rediss:// "
                             "COMPACTION_REDIS_URL (a node's host and port)")
        if not self.redis_cluster and self.redis_url.startswith(("redis://", "rediss://")) \
                and "," in urlsplit(self.redis_url).netloc:
            raise ValueError("COMPACTION_REDIS_URL names several nodes: that is a Redis "
                             "Cluster's form; set COMPACTION_REDIS_CLUSTER=true")
        if self.redis_cluster and urlsplit(self.redis_url).path.strip("/") not in ("", "0"):
            raise ValueError("COMPACTION_REDIS_CLUSTER: a Redis Cluster has only database 0; "
                             "drop the /<db> from COMPACTION_REDIS_URL")
        sentinel_broker = self.broker_url.lower().startswith("sentinel://")
        if sentinel_broker and not self.broker_sentinel_master:
            raise ValueError("COMPACTION_BROKER_SENTINEL_MASTER is required with a sentinel:// "
                             "COMPACTION_BROKER_URL (the service name the Sentinels monitor)")
        if self.broker_sentinel_master and not sentinel_broker:
            raise ValueError("COMPACTION_BROKER_SENTINEL_MASTER applies to a sentinel:// "
                             "COMPACTION_BROKER_URL only")
        if self.summarizer == "vertex" and not self.vertex_project:
            raise ValueError("COMPACTION_VERTEX_PROJECT is required when "
                             "COMPACTION_SUMMARIZER=vertex")
        if (self.summarizer == "openai" and not self.summarizer_api_key
                and not self.summarizer_base_url):
            raise ValueError("COMPACTION_SUMMARIZER_API_KEY (or COMPACTION_SUMMARIZER_BASE_URL "
                             "for a keyless local server) is required when "
                             "COMPACTION_SUMMARIZER=openai")
        if (self.summarizer == "gemini" and not self.summarizer_api_key
                and not any(os.environ.get(name) for name in GENAI_KEY_VARIABLES)):
            # google-genai's API-key mode needs a key even with a base URL
            raise ValueError("COMPACTION_SUMMARIZER_API_KEY is required when "
                             "COMPACTION_SUMMARIZER=gemini (or google-genai's own "
                             f"{' / '.join(GENAI_KEY_VARIABLES)}; none is set)")
        return self

    @model_validator(mode="after")
    def _store_config_valid(self) -> Settings:
        """Build the store's config now: a worker that starts can run its jobs."""
        self.store_config()
        return self

    @field_validator("unrecognised_overflow_at", mode="before")
    @classmethod
    def _never(cls, value: object) -> object:
        """``none`` / ``off`` / ``never`` turn the net off; empty is an error, as for every
        other number (a blank left in a template must not switch a feature off)."""
        if isinstance(value, str) and value.strip().lower() in ("none", "off", "never"):
            return None
        if isinstance(value, str) and not value.strip():  # it meant off before 55704c3
            raise ValueError("empty: give a number in (0, 1], or `off` to turn it off")
        return value

    @field_validator("recall_index", mode="before")
    @classmethod
    def _recall_index_switch(cls, value: object) -> object:
        """``true``/``false`` (and 1/0, on/off, yes/no) read as ``task``/``off``."""
        if isinstance(value, bool):
            return "task" if value else "off"
        if isinstance(value, str):
            word = value.strip().lower()
            return {"true": "task", "1": "task", "on": "task", "yes": "task",
                    "false": "off", "0": "off", "no": "off"}.get(word, word)
        return value

    @field_validator("tiktoken_dir", mode="before")
    @classmethod
    def _blank_dir_is_unset(cls, value: object) -> object:
        """``COMPACTION_TIKTOKEN_DIR=`` means no directory, not the working directory."""
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _token_counter_loadable(self) -> Settings:
        """Load the encoding now: a worker that starts must be able to count."""
        if self.token_counter != "tiktoken":
            return self
        try:
            build_counter("tiktoken", encoding=self.tiktoken_encoding,
                          encoding_dir=self.tiktoken_dir)
        except ConfigError as exc:
            source, hint = f"COMPACTION_TIKTOKEN_DIR={self.tiktoken_dir}", ""
            if self.tiktoken_dir is None:
                source = "tiktoken's cache or download"
                hint = (f"; on machines without internet set COMPACTION_TIKTOKEN_DIR to a "
                        f"directory holding {self.tiktoken_encoding}.tiktoken")
            raise ValueError(
                f"COMPACTION_TOKEN_COUNTER=tiktoken cannot load COMPACTION_TIKTOKEN_ENCODING="
                f"{self.tiktoken_encoding} from {source}: {exc}{hint}") from None
        return self

    @property
    def summarizer_model_name(self) -> str:
        if self.summarizer_model:
            return self.summarizer_model
        return "gpt-4o-mini" if self.summarizer == "openai" else "gemini-2.5-flash-lite"

    def store_config(self) -> StoreConfig:
        """The store's config; ConfigError naming the variables if they make none."""
        try:
            return StoreConfig(
                key_prefix=self.key_prefix, summary_retention=self.summary_retention,
                lease_ttl_seconds=self.lease_seconds, pending_ttl_seconds=self.pending_ttl_seconds,
                pending_stale_seconds=self.pending_stale_seconds,
                request_ttl_seconds=max(3600, 2 * self.visibility_timeout),
                ttl_seconds=self.session_ttl_seconds, socket_timeout=self.redis_socket_timeout,
                connect_timeout=self.redis_socket_timeout,
                cluster_migration_wait=self.redis_cluster_migration_wait)
        except ValidationError as exc:
            raise ConfigError(_store_problems(exc)) from None

    def policy(self) -> CompactionPolicy:
        return CompactionPolicy(
            trigger_ratio=self.trigger_ratio, target_ratio=self.target_ratio,
            keep_recent_ratio=self.keep_recent_ratio, keep_recent_tokens=self.keep_recent_tokens,
            message_threshold=self.message_threshold, min_saving_ratio=self.min_saving_ratio,
            max_summary_tokens=self.max_summary_tokens, max_ledger_chars=self.max_ledger_chars,
            summary_placement=self.summary_placement, proactive=self.proactive,
            unrecognised_overflow_at=self.unrecognised_overflow_at)

    # -- Timing ------------------------------------------------------------------
    # A job's message stays unacknowledged from delivery to the end of the job
    # (acks_late), and a retry's message from its delivery to the end of its run,
    # countdown included. Redis redelivers what stays unacknowledged longer than
    # the visibility timeout, so: lease > longest job, and visibility > longest
    # retry countdown + lease, so that a redelivered job of a dead worker finds the
    # lease expired (a job that finds it busy leaves its request to the holder,
    # and a dead holder runs nothing).
    #
    # The trade-off: a worker killed by SIGKILL (OOM, lost node) gets its job
    # redelivered only after the visibility timeout, and the session cannot be
    # compacted before its lease expires; meanwhile the guard keeps the agent's
    # requests inside the window by emergency truncation, healed afterwards. Every
    # second cut from the time limits shortens that wait; the price is that a job
    # starting LLM calls later than the soft limit stops (SummarizerUnavailable,
    # retried, then the offline fallback). 120 s covers a summary plus a split-turn
    # prefix, or about four folded chunks, at a 30 s call; raise both limits for
    # agents whose ranges fold into many chunks (a 1M-token window summarized by a
    # 128k model). Defaults: 180 s hard limit (120 s soft + one 60 s call), 210 s
    # lease, 8 s longest countdown (3 retries: 2, 4, 8 s), visibility 258 s, where
    # the former defaults (300 s, 2 x 60 s backoff + 60 s) gave 480 s.

    @property
    def longest_job_seconds(self) -> int:
        """The hard limit, or soft limit + one LLM call where the pool enforces no limit
        (threads: the job checks its deadline between calls, each call has its timeout)."""
        return max(self.task_time_limit,
                   self.task_soft_time_limit + math.ceil(self.summarizer_timeout))

    @property
    def longest_retry_countdown(self) -> int:
        """Celery's exponential backoff: ``factor * 2**retries`` capped, the last retry
        being the longest (jitter only shortens it)."""
        if self.max_retries == 0:
            return 0
        exponent: int = min(self.max_retries - 1, 32)
        return min(self.retry_backoff_max, RETRY_BACKOFF_FACTOR << exponent)

    @property
    def visibility_timeout(self) -> int:
        """Above the longest retry countdown plus the lease (see "Timing" above)."""
        if self.broker_visibility_timeout is not None:
            return self.broker_visibility_timeout
        return (self.longest_job_seconds + LEASE_MARGIN_SECONDS + self.longest_retry_countdown
                + self.broker_restore_sweep_seconds + REDELIVERY_MARGIN_SECONDS)

    def visibility_warning(self) -> str | None:
        """One line when an explicit visibility timeout is below the longest job: a job
        still running then is delivered again (the lease keeps it harmless, the work is
        done twice). Not an error: tests that kill workers set a few seconds on purpose."""
        given = self.broker_visibility_timeout
        if given is None or given >= self.longest_job_seconds:
            return None
        derived = self.model_copy(update={"broker_visibility_timeout": None}).visibility_timeout
        return (f"warning: {ENV_PREFIX}BROKER_VISIBILITY_TIMEOUT={given} is below the longest "
                f"job ({self.longest_job_seconds} s): a job still running after {given} s is "
                f"delivered again and runs twice (unset, it is derived: {derived} s)")

    @property
    def lease_seconds(self) -> int:
        """A job's lease outlives the longest job but expires before redelivery.

        An explicit ``COMPACTION_BROKER_VISIBILITY_TIMEOUT`` below the derived one
        (tests that kill workers use a few seconds) shortens the lease with it.
        """
        return min(self.longest_job_seconds + LEASE_MARGIN_SECONDS,
                   max(1, self.visibility_timeout - 1))

def _shown(field: str, value: object) -> str:
    """A rejected value as it may appear in a log line: quoted, secrets redacted, clipped."""
    if field in SECRET_SETTINGS:
        return "'***'"
    if field in URL_SETTINGS and isinstance(value, str):
        value = redact_url(value)
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _store_problems(exc: ValidationError) -> str:
    """StoreConfig's errors on one line, each naming the variable its field comes from."""
    problems = []
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else ""
        setting = STORE_FIELD_SETTINGS.get(field)
        where = (f"{ENV_PREFIX}{setting.upper()}={_shown(setting, err.get('input'))}"
                 if setting else f"store config {field} (derived from the timing settings)")
        reason = err["msg"].removeprefix("Value error, ")
        for name, named in STORE_FIELD_SETTINGS.items():  # a field the reason names, too
            reason = re.sub(rf"\b{name}\b", f"{ENV_PREFIX}{named.upper()}", reason)
        problems.append(f"{where}: {reason}")
    return " ".join("; ".join(problems).split())


def describe(exc: ValidationError) -> str:
    """Every problem of a validation error on one line: ``COMPACTION_X='value': why``."""
    problems = []
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else ""
        reason = err["msg"].removeprefix("Value error, ")
        if field in Settings.model_fields:
            variable = f"{ENV_PREFIX}{field.upper()}"
            problems.append(f"{variable}={_shown(field, err.get('input'))}: {reason}")
        else:
            problems.append(reason)
    return " ".join("; ".join(problems).split())

def known_variables() -> frozenset[str]:
    """Every ``COMPACTION_*`` name Settings reads (with the ``_FILE`` variants)."""
    return setting_variables(Settings.model_fields)


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """``(variable, closest setting or None)`` for each ``COMPACTION_*`` name no setting reads."""
    return unknown_among(environ, known_variables())


def warn_unknown_variables(environ: Mapping[str, str] | None = None,
                           stream: TextIO | None = None) -> str | None:
    """One warning line for the ``COMPACTION_*`` variables that are not settings (once each
    per process; see :func:`workers.settings_sources.warn_unknown_among`)."""
    return warn_unknown_among(known_variables(), environ, stream)


def load_settings(**overrides: object) -> Settings:
    """Read the environment once; a bad value raises a one-line ConfigError naming it."""
    warn_unknown_variables()
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise ConfigError(describe(exc)) from None


__all__ = ["ENV_PREFIX", "FILE_SETTINGS", "FILE_SUFFIX", "LEASE_MARGIN_SECONDS",
           "NOT_SETTINGS", "REDELIVERY_MARGIN_SECONDS", "RETRY_BACKOFF_FACTOR",
           "SecretFileSource", "Settings", "describe", "known_variables", "load_settings",
           "read_secret_file", "redact_url", "unknown_variables", "warn_unknown_variables",
           "with_password"]
