"""The engine dashboard in a real headless Chromium, driven over the DevTools protocol: the page
renders the workers from the heartbeats and keeps updating from the JSON endpoint on its own."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from tests.api.factories import heartbeat, make_user, publish_heartbeat

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs a Chromium binary (apt-get install chromium)"),
]


class DevTools:
    """The few DevTools-protocol calls the test needs, over one page's WebSocket."""

    def __init__(self, ws_url: str) -> None:
        from websockets.sync.client import connect

        # websockets >= 16 wants connect() entered (a bare connect() object warns); close() ends it.
        self._ws = connect(ws_url, max_size=None, open_timeout=10).__enter__()
        self._ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        self._ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self._ws.recv(timeout=20))
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def evaluate(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def wait_for(self, expression: str, *, timeout: float = 15.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {expression}")

    def close(self) -> None:
        self._ws.close()


@pytest.fixture
def browser(tmp_path) -> Iterator[DevTools]:
    process = subprocess.Popen(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--remote-debugging-port=0", f"--user-data-dir={tmp_path / 'profile'}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            match = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            port = int(match.group(1)) if match else None
        assert port, "Chromium did not start its DevTools endpoint"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            pages = [t for t in json.load(response) if t["type"] == "page"]
        devtools = DevTools(pages[0]["webSocketDebuggerUrl"])
        yield devtools
        devtools.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def test_dashboard_renders_workers_and_updates_live_in_a_real_browser(
    live_server, transactional_db, redis_client, browser
):
    client = Client()
    client.force_login(make_user(is_staff=True, is_superuser=True))
    running = {"request_id": "job-live-1", "status": "running", "phase": "decode", "elapsed_s": 0.5,
               "prompt_tokens": 4, "completion_tokens": 9, "max_tokens": 32, "progress": 0.28,
               "tokens_per_second": 18.0, "ttft_s": 0.05, "cache_hit_type": "miss", "cached_tokens": 0}
    publish_heartbeat(redis_client, heartbeat(worker_id="worker-a", requests=(running,)), ttl=60)

    browser.call("Network.enable")
    browser.call("Network.setCookie", name="sessionid", value=client.cookies["sessionid"].value,
                 url=live_server.url)
    browser.call("Page.navigate", url=f"{live_server.url}/admin/engine/")

    browser.wait_for("document.querySelector('#ed-workers tbody') && "
                     "document.querySelector('#ed-workers tbody').textContent.includes('worker-a')")
    assert "job-live-1" in browser.evaluate("document.querySelector('#ed-requests tbody').textContent")
    assert "28%" in browser.evaluate("document.querySelector('#ed-requests tbody').textContent")

    # A worker that appears after the page loaded shows up without a reload (the 2 s poll).
    publish_heartbeat(redis_client, heartbeat(worker_id="worker-b"), ttl=60)
    browser.wait_for("document.querySelector('#ed-workers tbody').textContent.includes('worker-b')", timeout=10)
    assert int(browser.evaluate("document.body.getAttribute('data-ed-updates')")) >= 2
    assert "error" not in (browser.evaluate("document.getElementById('ed-status').className") or "")
