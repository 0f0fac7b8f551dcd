"""workers.runtime.redis_urls: the ``redis+sentinel://`` form (failover against real Sentinels is
covered in tests/system/test_sentinel.py; settings refusals in tests/dashboard/test_settings.py)."""

from __future__ import annotations

import pytest

from workers.runtime.redis_urls import (
    SentinelTarget,
    is_sentinel_url,
    parse_sentinel_url,
    safe_sentinel_url,
)


def test_full_form_parses() -> None:
    t = parse_sentinel_url("redis+sentinel://bob:p%40ss@s1:26380,s2,[::1]:5/my%20svc/3")
    assert t == SentinelTarget(
        sentinels=(("s1", 26380), ("s2", 26379), ("::1", 5)),
        service="my svc",
        db=3,
        username="bob",
        password="p@ss",
    )


def test_bare_password_and_empty_user() -> None:
    assert parse_sentinel_url("redis+sentinel://secret@h/svc").password == "secret"
    assert parse_sentinel_url("redis+sentinel://secret@h/svc").username is None
    t = parse_sentinel_url("redis+sentinel://:pw@h/svc")
    assert (t.username, t.password, t.db) == (None, "pw", 0)
    assert parse_sentinel_url("REDIS+SENTINEL://h/svc").sentinels == (("h", 26379),)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis://h/0", "not a redis"),
        ("redis+sentinel:h/svc", "not a redis"),
        ("redis+sentinel:///svc", "at least one Sentinel"),
        ("redis+sentinel://h", "master group name"),
        ("redis+sentinel://h/", "master group name"),
        ("redis+sentinel://h/svc/x", "/<service>/<db number>"),
        ("redis+sentinel://h/svc/1/2", "/<service>/<db number>"),
        ("redis+sentinel://h:notaport/svc", "bad Sentinel port"),
        ("redis+sentinel://h:99999/svc", "bad Sentinel port"),
        ("redis+sentinel://h,,k/svc", "empty Sentinel host"),
        ("redis+sentinel://h/svc?db=1", "no query"),
        ("redis+sentinel://h/svc#x", "no query"),
    ],
)
def test_refusals_name_what_is_wrong(url: str, why: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_sentinel_url(url)
    assert why in str(info.value)


def test_safe_url_round_trips_without_the_password() -> None:
    url = "redis+sentinel://u:hunter2@a:1,b/svc/2"
    t = parse_sentinel_url(url)
    safe = safe_sentinel_url(t)
    assert "hunter2" not in safe
    assert safe == "redis+sentinel://***@a:1,b:26379/svc/2"
    again = parse_sentinel_url(safe)
    assert (again.sentinels, again.service, again.db) == (t.sentinels, t.service, t.db)
    plain = parse_sentinel_url("redis+sentinel://a/svc")
    assert parse_sentinel_url(safe_sentinel_url(plain)) == plain


def test_is_sentinel_url() -> None:
    assert is_sentinel_url("redis+sentinel://h/s")
    assert is_sentinel_url("Redis+Sentinel://h/s")
    assert not is_sentinel_url("redis://h:6379/0")
    assert not is_sentinel_url("unix:///tmp/r.sock")
