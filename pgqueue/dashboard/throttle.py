"""How the standalone dashboard's login form slows down guessing: failed logins counted per
client address and per user name, in this process's memory.

After ``free`` failures of one key, each further failure refuses that key's attempts for a
growing interval (``first_delay``, doubling, at most ``max_delay``), unchecked: a refused
attempt tests no password and does not count. A success forgets its keys; so does a day without
a failure. Each table holds at most ``capacity`` keys, the least recently failed dropped first,
so an attacker with many addresses or names cannot grow it without limit: to push one locked
key out it must first fail ``capacity`` times with other keys, each of which the throttle
counts too. User names are kept as digests, so a long name costs no more memory than a short
one. An IPv6 client counts by its /64, the block one subscriber usually holds whole.

The standalone server is one process, so its memory is the whole picture; behind a load
balancer each process counts alone (a guesser spread over N processes gets N times the tries).
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

# Failed logins one address may make before it waits; a name gets more, as the name is shared
# by its owner and whoever guesses at it, and every address counts against it.
ADDRESS_FREE_FAILURES: Final = 5
USER_FREE_FAILURES: Final = 10
FIRST_DELAY: Final = 1.0
MAX_DELAY: Final = 900.0
FORGET_AFTER: Final = 24 * 3600.0
CAPACITY: Final = 10_000
# Long enough for any address or digest; a key is cut to it so none grows the table's memory.
MAX_KEY_LENGTH: Final = 64


@dataclass(slots=True)
class _Failures:
    count: int
    last: float
    locked_until: float


class Throttle:
    """Failures counted per key (see the module). Safe to share between threads."""

    def __init__(
        self,
        *,
        free: int,
        first_delay: float = FIRST_DELAY,
        max_delay: float = MAX_DELAY,
        forget_after: float = FORGET_AFTER,
        capacity: int = CAPACITY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free = free
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.forget_after = forget_after
        self.capacity = capacity
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: OrderedDict[str, _Failures] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def wait(self, key: str) -> float:
        """Seconds before ``key`` may try again; 0 when it may now."""
        now = self._clock()
        with self._lock:
            found = self._keys.get(key[:MAX_KEY_LENGTH])
            return 0.0 if found is None else max(0.0, found.locked_until - now)

    def failed(self, key: str) -> float:
        """Count a failure of ``key``; the seconds it must now wait (0 while it has free
        failures left)."""
        key = key[:MAX_KEY_LENGTH]
        now = self._clock()
        with self._lock:
            self._forget_old(now)
            found = self._keys.pop(key, None)
            if found is None:
                found = _Failures(0, now, now)
            found.count += 1
            found.last = now
            over = found.count - self.free
            if over > 0:
                # 2**over would overflow a float after ~1000 failures: cap the exponent first.
                steps = min(over - 1, math.ceil(math.log2(self.max_delay / self.first_delay)) + 1)
                found.locked_until = now + min(self.max_delay, self.first_delay * 2**steps)
            self._keys[key] = found
            while len(self._keys) > self.capacity:
                self._keys.popitem(last=False)
            return max(0.0, found.locked_until - now)

    def succeeded(self, key: str) -> None:
        """Forget ``key``'s failures."""
        with self._lock:
            self._keys.pop(key[:MAX_KEY_LENGTH], None)

    def _forget_old(self, now: float) -> None:
        # Oldest failure first: stop at the first key failed within the period.
        while self._keys:
            key, oldest = next(iter(self._keys.items()))
            if now - oldest.last < self.forget_after or oldest.locked_until > now:
                return
            del self._keys[key]


def address_key(address: str | None) -> str:
    """The key a client address counts under: the address, or for IPv6 its /64."""
    if not address:
        return "unknown"
    try:
        parsed = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return address[:MAX_KEY_LENGTH]
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network((parsed, 64), strict=False))
    return str(parsed)


def user_key(user: str) -> str:
    """The key a user name counts under: a digest of it, the same length for any name."""
    return hashlib.sha256(user.encode("utf-8", "surrogatepass")).hexdigest()


class LoginThrottle:
    """The standalone login's two throttles: per client address and per user name."""

    def __init__(
        self,
        *,
        capacity: int = CAPACITY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.addresses = Throttle(free=ADDRESS_FREE_FAILURES, capacity=capacity, clock=clock)
        self.users = Throttle(free=USER_FREE_FAILURES, capacity=capacity, clock=clock)

    def _pairs(self, address: str | None, user: str | None) -> Iterable[tuple[Throttle, str]]:
        yield self.addresses, address_key(address)
        if user is not None:
            yield self.users, user_key(user)

    def wait(self, address: str | None, user: str | None) -> float:
        """Seconds before a login from ``address`` (as ``user``: None when the login names
        nobody) may be tried; 0 when it may now."""
        return max(throttle.wait(key) for throttle, key in self._pairs(address, user))

    def failed(self, address: str | None, user: str | None) -> float:
        """Count a failed login; the seconds before the next may be tried."""
        return max(throttle.failed(key) for throttle, key in self._pairs(address, user))

    def succeeded(self, address: str | None, user: str | None) -> None:
        for throttle, key in self._pairs(address, user):
            throttle.succeeded(key)
