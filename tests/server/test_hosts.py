"""Which Host and Origin values `server.hosts` lets through, for each kind of bind address."""

from __future__ import annotations

import pytest

from extras_needed import needs

pytest.importorskip("starlette", reason=needs("server"))

from perdure.server.hosts import hosts_for, split_host


@pytest.mark.parametrize(
    ("value", "parsed"),
    [("127.0.0.1:8000", ("127.0.0.1", 8000)), ("[::1]:80", ("::1", 80)),
     ("Example.COM", ("example.com", None)), ("::1", None), ("a:b", None), ("a:0", None),
     ("[::1", None), ("", None), (":80", None)],
)  # fmt: skip
def test_split_host(value: str, parsed: tuple[str, int | None] | None) -> None:
    assert split_host(value) == parsed


def test_loopback_bind() -> None:
    allowed = hosts_for("127.0.0.1", 8765)
    assert all(allowed.allows_host(h) for h in ("127.0.0.1:8765", "localhost:8765", "[::1]:8765"))
    assert allowed.allows_host("127.0.0.1")  # no port: no page on another port sends that
    foreign = ("evil.example:8765", "evil.example", "127.0.0.1:1", "10.0.0.1:8765", None)
    assert not any(allowed.allows_host(h) for h in foreign)
    assert allowed.allows_origin(None) and allowed.allows_origin("http://localhost:8765")
    assert not allowed.allows_origin("http://localhost:9999")
    assert not allowed.allows_origin("file://") and not allowed.allows_origin("null")


def test_every_interface_allows_ip_literals_but_no_foreign_name() -> None:
    allowed = hosts_for("0.0.0.0", 8000)
    assert allowed.allows_host("192.168.1.5:8000") and allowed.allows_host("[fe80::1]:8000")
    assert not allowed.allows_host("evil.example:8000")
    assert allowed.patterns() is None  # the SDK's lists cannot say "any IP"


def test_names_and_star() -> None:
    allowed = hosts_for("127.0.0.1", 80, ["perdure.example", "proxy.example:8443"])
    assert allowed.allows_host("localhost") and allowed.allows_host("perdure.example:1234")
    assert allowed.allows_host("proxy.example:8443") and not allowed.allows_host("proxy.example")
    assert allowed.allows_origin("https://perdure.example")
    hosts, origins = allowed.patterns() or ([], [])
    assert "http://localhost" in origins  # port 80: an Origin without a port is ours
    assert {"localhost", "perdure.example", "perdure.example:*", "proxy.example:8443"} <= set(hosts)
    assert "https://perdure.example:*" in origins
    assert hosts_for("127.0.0.1", 80, ["*"]).allows_host("anything.example")


def test_sdk_patterns_follow_the_port() -> None:
    hosts, origins = hosts_for("127.0.0.1", 8765).patterns() or ([], [])
    assert {"127.0.0.1:8765", "[::1]:8765", "localhost", "127.0.0.1"} <= set(hosts)
    assert "http://localhost:8765" in origins and "http://localhost" not in origins
