"""The operator's request budget: the token bucket's arithmetic, and against a real HTTP server on 127.0.0.1 that a
burst of requests neither exceeds the connections in flight nor opens connections the pool throws away."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes
import pytest

from zerotrain.operator.client.kube import Kube
from zerotrain.operator.client.rate_limit import RequestBudget, TokenBucket


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def test_the_bucket_lets_a_burst_through_then_paces_at_qps() -> None:
    t = FakeTime()
    bucket = TokenBucket(qps=2, burst=3, clock=t.clock, sleep=t.sleep)
    assert [bucket.take() for _ in range(3)] == [0, 0, 0]
    # Each further request waits its turn: the bucket is in debt, not merely empty.
    assert [bucket.take() for _ in range(2)] == [0.5, 1.0]
    assert t.slept == [0.5, 1.0] and bucket.waited_seconds == 1.5
    t.now = 100.0  # a quiet spell refills at most `burst`
    assert [bucket.take() for _ in range(4)] == [0, 0, 0, 0.5]
    assert TokenBucket(qps=0, burst=1).take() == 0  # 0: unlimited


class Counting(ThreadingHTTPServer):
    """Answers `{}` after 20 ms and records the most requests it held at once and the connections opened."""

    def __init__(self) -> None:
        self.active = self.peak = self.connections = 0
        self.mu = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the API server

            def setup(self) -> None:
                super().setup()
                with server.mu:
                    server.connections += 1

            def do_GET(self) -> None:
                with server.mu:
                    server.active += 1
                    server.peak = max(server.peak, server.active)
                time.sleep(0.02)
                with server.mu:
                    server.active -= 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture
def counting() -> Iterator[Counting]:
    httpd = Counting()
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def flood(httpd: Counting, budget: RequestBudget | None, threads: int = 16, requests: int = 96) -> None:
    cfg = kubernetes.client.Configuration()
    cfg.host = f"http://127.0.0.1:{httpd.server_address[1]}"
    cfg.connection_pool_maxsize = 4  # what a budget of 4 sets; unbudgeted, the pool is just as small
    kube = Kube(cfg, retries=0, budget=budget)
    try:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda _: kube.request("GET", "/api/v1/namespaces/a/pods"), range(requests)))
    finally:
        kube.close()


def test_a_burst_stays_within_the_pool_and_reuses_its_connections(
    counting: Counting, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
        flood(counting, RequestBudget(qps=0, burst=1, max_in_flight=4))
    assert counting.peak <= 4 and counting.connections <= 4, (counting.peak, counting.connections)
    assert "Connection pool is full" not in caplog.text


def test_without_the_budget_the_same_burst_discards_connections(
    counting: Counting, caplog: pytest.LogCaptureFixture
) -> None:
    # The contrast that makes the test above able to fail: what the operator did before the budget.
    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
        flood(counting, None)
    assert counting.peak > 4 and counting.connections > 4
    assert "Connection pool is full, discarding connection" in caplog.text


def test_the_budget_sizes_the_clients_pool() -> None:
    cfg = kubernetes.client.Configuration()
    cfg.host = "http://127.0.0.1:1"
    kube = Kube(cfg, budget=RequestBudget(qps=50, burst=100, max_in_flight=7))
    try:
        assert kube._api.rest_client.pool_manager.connection_pool_kw["maxsize"] == 7
    finally:
        kube.close()
