"""A real Prometheus server (Debian's `prometheus`) on 127.0.0.1 for tests: started with a scrape configuration,
queried through its HTTP API, stopped by PID."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from budget import budget

from zerotrain.runtime.job.launch import free_port

INSTALL_HINT = "needs prometheus and promtool (Debian package `prometheus`; `make test` installs it)"


def binary(name: str) -> str:
    """Path of `name`; skips the test, saying why, where it is missing (make test installs it)."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not found: {INSTALL_HINT}")
    return path


class Prometheus:
    """One running server; `query` evaluates PromQL now."""

    def __init__(self, url: str, proc: subprocess.Popen[bytes]) -> None:
        self.url, self.proc = url, proc

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:  # 400/422: a query Prometheus refused, with its reason
            body = json.loads(e.read())
        return body

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to; a parse or evaluation error fails the test with its reason."""
        body = self.api("query", query=expr)
        assert body.get("status") == "success", f"Prometheus refused {expr!r}: {body.get('error')}"
        result = body["data"]["result"]
        return result if isinstance(result, list) else []

    def wait_for(self, expr: str, predicate: Any, timeout: float = 60.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + budget(timeout)
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"{expr!r} did not come true in {timeout}s; last answer {result}")
            time.sleep(0.5)


@contextlib.contextmanager
def running_prometheus(config: dict[str, Any], workdir: Path) -> Iterator[Prometheus]:
    """Prometheus with `config` on a free 127.0.0.1 port; terminated (then killed) by PID on exit."""
    exe = binary("prometheus")
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    log = (workdir / "prometheus.log").open("wb")
    cmd = [
        exe,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    server = Prometheus(f"http://127.0.0.1:{port}", proc)
    try:
        deadline = time.monotonic() + budget(30)
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as r:
                if r.status == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"Prometheus did not start: {(workdir / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=budget(15))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
