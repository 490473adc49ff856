"""The engine dashboard in a real headless Chromium, driven over the DevTools protocol: the page
renders the workers from the heartbeats and keeps updating from the JSON endpoint on its own; after
jobs with a shared prefix on a live in-process worker it shows the cache's entries, the charts and
human units at 1,280 px without a horizontal scrollbar, and evicts an entry through its dialog.
A screenshot of the page goes to $TEST_ARTIFACTS_DIR (default var/test-artifacts/)."""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from engine_worker.protocol import JobSpec
from tests.api.factories import heartbeat, make_user, publish_heartbeat
from tests.api.worker.live_worker import SHARED_PREFIX, live_worker

ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS_DIR") or Path(__file__).resolve().parents[3] / "var" / "test-artifacts")

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

    def screenshot(self, path: Path) -> None:
        """The whole page (beyond the viewport) as a PNG."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))

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


def open_dashboard(browser: DevTools, live_server, *, width: int = 1280) -> None:
    client = Client()
    client.force_login(make_user(is_staff=True, is_superuser=True))
    browser.call("Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1, mobile=False)
    browser.call("Network.enable")
    browser.call("Network.setCookie", name="sessionid", value=client.cookies["sessionid"].value,
                 url=live_server.url)
    browser.call("Page.enable")
    browser.call("Page.navigate", url=f"{live_server.url}/admin/engine/")


def test_dashboard_renders_workers_and_updates_live_in_a_real_browser(
    live_server, transactional_db, redis_client, browser
):
    running = {"request_id": "job-live-1", "status": "running", "phase": "decode", "elapsed_s": 0.5,
               "prompt_tokens": 4, "completion_tokens": 9, "max_tokens": 32, "progress": 0.28,
               "tokens_per_second": 18.0, "ttft_s": 0.05, "cache_hit_type": "miss", "cached_tokens": 0}
    publish_heartbeat(redis_client, heartbeat(worker_id="worker-a", requests=(running,)), ttl=60)

    open_dashboard(browser, live_server)

    browser.wait_for("document.getElementById('ed-workers') && "
                     "document.getElementById('ed-workers').textContent.includes('worker-a')")
    requests = browser.evaluate("document.getElementById('ed-requests').textContent")
    assert "job-live-1" in requests and "28%" in requests and "18.0 tokens/s" in requests
    assert browser.evaluate("document.documentElement.scrollWidth") <= 1280
    assert browser.evaluate("document.querySelector('#ed-workers h3.ed-model').textContent") == "Model: tiny"

    # A worker that appears after the page loaded shows up without a reload (the 2 s poll).
    publish_heartbeat(redis_client, heartbeat(worker_id="worker-b", model=""), ttl=60)
    browser.wait_for("document.getElementById('ed-workers').textContent.includes('worker-b')", timeout=10)
    assert int(browser.evaluate("document.body.getAttribute('data-ed-updates')")) >= 2
    assert "error" not in (browser.evaluate("document.getElementById('ed-status').className") or "")
    # Workers are grouped by the model their heartbeat names; one that names none has its own group.
    assert browser.evaluate("[...document.querySelectorAll('#ed-workers h3.ed-model')].map(h => h.textContent)") == [
        "Model: tiny", "Model: not reported"]


ENTRY_ROWS = "document.querySelectorAll('#ed-workers tr[data-key]')"
HEADERS = "[...document.querySelectorAll('#ed-root th, #ed-root caption, #ed-root h2, #ed-root h4')].map(e => e.textContent)"


def test_after_shared_prefix_jobs_the_page_shows_cache_entries_charts_and_units_and_evicts_an_entry(
    live_server, transactional_db, redis_client, browser, tiny_model, consumer_connections_closed
):
    with live_worker(tiny_model, redis_client, worker_id="gpu-host-1") as worker:
        open_dashboard(browser, live_server)
        worker.run_shared_prefix_jobs(4)
        stored = len(worker.engine.list_cache_entries())
        # One job still running while the page is looked at: a request row, a speed above zero.
        running_id = str(uuid.uuid4())
        worker.service.host.submit(JobSpec(job_id=running_id, max_tokens=3000, ignore_eos=True,
                                           prompt_token_ids=tuple(worker.tokenizer.encode(SHARED_PREFIX + "while"))))

        browser.wait_for(f"{ENTRY_ROWS}.length >= {stored}")
        browser.wait_for("['#ed-chart-speed', '#ed-chart-queue', '.ed-memory-chart']"
                         ".every(box => document.querySelector(box + ' path[data-series]'))")
        browser.wait_for(f"document.getElementById('ed-requests').textContent.includes('{running_id[:12]}')")
        # A few seconds of the running job in the speed chart's line.
        browser.wait_for("document.querySelector('#ed-chart-speed path').getAttribute('d').split('L').length > 4")
        text = browser.evaluate("document.getElementById('ed-root').innerText")
        assert "tokens/s" in text and re.search(r"\d+(\.\d+)? (KiB|MiB|GiB)", text)
        assert re.search(r"\d+ s ago", text) and "Device Memory (CPU)" in text
        assert re.search(r"Prefix-Cache Hit Rate\s+\d+%", text)
        hits_by_type = browser.evaluate("document.querySelector('.ed-hits-by-type').innerText")
        assert "Miss" in hits_by_type and "{" not in hits_by_type
        assert not [h for h in browser.evaluate(HEADERS) if "_" in h]  # Title Case labels, not field names
        assert browser.evaluate("document.documentElement.scrollWidth") <= 1280

        browser.screenshot(ARTIFACTS / "engine_dashboard.png")

        key = browser.evaluate("(() => { const b = document.querySelector('#ed-workers button.ed-evict');"
                               " b.click(); return b.getAttribute('data-key'); })()")
        assert browser.evaluate("document.getElementById('ed-evict-dialog').open")
        assert key in browser.evaluate("document.getElementById('ed-evict-text').textContent")
        browser.evaluate("document.getElementById('ed-evict-confirm').click()")

        browser.wait_for(f"!document.querySelector('#ed-workers tr[data-key=\"{key}\"]')", timeout=15)
        assert "requested" in browser.evaluate("document.getElementById('ed-message').textContent")
        assert key not in [row["key_hash"] for row in worker.engine.list_cache_entries()]
        worker.service.cancel(running_id)
