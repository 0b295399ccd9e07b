"""URLs fit for a log line (gym_concurrency.safe_urls): every password and token masked, in
the userinfo and in the query, the rest of the URL exactly as written."""

from __future__ import annotations

import logging

import pytest

from gym_concurrency.safe_urls import safe_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:pw@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:pw@host/0", "redis://:***@host/0"),
        ("redis://host:6379/0", "redis://host:6379/0"),  # nothing secret: as written
        (
            "redis+sentinel://u:pw@s1:26379,s2:26379/mymaster/0?sentinel_password=SP&ssl=true",
            "redis+sentinel://u:***@s1:26379,s2:26379/mymaster/0?sentinel_password=***&ssl=true",
        ),
        ("redis://h/0?password=p&db=2", "redis://h/0?password=***&db=2"),
        ("redis://h/0?PASSWORD=p", "redis://h/0?PASSWORD=***"),
        ("redis://h/0?Sentinel_Password=p", "redis://h/0?Sentinel_Password=***"),
        ("https://h/v1?token=t&model=m", "https://h/v1?token=***&model=m"),
        ("https://h/v1?access_token=t", "https://h/v1?access_token=***"),
        ("https://h/v1?client_secret=s&x=1", "https://h/v1?client_secret=***&x=1"),
        ("https://h/v1?x-api-key=k", "https://h/v1?x-api-key=***"),
        ("https://h/v1?key=k", "https://h/v1?key=***"),
        ("https://h/v1?pass%77ord=p", "https://h/v1?pass%77ord=***"),  # read unquoted
        ("https://h/v1#id_token=t&state=s", "https://h/v1#id_token=***&state=s"),
        ("unix:///run/redis.sock?password=p&db=1", "unix:///run/redis.sock?password=***&db=1"),
        (
            "rediss://h/0?ssl_cert_reqs=required&ssl_keyfile=/k.pem&socket_timeout=5",
            "rediss://h/0?ssl_cert_reqs=required&ssl_keyfile=/k.pem&socket_timeout=5",
        ),
        ("redis://[::1/0?password=p", "redis://[::1/0?password=***"),  # not a URL: masked still
    ],
)
def test_passwords_and_tokens_are_masked_and_the_rest_kept(url: str, shown: str) -> None:
    assert safe_url(url) == shown


async def test_a_shared_limit_s_messages_mask_the_sentinel_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from gym_concurrency import SharedLimit

    url = "redis+sentinel://u:MASTERPW@127.0.0.1:1/svc?sentinel_password=SENTINELPW"
    limit = SharedLimit(1, redis_url=url, key="masked", redis_timeout=0.2)
    with caplog.at_level(logging.WARNING):
        try:
            await limit.connect()
        finally:
            await limit.close()
    text = caplog.text + repr(limit.statistics())
    assert "sentinel_password=***" in caplog.text, caplog.text
    assert "MASTERPW" not in text
    assert "SENTINELPW" not in text
