"""The standalone login's throttle on a clock the test sets: free failures, then refusals for a
doubling interval up to its cap, a success or a quiet day forgetting a key, a table that never
holds more keys than its capacity however many addresses fail, IPv6 clients counted by /64,
and user names by a digest of fixed size."""

from __future__ import annotations

from pgqueue.dashboard.throttle import (
    ADDRESS_FREE_FAILURES,
    FORGET_AFTER,
    MAX_DELAY,
    USER_FREE_FAILURES,
    LoginThrottle,
    Throttle,
    address_key,
    user_key,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_free_failures_then_a_doubling_wait_up_to_the_cap() -> None:
    clock = Clock()
    throttle = Throttle(free=3, first_delay=1.0, max_delay=60.0, clock=clock)
    assert [throttle.failed("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    waits = []
    for _ in range(9):
        waits.append(throttle.failed("a"))
        assert throttle.wait("a") == waits[-1]
        clock.now += waits[-1]
        assert throttle.wait("a") == 0.0
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    assert throttle.wait("b") == 0.0  # another key is not held back
    # Thousands of failures never overflow the interval.
    for _ in range(5000):
        throttle.failed("a")
    assert throttle.wait("a") == 60.0


def test_a_success_or_a_quiet_day_forgets_the_failures() -> None:
    clock = Clock()
    throttle = Throttle(free=2, clock=clock)
    for _ in range(4):
        throttle.failed("a")
    assert throttle.wait("a") > 0
    throttle.succeeded("a")
    assert throttle.wait("a") == 0.0
    assert throttle.failed("a") == 0.0  # free failures again
    for _ in range(4):
        throttle.failed("b")
    clock.now += FORGET_AFTER + MAX_DELAY
    throttle.failed("c")  # a failure sweeps out what is old
    assert len(throttle) == 1
    assert throttle.failed("b") == 0.0


def test_many_addresses_never_grow_the_table_past_its_capacity() -> None:
    clock = Clock()
    logins = LoginThrottle(capacity=100, clock=clock)
    for n in range(5000):
        logins.failed(f"198.51.{n // 256}.{n % 256}", f"user{n}")
        clock.now += 0.001
    assert len(logins.addresses) == 100 and len(logins.users) == 100


def test_an_address_and_a_user_name_each_hold_a_login_back() -> None:
    logins = LoginThrottle(clock=Clock())
    for _ in range(ADDRESS_FREE_FAILURES):
        assert logins.failed("192.0.2.1", None) == 0.0
    assert logins.failed("192.0.2.1", None) > 0
    assert logins.wait("192.0.2.1", "anyone") > 0
    assert logins.wait("192.0.2.2", None) == 0.0
    # One name tried from many addresses: held back everywhere once its free failures are used.
    for n in range(USER_FREE_FAILURES):
        assert logins.failed(f"203.0.113.{n}", "ada") == 0.0
    assert logins.failed("203.0.113.200", "ada") > 0
    assert logins.wait("203.0.113.201", "ada") > 0
    assert logins.wait("203.0.113.201", "bob") == 0.0
    logins.succeeded("203.0.113.201", "ada")
    assert logins.wait("203.0.113.202", "ada") == 0.0


def test_keys() -> None:
    assert address_key("2001:db8:1:2:3:4:5:6") == address_key("2001:db8:1:2:ffff::1")
    assert address_key("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")
    assert address_key("::ffff:192.0.2.7") == address_key("192.0.2.7") == "192.0.2.7"
    assert address_key(None) == address_key("") == "unknown"
    assert len(user_key("a" * 100_000)) == len(user_key("")) == 64
    assert user_key("ada") != user_key("Ada")
