"""The operator's client-side request budget: a token bucket (client-go's `flowcontrol.NewTokenBucketRateLimiter`,
QPS and burst) and a bound on requests in flight equal to the connection pool, so a gang's creates neither flood
the API server nor open connections the pool then throws away (urllib3: "Connection pool is full, discarding
connection"), each a new TCP and TLS handshake.

The server's own answer to overload, 429 with Retry-After (API Priority and Fairness), is honoured by kube.py's
retry loop on top of this.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator


class TokenBucket:
    """`qps` tokens a second, at most `burst` saved up; `take` waits for one. qps 0: unlimited."""

    def __init__(
        self,
        qps: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(self.burst)
        self._at = clock()
        self._mu = threading.Lock()
        self.waited_seconds = 0.0
        """Total time callers waited for a token (exported as a metric: throttling the operator did itself)."""

    def _reserve(self) -> float:
        """Take a token, possibly into debt; how long the caller must wait before using it."""
        with self._mu:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
            self._at = now
            self._tokens -= 1
            wait = -self._tokens / self.qps if self._tokens < 0 else 0.0
            self.waited_seconds += wait
            return wait

    def try_take(self) -> bool:
        """Take a token if one is there now, without waiting or going into debt."""
        if self.qps <= 0:
            return True
        with self._mu:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
            self._at = now
            if self._tokens < 1:
                return False
            self._tokens -= 1
            return True

    def take(self) -> float:
        """Wait for a token; returns the seconds waited."""
        if self.qps <= 0:
            return 0.0
        wait = self._reserve()
        if wait > 0:
            self._sleep(wait)
        return wait


class RequestBudget:
    """Both limits around one request: a token, then one of `max_in_flight` slots (the pool's connections)."""

    def __init__(self, qps: float, burst: int, max_in_flight: int) -> None:
        self.bucket = TokenBucket(qps, burst)
        self.max_in_flight = max_in_flight
        self._slots = threading.BoundedSemaphore(max_in_flight)

    @contextlib.contextmanager
    def request(self) -> Iterator[float]:
        """Hold a token and a slot for one request; yields the seconds waited for the token."""
        waited = self.bucket.take()
        with self._slots:
            yield waited
