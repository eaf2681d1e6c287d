"""Choosing the token counter at the edges: ``COMPACTION_TOKEN_COUNTER`` and friends.

What must hold: the heuristic is the default; ``tiktoken`` is built once and
reaches the store, the compactor and the summary engine as one object; a
tiktoken choice that cannot be loaded stops start-up (settings, worker app,
CLI) with a ConfigError naming the variable. Tests that load real encodings
use the offline files of ``../shared/data/tokenizers`` and skip, saying so,
when they (or tiktoken) are absent; the failure paths need neither.
"""

from __future__ import annotations

import builtins
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core import tokens_exact
from shared.core.config import StoreConfig
from shared.core.errors import ConfigError
from shared.core.messages import Message, ToolCall
from shared.core.tokens import DEFAULT_COUNTER
from shared.core.tokens_exact import COUNTER_KINDS, TiktokenCounter, build_counter
from shared.guard import ContextGuard
from shared.store.sessions import SessionStore
from tests.conftest import DATA_DIR
from workers.app import create_app
from workers.cli.main import main as cli_main
from workers.runtime import build_runtime, token_counter
from workers.settings import Settings, load_settings

TOKENIZERS = DATA_DIR / "tokenizers"
HAVE_TIKTOKEN = importlib.util.find_spec("tiktoken") is not None
COUNTER_VARIABLES = ("COMPACTION_TOKEN_COUNTER", "COMPACTION_TIKTOKEN_ENCODING",
                     "COMPACTION_TIKTOKEN_DIR")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No counter variable leaks in from the shell, and no encoding from another test."""
    for name in COUNTER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    tokens_exact._load.cache_clear()
    yield
    tokens_exact._load.cache_clear()


@pytest.fixture
def tokenizers() -> Path:
    if not HAVE_TIKTOKEN:
        pytest.skip("tiktoken is an optional extra: not installed")
    if not (TOKENIZERS / "o200k_base.tiktoken").is_file():
        pytest.skip(f"tokenizer files not found at {TOKENIZERS} (the ../shared/data kit)")
    return TOKENIZERS


def config_error(**overrides: object) -> str:
    with pytest.raises(ConfigError) as caught:
        load_settings(**overrides)
    return str(caught.value)


# -- the default and the offline tiktoken choice -------------------------------------------
def test_the_heuristic_is_the_default() -> None:
    s = load_settings()
    assert (s.token_counter, s.tiktoken_encoding, s.tiktoken_dir) == (
        "heuristic", "o200k_base", None)
    assert token_counter(s) is DEFAULT_COUNTER
    assert build_runtime(s).store.counter is DEFAULT_COUNTER


def test_the_environment_selects_tiktoken_from_a_directory(
    tokenizers: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMPACTION_TOKEN_COUNTER", "tiktoken")
    monkeypatch.setenv("COMPACTION_TIKTOKEN_DIR", str(tokenizers))
    s = load_settings()
    assert s.tiktoken_dir == tokenizers
    counter = token_counter(s)
    assert isinstance(counter, TiktokenCounter)
    assert counter.encoding_name == "o200k_base"
    assert counter.text("hello world") == 2
    message = Message(role="assistant", content="ok",
                      tool_calls=[ToolCall(id="c1", name="bash", arguments='{"cmd": "ls"}')])
    assert counter.message(message) == TiktokenCounter("o200k_base", tokenizers).message(message)


def test_the_encoding_is_a_setting(tokenizers: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_TOKEN_COUNTER", "tiktoken")
    monkeypatch.setenv("COMPACTION_TIKTOKEN_ENCODING", "cl100k_base")
    monkeypatch.setenv("COMPACTION_TIKTOKEN_DIR", str(tokenizers))
    counter = token_counter(load_settings())
    assert isinstance(counter, TiktokenCounter)
    assert counter.encoding_name == "cl100k_base"
    text = "Привет, как дела? " * 20  # Cyrillic: cl100k needs a third more tokens than o200k
    assert counter.text(text) == TiktokenCounter("cl100k_base", tokenizers).text(text)
    assert counter.text(text) > TiktokenCounter("o200k_base", tokenizers).text(text)


def test_one_counter_object_reaches_store_engine_and_compactor(tokenizers: Path) -> None:
    runtime = build_runtime(load_settings(token_counter="tiktoken", tiktoken_dir=tokenizers))
    counter = runtime.store.counter
    assert isinstance(counter, TiktokenCounter)
    assert runtime.engine.counter is counter
    assert runtime.compactor("other-tenant").counter is counter
    assert runtime.store.for_tenant("other-tenant").counter is counter


def test_a_tenants_compactor_is_built_once_per_process() -> None:
    runtime = build_runtime(load_settings())
    acme = runtime.compactor("acme")
    assert runtime.compactor("acme") is acme and acme.store.tenant == "acme"
    assert runtime.compactor("globex") is not acme
    own = runtime.compactor(runtime.store.tenant).store  # a tenant handle: no raw client
    assert own.tenant == runtime.store.tenant and not hasattr(own, "redis")


def test_the_guard_and_the_stored_totals_use_the_store_counter(tokenizers: Path) -> None:
    """What the README integration relies on: the agent's store carries the counter,
    the guard takes it from there, and the running totals in Redis are its counts."""
    counter = build_counter("tiktoken", encoding_dir=tokenizers)
    store = SessionStore(fakeredis.FakeRedis(), StoreConfig(), counter=counter)
    messages = [Message(role="user", content="List the files, please."),
                Message(role="assistant", content="Here: README.md, setup.py")]
    store.append("s", messages)
    assert ContextGuard(store).counter is counter
    assert store.load_view("s").tokens_total == sum(counter.message(m) for m in messages)
    assert sum(counter.message(m) for m in messages) != sum(
        DEFAULT_COUNTER.message(m) for m in messages)


# -- a tiktoken choice that cannot be loaded stops start-up --------------------------------
def test_a_directory_without_the_file_names_the_variables(tmp_path: Path) -> None:
    message = config_error(token_counter="tiktoken", tiktoken_dir=tmp_path)
    assert "COMPACTION_TOKEN_COUNTER=tiktoken" in message
    assert f"COMPACTION_TIKTOKEN_DIR={tmp_path}" in message
    assert "COMPACTION_TIKTOKEN_ENCODING=o200k_base" in message
    assert ("not readable" in message) or ("pip install" in message)


def test_an_altered_file_is_refused(tmp_path: Path) -> None:
    if not HAVE_TIKTOKEN:
        pytest.skip("tiktoken is an optional extra: not installed")
    (tmp_path / "o200k_base.tiktoken").write_bytes(b"aGVsbG8= 0\n")
    message = config_error(token_counter="tiktoken", tiktoken_dir=tmp_path)
    assert "COMPACTION_TIKTOKEN_DIR" in message
    assert "sha256" in message


def test_an_encoding_with_unknown_checksum_is_refused(tokenizers: Path) -> None:
    message = config_error(token_counter="tiktoken", tiktoken_encoding="p50k_base",
                           tiktoken_dir=tokenizers)
    assert "COMPACTION_TIKTOKEN_ENCODING=p50k_base" in message
    assert "checksum is not known" in message


def test_no_network_and_no_directory_points_at_the_directory_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tiktoken = pytest.importorskip("tiktoken", reason="tiktoken is an optional extra")

    def offline(name: str) -> Any:
        raise OSError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    message = config_error(token_counter="tiktoken")
    assert "COMPACTION_TOKEN_COUNTER=tiktoken" in message
    assert "no network" in message
    assert "set COMPACTION_TIKTOKEN_DIR" in message


def test_tiktoken_not_installed_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_tiktoken(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "tiktoken":
            raise ImportError("No module named 'tiktoken'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tiktoken)
    message = config_error(token_counter="tiktoken", tiktoken_dir=tmp_path)
    assert "COMPACTION_TOKEN_COUNTER=tiktoken" in message
    assert "pip install" in message


def test_the_worker_app_and_the_cli_refuse_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COMPACTION_TOKEN_COUNTER", "tiktoken")
    monkeypatch.setenv("COMPACTION_TIKTOKEN_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="COMPACTION_TOKEN_COUNTER"):
        create_app()
    assert cli_main(["stats", "some-session"]) == 2
    assert "COMPACTION_TOKEN_COUNTER=tiktoken" in capsys.readouterr().err


def test_a_blank_directory_means_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_TIKTOKEN_DIR", "  ")
    assert load_settings().tiktoken_dir is None


def test_an_empty_encoding_name_is_refused() -> None:
    assert "COMPACTION_TIKTOKEN_ENCODING" in config_error(tiktoken_encoding="")


# -- properties -----------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.text(max_size=20).filter(lambda v: v not in COUNTER_KINDS))
def test_any_other_counter_name_is_refused_naming_the_variable(value: str) -> None:
    assert "COMPACTION_TOKEN_COUNTER" in config_error(token_counter=value)
    with pytest.raises(ConfigError, match="token counter"):
        build_counter(value)


@settings(max_examples=40, deadline=None)
@given(encoding=st.text(min_size=1, max_size=20),
       directory=st.none() | st.text(alphabet="abc/._-", min_size=1, max_size=20))
def test_the_heuristic_never_looks_at_the_tiktoken_settings(
    encoding: str, directory: str | None
) -> None:
    s = Settings(tiktoken_encoding=encoding, tiktoken_dir=directory)
    assert token_counter(s) is DEFAULT_COUNTER


@pytest.mark.parametrize(("raw", "value"), [(None, 0.9), ("0.95", 0.95), ("none", None)])
def test_unrecognised_overflows_are_a_policy_setting(monkeypatch: pytest.MonkeyPatch,
                                                     raw: str | None,
                                                     value: float | None) -> None:
    if raw is not None:
        monkeypatch.setenv("COMPACTION_UNRECOGNISED_OVERFLOW_AT", raw)
    assert Settings().policy().unrecognised_overflow_at == value


# -- the unknown-variable warning and the server's own variables ----------------------------
def test_the_servers_variables_are_no_unknown_setting() -> None:
    """docs/server.md's COMPACTION_SERVER_TOKENS_FILE (and every ServerConfig field) is used
    by ``compaction serve``: never "not a setting"; a typo of one is, with the correction."""
    import io

    from workers.server.config import ServerConfig
    from workers.settings import unknown_variables, warn_unknown_variables

    server = {f"COMPACTION_SERVER_{name.upper()}": "x" for name in ServerConfig.model_fields}
    assert "COMPACTION_SERVER_TOKENS_FILE" in server and "COMPACTION_SERVER_PORT" in server
    assert unknown_variables(server) == []
    stream = io.StringIO()
    assert warn_unknown_variables(server, stream) is None and stream.getvalue() == ""
    assert unknown_variables({"COMPACTION_SERVER_TOKEN_FILE": "x"}) == [
        ("COMPACTION_SERVER_TOKEN_FILE", "COMPACTION_SERVER_TOKENS_FILE")]


def test_an_empty_unrecognised_overflow_threshold_is_an_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty is a configuration error, as for every other number: only ``none`` / ``off``
    turn the net off (an empty value used to switch it off without a word)."""
    monkeypatch.setenv("COMPACTION_UNRECOGNISED_OVERFLOW_AT", "")
    with pytest.raises(ConfigError, match="COMPACTION_UNRECOGNISED_OVERFLOW_AT=''") as raised:
        load_settings()
    # the line names the fix (it used to say only "Input should be a valid number"): a
    # blank meant off before 55704c3, so whoever upgrades with one needs the word for off
    assert "`off`" in str(raised.value) and "number" in str(raised.value), raised.value
    for word in ("none", "off", "never", " Off "):
        monkeypatch.setenv("COMPACTION_UNRECOGNISED_OVERFLOW_AT", word)
        assert load_settings().unrecognised_overflow_at is None


