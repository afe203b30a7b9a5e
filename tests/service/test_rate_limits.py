"""The rate limits as the `limits` package counts them: one count in Redis for every API
replica, this process's own when Redis does not answer, `Retry-After` from the moving
window (real Redis)."""

from __future__ import annotations

import logging
import uuid

import pytest
import redis

from service.errors import RateLimited
from service.rate_limits import RateLimit, auth_failures_per_address, requests_per_key
from tests.conftest import REDIS_URL


def test_replicas_draw_from_one_count_under_the_documented_key(redis_prefix: str) -> None:
    prefix = f"{redis_prefix}{uuid.uuid4().hex[:6]}:"
    one, two = (requests_per_key(REDIS_URL, 3, key_prefix=prefix) for _ in range(2))
    assert one.shared and two.shared
    assert [one.hit("alice"), two.hit("alice"), one.hit("alice")] == [None, None, None]
    wait = two.hit("alice")
    assert wait is not None and 55 < wait <= 60  # the first request leaves the window
    assert one.blocked("alice") is not None  # looking does not count
    assert one.hit("bob") is None  # another key, another count
    with pytest.raises(RateLimited) as refused:
        two.check("alice")
    assert refused.value.code == "rate_limited"
    assert int(refused.value.headers["Retry-After"]) >= 55
    keys = {k.decode() for k in redis.Redis.from_url(REDIS_URL).scan_iter(f"{prefix}*")}
    assert keys == {
        f"{prefix}torchport:ratelimit/alice/3/60/second",
        f"{prefix}torchport:ratelimit/bob/3/60/second",
    }


def test_without_redis_each_process_counts_alone(caplog: pytest.LogCaptureFixture) -> None:
    limit = requests_per_key("redis://127.0.0.1:1/0", 2, key_prefix="nowhere:")
    with caplog.at_level(logging.WARNING, logger="service.rate_limits"):
        assert [limit.hit("alice"), limit.hit("alice")] == [None, None]
        assert limit.hit("alice") is not None
        assert limit.blocked("alice") is not None
    warnings = [r for r in caplog.records if r.name == "service.rate_limits"]
    assert len(warnings) == 4 and {r.levelno for r in warnings} == {logging.WARNING}


def test_embedded_broker_counts_in_the_process() -> None:
    limit = requests_per_key("filesystem://", 1, key_prefix=None)
    assert not limit.shared
    assert limit.hit("alice") is None
    assert limit.hit("alice") is not None


@pytest.mark.parametrize(
    ("burst", "per_minute", "window_s"), [(20, 30, 40), (5, 1, 300), (1, 600, 1)]
)
def test_auth_failures_count_for_burst_over_rate_minutes(
    burst: int, per_minute: int, window_s: int
) -> None:
    limit = auth_failures_per_address("filesystem://", burst, per_minute, key_prefix=None)
    assert (limit.item.amount, limit.item.get_expiry()) == (burst, window_s)
    assert [limit.hit("203.0.113.7") for _ in range(burst)] == [None] * burst
    wait = limit.blocked("203.0.113.7")
    assert wait is not None and 0 < wait <= window_s
    assert limit.blocked("203.0.113.8") is None


def test_a_custom_name_keeps_its_counts_apart() -> None:
    first = RateLimit(1, 60, name="first")
    second = RateLimit(1, 60, name="second")
    assert first.hit("x") is None and second.hit("x") is None
    assert first.hit("x") is not None
