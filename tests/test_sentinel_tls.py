"""Redis Sentinel over TLS: the store's ``rediss+sentinel://`` URL and a ``sentinel://``
broker with ``ssl_*`` options, against a deployment where every process (data nodes and
Sentinels) listens on TLS only and asks for client certificates
(:mod:`workers.harness.stack.sentinel_pair` with ``tls``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import closing

import pytest
import redis

from shared.core.config import StoreConfig
from shared.core.errors import InvalidInput, StoreUnavailable
from shared.enqueue import publisher_app, sentinel_broker_tls
from shared.store.sentinel import FollowingSSLConnection, parse_sentinel_url
from shared.store.sessions import SessionStore, connect
from tests.test_sentinel import SHELLS, Shell, _ride_out, worker_compacts_through
from workers.app import celery_config
from workers.cli.main import main
from workers.harness.stack.sentinel_pair import SentinelDeployment, start_sentinel_deployment
from workers.harness.stack.tls_files import KEY_PASSPHRASE, TLSFiles, make_tls_files
from workers.settings import Settings
from workers.settings_urls import redact_url

TURN = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_tls_files(tmp_path_factory.mktemp("sentinel-tls"))


# -- URLs and settings (no servers) ---------------------------------------------------------
def test_the_tls_url_carries_the_rediss_options_for_sentinels_and_nodes(
        tls_files: TLSFiles) -> None:
    parsed = parse_sentinel_url(
        f"rediss+sentinel://u:pw@127.0.0.1:26380,h2/svc/3?{tls_files.query()}"
        "&ssl_cert_reqs=required&ssl_check_hostname=false&sentinel_password=sp")
    assert (parsed.service, parsed.db, parsed.sentinel_password) == ("svc", 3, "sp")
    assert parsed.tls_kwargs() == {"ssl": True, **tls_files.client_kwargs(),
                                   "ssl_cert_reqs": "required", "ssl_check_hostname": False}
    assert parse_sentinel_url("RediSS+sentinel://h/svc").tls_kwargs() == {"ssl": True}
    assert parse_sentinel_url("redis+sentinel://h/svc").tls_kwargs() == {}


@pytest.mark.parametrize("query, why", [
    ("ssl_ca_certs=/no/such/ca.crt", "ssl_ca_certs: no such file"),
    ("ssl_ca_path=/no/such/dir", "ssl_ca_path: no such directory"),
    ("ssl_cert_reqs=maybe", "ssl_cert_reqs must be one of none, optional, required"),
    ("ssl_min_version=tls1.2", "ssl_min_version: cannot read"),
    ("ssl_verify=1", "unknown TLS option ssl_verify"),
    ("password=x", "unknown option"),
])
def test_a_bad_tls_option_is_named(query: str, why: str) -> None:
    with pytest.raises(InvalidInput, match=why) as info:
        parse_sentinel_url(f"rediss+sentinel://h/svc?{query}")
    assert info.value.field == "url"


def test_tls_options_need_the_tls_scheme_and_a_key_its_certificate(
        tls_files: TLSFiles) -> None:
    with pytest.raises(InvalidInput, match="need the rediss\\+sentinel:// scheme"):
        parse_sentinel_url(f"redis+sentinel://h/svc?ssl_ca_certs={tls_files.ca}")
    with pytest.raises(InvalidInput, match="ssl_keyfile needs ssl_certfile"):
        parse_sentinel_url(f"rediss+sentinel://h/svc?ssl_keyfile={tls_files.key('client')}")


def test_settings_check_a_tls_store_url_and_redact_its_secrets(
        tls_files: TLSFiles, monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.core.errors import ConfigError
    from workers.settings import load_settings

    good = (f"rediss+sentinel://u:topsecret@127.0.0.1:26379/svc/0?{tls_files.query()}"
            "&ssl_password=keysecret&sentinel_password=sentsecret")
    assert Settings(redis_url=good).redis_url == good
    shown = redact_url(good)
    assert not any(secret in shown for secret in ("topsecret", "keysecret", "sentsecret"))
    assert "ssl_password=***" in shown and "u:***@" in shown
    monkeypatch.setenv("COMPACTION_REDIS_URL", good + "&ssl_cert_reqs=maybe")
    with pytest.raises(ConfigError, match="COMPACTION_REDIS_URL") as info:
        load_settings()
    assert "ssl_cert_reqs" in str(info.value)
    assert "topsecret" not in str(info.value) and "keysecret" not in str(info.value)


def test_a_tls_sentinel_broker_becomes_kombu_sentinel_kwargs_and_broker_use_ssl(
        tls_files: TLSFiles) -> None:
    first = f"sentinel://127.0.0.1:26379/1?{tls_files.query()}"
    broker = f"{first};sentinel://127.0.0.1:26380/1"
    settings = Settings(broker_url=broker, broker_sentinel_master="svc")
    config = celery_config(settings)
    assert config["broker_use_ssl"] == tls_files.client_kwargs()
    assert config["broker_transport_options"]["sentinel_kwargs"] == {
        "ssl": True, **tls_files.client_kwargs(), "socket_timeout": 5,
        "socket_connect_timeout": 5}
    assert celery_config(Settings(broker_url="sentinel://h:26379/1",
                                  broker_sentinel_master="svc"))["broker_use_ssl"] is False
    # kombu reads the first URL's options and forgets them when it moves to the next URL:
    # broker_use_ssl keeps the nodes on TLS there
    app = publisher_app(broker, sentinel_master="svc")
    with app.connection_for_write() as conn:
        conn.maybe_switch_next()
        assert conn.hostname == "127.0.0.1" and conn.port == 26380
        assert conn.ssl == tls_files.client_kwargs()


@pytest.mark.parametrize("broker, why", [
    ("sentinel://h:1/1?ssl_ca_certs=/no/such/ca.crt", "ssl_ca_certs: no such file"),
    ("sentinel://h:1/1;sentinel://h:2/1?ssl_cert_reqs=none", "different ssl_\\* options"),
    ("sentinel://h:1/1?ssl_min_version=3", "not supported on a sentinel:// broker"),
])
def test_bad_tls_options_of_a_sentinel_broker_are_named(broker: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Settings(broker_url=broker, broker_sentinel_master="svc")


def test_only_sentinel_lists_with_ssl_options_are_tls() -> None:
    assert sentinel_broker_tls("sentinel://h:1/1;sentinel://h:2/1") is None
    assert sentinel_broker_tls("rediss://h:1/1?ssl_cert_reqs=required") is None
    assert sentinel_broker_tls("sentinel://h:1/1?ssl_cert_reqs=required;"
                               "sentinel://h:2/1?ssl_cert_reqs=required") == {
        "ssl_cert_reqs": "required"}


# -- a real deployment, TLS only -------------------------------------------------------------
@pytest.fixture
def deployment(tls_files: TLSFiles) -> Iterator[SentinelDeployment]:
    with start_sentinel_deployment(tls=tls_files) as running:
        yield running


class TLSShell(Shell):
    """:class:`tests.test_sentinel.Shell` reading the servers over TLS."""

    def __init__(self, kind: str, deployment: SentinelDeployment, url: str) -> None:
        super().__init__(kind, url)
        self.deployment = deployment

    def log_length_on(self, port: int, sid: str, db: int = 0) -> int:
        with closing(self.deployment.client(port)) as direct:
            direct.select(db)
            return int(direct.llen(self.store.keys(sid).log))


@pytest.fixture(params=SHELLS)
def shell_on(request: pytest.FixtureRequest,
             deployment: SentinelDeployment) -> Iterator[Callable[[str], Shell]]:
    made: list[Shell] = []

    def make(url: str) -> Shell:
        made.append(TLSShell(request.param, deployment, url))
        return made[-1]

    yield make
    for shell in made:
        shell.close()


def test_the_guard_records_through_a_tls_sentinel_url(
        deployment: SentinelDeployment, shell_on: Callable[[str], Shell]) -> None:
    shell = shell_on(deployment.url(2))
    assert [shell.turn("s1", i) for i in range(5)] == [2, 4, 6, 8, 10]
    assert shell.log_length_on(deployment.primary_port(), "s1", db=2) == 10
    if shell.kind == "sync":
        pool = shell.store.redis.connection_pool
        assert pool.connection_class is FollowingSSLConnection
        sentinel = pool.sentinel_manager.sentinels[0].connection_pool
        assert sentinel.connection_class is redis.SSLConnection


def test_plaintext_and_certificate_less_clients_are_refused(
        deployment: SentinelDeployment, tls_files: TLSFiles) -> None:
    """The deployment is TLS only: the plain URL reaches no Sentinel (a typed outage),
    neither a node nor a Sentinel answers plain TCP, and TLS without the client
    certificate is refused too."""
    config = StoreConfig(key_prefix="ts", socket_timeout=0.5, connect_timeout=0.5)
    plain = SessionStore(connect(deployment.url().replace("rediss+", "redis+").split("?")[0],
                                 config), config)
    with pytest.raises(StoreUnavailable):
        plain.append("s1", TURN)
    plain.redis.close()
    for port in (deployment.primary_port(), deployment.sentinel_ports[0]):
        with closing(redis.Redis(port=port, socket_timeout=0.5)) as bare, \
                pytest.raises(redis.exceptions.ConnectionError):
            bare.ping()
        with closing(redis.Redis(port=port, socket_timeout=0.5, ssl=True,
                                 ssl_ca_certs=str(tls_files.ca))) as anonymous, \
                pytest.raises(redis.exceptions.ConnectionError):
            anonymous.ping()
    with closing(deployment.client(deployment.primary_port())) as trusted:
        assert trusted.ping()


def test_after_a_planned_failover_over_tls_no_acknowledged_turn_is_lost(
        deployment: SentinelDeployment, shell_on: Callable[[str], Shell]) -> None:
    """As ``test_sentinel``'s planned failover, every link on TLS: within a follow
    interval the calls reach the new primary and it holds every turn acknowledged."""
    shell = shell_on(deployment.url())
    done = sum(1 for i in range(5) if shell.turn("s1", i))
    old = deployment.primary_port()
    deployment.failover()
    new = deployment.wait_primary_not(old)
    time.sleep(1.2)
    length = shell.turn("s1", done)
    assert shell.log_length_on(new, "s1") >= length, "the call went to the old primary"
    done, failures = _ride_out(shell, "s1", done + 1,
                               lambda: shell.log_length_on(new, "s1") >= 2 * 3)
    assert all(isinstance(f, StoreUnavailable) for f in failures)
    assert shell.turn("s1", done) == shell.log_length_on(new, "s1")


def test_the_publisher_reaches_tls_only_sentinels_and_primary(
        deployment: SentinelDeployment) -> None:
    """kombu asks the Sentinels with its ``sentinel_kwargs`` (plain TCP without them, with
    only the data nodes on TLS: this failed) and writes to the primary over TLS."""
    app = publisher_app(deployment.broker_url(1), timeout=2.0,
                        sentinel_master=deployment.service)
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1)
        client = conn.default_channel.client
        client.set("published", "1")
    with closing(deployment.client(deployment.primary_port())) as direct:
        direct.select(1)
        assert direct.get("published") == b"1"


def test_doctor_with_an_encrypted_client_key_never_prints_its_pass_phrase(
        deployment: SentinelDeployment, tls_files: TLSFiles, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The key's pass phrase reaches every link (Sentinels and primary, store and broker:
    each check but the workers' passes; no worker runs) and is shown as ``***``."""
    encrypted = f"ssl_keyfile={tls_files.key('client-enc')}&ssl_password={KEY_PASSPHRASE}"

    def with_encrypted_key(url: str) -> str:
        return url.replace(f"ssl_keyfile={tls_files.key('client')}", encrypted)

    monkeypatch.setenv("COMPACTION_REDIS_URL", with_encrypted_key(deployment.url(3)))
    monkeypatch.setenv("COMPACTION_BROKER_URL", with_encrypted_key(deployment.broker_url(4)))
    monkeypatch.setenv("COMPACTION_BROKER_SENTINEL_MASTER", deployment.service)
    code = main(["doctor", "--timeout", "2", "--json"])
    out, err = capsys.readouterr()
    found = {c["name"]: c["verdict"] for c in json.loads(out)}
    assert code == 1 and found.pop("workers") == "FAIL", out
    assert found.pop("guard reads") == "OK", out  # the feed follows the primary
    assert set(found.values()) == {"OK"}, out
    assert KEY_PASSPHRASE not in out + err and "ssl_password=***" in out


@pytest.mark.celery
def test_a_worker_on_a_tls_sentinel_broker_compacts_a_session(
        deployment: SentinelDeployment) -> None:
    """Store and broker on the TLS deployment: the worker consumes through kombu's
    Sentinel transport over TLS."""
    worker_compacts_through(deployment, "sentinel-tls", 30)
