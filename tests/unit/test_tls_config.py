"""TLS settings: acceptor keys, connector URLs, cert-user-mapping, client URLs (tcps://, ca/cert/key)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.client.options import parse_url
from tandem.client.tls import split_server
from tandem.config import AcceptorConfig, BrokerConfig, CertUserMapping, ConnectorConfig, load_config, split_connector
from tandem.errors import ConfigError, InvalidArgument


def load(tmp_path: Path, text: str) -> BrokerConfig:
    f = tmp_path / "broker.toml"
    f.write_text(text)
    return load_config(f)


def test_acceptor_tls_keys_load_with_defaults(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        '[[acceptors]]\nname = "n"\nssl-enabled = true\ncert-path = "s.pem"\nkey-path = "k.pem"\n'
        'trust-store-path = "ca.pem"\nneed-client-auth = true\n'
        'enabled-cipher-suites = ["ECDHE-ECDSA-AES128-GCM-SHA256"]\n',
    )
    acc = cfg.acceptors[0]
    assert (acc.ssl_enabled, acc.cert_path, acc.key_path, acc.trust_store_path) == (True, "s.pem", "k.pem", "ca.pem")
    assert acc.need_client_auth and acc.enabled_protocols == ["TLSv1.2", "TLSv1.3"]
    assert AcceptorConfig().ssl_enabled is False


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ("ssl-enabled = true\n", "needs `cert-path` and `key-path`"),
        ('ssl-enabled = true\ncert-path = "s"\nkey-path = "k"\nneed-client-auth = true\n', "trust-store-path"),
        ('ssl-enabled = true\ncert-path = "s"\nkey-path = "k"\nenabled-protocols = ["TLSv1.1"]\n', "TLSv1.2"),
        ('ssl-enabled = true\ncert-path = "s"\nkey-path = "k"\nenabled-protocols = []\n', "enabled-protocols"),
    ],
)
def test_bad_acceptor_tls_settings_are_refused(tmp_path: Path, lines: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, f'[[acceptors]]\nname = "n"\n{lines}')


def test_connectors_may_say_tcps(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        '[[connectors]]\nname = "a"\nurl = "tcps://127.0.0.1:7000"\ntrust-store-path = "ca.pem"\n'
        '[[connectors]]\nname = "b"\nurl = "tcp://127.0.0.1:7001"\n'
        '[[connectors]]\nname = "c"\nurl = "127.0.0.1:7002"\n',
    )
    assert [cfg.connector_url(n) for n in "abc"] == ["tcps://127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"]
    assert cfg.link_options("tcps://127.0.0.1:7000") == {
        "ssl": True,
        "ca": "ca.pem",
        "cert": None,
        "key": None,
        "verify_host": True,
    }
    assert cfg.link_options("127.0.0.1:7001") == {}
    assert split_connector("tcps://[::1]:5") == ("::1", 5, True)
    with pytest.raises(ConfigError, match="host:port"):
        load(tmp_path, '[[connectors]]\nname = "a"\nurl = "ssl://h:1"\n')
    assert ConnectorConfig("x", "tcps://h:1").link_options()["ssl"] is True


def test_cert_user_mapping(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        '[[cert-user-mapping]]\nuser = "app"\ncn = "app-client"\n'
        '[[cert-user-mapping]]\nuser = "ops"\nsubject = "CN=ops-[0-9]+,O=Example"\n',
    )
    app, ops = cfg.cert_user_mapping
    assert app.matches("app-client", "CN=app-client,O=Example") and not app.matches("app-client2", "CN=x")
    assert ops.matches(None, "CN=ops-12,O=Example")
    assert not ops.matches(None, "CN=ops-12,O=Example,C=FR")  # the whole subject must match
    for bad in ('user = "x"\n', 'user = "x"\ncn = "a"\nsubject = "b"\n', 'user = "x"\nsubject = "("\n'):
        with pytest.raises(ConfigError, match="cert-user-mapping"):
            load(tmp_path, f"[[cert-user-mapping]]\n{bad}")
    assert CertUserMapping("u", cn="c").matches("c", "")


def test_client_urls() -> None:
    hosts, opts = parse_url("tcps://a:1,tcps://b:2?ca=/x/ca.pem&cert=c.pem&key=k.pem")
    assert hosts == [("a", 1), ("b", 2)] and opts.ssl and opts.verify_host
    assert (opts.ca, opts.cert, opts.key) == ("/x/ca.pem", "c.pem", "k.pem")
    assert parse_url("tcp://a:1?ssl=true&verify_host=false")[1].ssl
    assert not parse_url("tcp://a:1?ssl=true&verify_host=false")[1].verify_host
    assert not parse_url("tcp://a:1")[1].ssl
    for bad, why in (
        ("tcp://a:1,tcps://b:2", "mixes"),
        ("tcps://a:1?ssl=false", "ssl=false"),
        ("tcps://a:1?cert=c.pem", "go together"),
        ("ssl://a:1", "scheme"),
    ):
        with pytest.raises(InvalidArgument, match=why):
            parse_url(bad)


def test_topology_entries_carry_tls() -> None:
    assert split_server("tcps://127.0.0.1:5") == ("127.0.0.1", 5, True)
    assert split_server("127.0.0.1:5") == ("127.0.0.1", 5, False)
    assert split_server("tcps://[::1]:5") == ("::1", 5, True)
    assert split_server("nonsense") is None


def test_spark_options_pass_tls_through() -> None:
    from tandem.spark.options import ReadOptions

    opts = ReadOptions.parse(
        {"url": "tcps://h:61617", "queue": "q", "ca": "/x/ca.pem", "CERT": "c.pem", "key": "k.pem"}
    )
    assert opts.url == "tcps://h:61617"
    assert opts.client == {"ca": "/x/ca.pem", "cert": "c.pem", "key": "k.pem"}