def test_every_variable_the_code_names_is_one_the_settings_read() -> None:
    """A message that tells the operator to set ``COMPACTION_X`` names a variable the
    settings read: ``compaction doctor``'s eviction warning and the store's out-of-memory
    error said ``COMPACTION_SESSION_TTL``, which the settings ignore with a "not a
    setting" warning (the setting is ``COMPACTION_SESSION_TTL_SECONDS``)."""
    import re
    from pathlib import Path

    from workers.settings import known_variables
    from workers.settings_sources import unknown_among

    top = Path(__file__).resolve().parents[1]
    named = {(name, str(path.relative_to(top)))
             for path in [*(top / "workers").rglob("*.py"), *(top / "shared").rglob("*.py")]
             for text in [path.read_text()]
             for name in re.findall(r"COMPACTION_[A-Z0-9_]+", text)
             # a prefix (COMPACTION_SERVER_*, COMPACTION_<NAME>), a docstring's placeholder,
             # or a constant the module defines (COMPACTION_KINDS)
             if not name.endswith("_") and name != "COMPACTION_X"
             and not re.search(rf"^{name}\b.*=", text, re.MULTILINE)}
    unknown = sorted((name, where) for name, where in named
                     if unknown_among({name: "1"}, known_variables()))
    assert unknown == []
