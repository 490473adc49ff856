"""Start to ready: how long ``scripts/run.sh`` (``make run``) takes, and where the time goes.

Starts the service with ``scripts/run.sh`` on a SQLite database of its own, a Redis DB that is
flushed first (``--redis-url``) and port ``--port``, and times from the start, per run:

* ``web_started``: run.sh starts daphne (what came before: the database's migrations, the demo key);
* ``web_ready``: the port answers HTTP;
* ``model_loaded``: the engine child logged its model loaded (from the worker's log);
* ``worker_ready``: an engine worker registered (the model is loaded and the engine answers;
  ``GET /v1/models`` lists the model as available);
* ``ready``: run.sh prints ``ready.``;
* ``first_job``: a one-token chat completion, sent at ``ready``, has answered.

``--runs`` (3) starts, one after another; medians are printed. With ``--importtime`` it also reads
each process kind's import time (``python -X importtime``: the web app, a management command, the
engine child's modules) once, and prints the largest modules.

The LAST printed line is one JSON object: every run's figures and the medians, in seconds.

    python bench/startup_bench.py [--model PATH] [--runs 3] [--port 8790] [--redis-url redis://127.0.0.1:6379/5]
    # GPU host: bash bench/h200_all.sh runs it with the 316M model
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("web_started", "web_ready", "model_loaded", "worker_ready", "ready", "first_job")
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) .*loaded model from")


def _get(url: str, key: str = "", body: dict | None = None, timeout: float = 2.0) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


class Start:
    """One ``scripts/run.sh`` and the moments its phases were reached."""

    def __init__(self, args: argparse.Namespace, work: Path, tree: Path = ROOT) -> None:
        self.args = args
        self.tree = tree
        self.base = f"http://127.0.0.1:{args.port}"
        self.env = {**os.environ, "PORT": str(args.port), "REDIS_URL": args.redis_url,
                    "DATABASE_URL": f"sqlite:///{work}/startup.sqlite3"}
        if args.model:
            self.env["MODEL_PATH"] = str(Path(args.model).resolve())
        self.t: dict[str, float] = {}
        self.key = ""
        self._lines: list[str] = []

    def _read(self, proc: subprocess.Popen, t0: float) -> None:
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            self._lines.append(line)
            now = time.perf_counter() - t0
            if line.lstrip().startswith("web (pid"):
                self.t.setdefault("web_started", now)
            elif line.strip() == "ready." or line.startswith("ready."):
                self.t.setdefault("ready", now)
            elif (m := re.search(r"export KEY=(\S+)", line)) is not None:
                self.key = m.group(1)

    def run(self) -> dict[str, float]:
        import redis

        redis.Redis.from_url(self.args.redis_url).flushdb()
        for log in (self.tree / "var" / "log").glob("engine-worker-*.log"):
            log.unlink()
        t0, wall0 = time.perf_counter(), time.time()
        proc = subprocess.Popen(["bash", "scripts/run.sh"], cwd=self.tree, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        reader = threading.Thread(target=self._read, args=(proc, t0), daemon=True)
        reader.start()
        try:
            self._wait(proc, t0)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self._model_loaded(wall0)
        return {k: round(self.t[k], 2) for k in PHASES if k in self.t}

    def _model_loaded(self, wall0: float) -> None:
        for log in (self.tree / "var" / "log").glob("engine-worker-*.log"):
            for line in log.read_text(errors="replace").splitlines():
                if (m := _STAMP.match(line)) is not None:
                    stamp = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
                    self.t.setdefault("model_loaded", stamp - wall0)

    def _wait(self, proc: subprocess.Popen, t0: float) -> None:
        deadline = t0 + self.args.timeout
        while "first_job" not in self.t:
            if proc.poll() is not None:
                raise RuntimeError("run.sh exited:\n" + "\n".join(self._lines[-30:]))
            if time.perf_counter() > deadline:
                raise RuntimeError("the service did not serve a job in time:\n" + "\n".join(self._lines[-30:]))
            now = time.perf_counter() - t0
            if "web_ready" not in self.t and _get(f"{self.base}/v1/models", timeout=2)[0]:
                self.t["web_ready"] = now
            if self.key and "worker_ready" not in self.t:
                status, body = _get(f"{self.base}/v1/models", self.key, timeout=1)
                data = json.loads(body).get("data") if status == 200 else None
                if data and data[0].get("available", True):
                    self.t["worker_ready"] = time.perf_counter() - t0
                    self.model = data[0]["id"]
            if "ready" in self.t and "worker_ready" in self.t:
                body = {"model": self.model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
                status, text = _get(f"{self.base}/v1/chat/completions", self.key, body, timeout=120)
                if status != 200:
                    raise RuntimeError(f"first job: HTTP {status} {text[:200]!r}")
                self.t["first_job"] = time.perf_counter() - t0
                return
            time.sleep(0.05)


IMPORT_PROBES = {
    # what each process imports before it can work
    "web": "import django; django.setup(); import inference_service.asgi",
    "manage": "import django; django.setup(); from django.core.management import call_command",
    "worker": "import django; django.setup(); import api.management.commands.run_engine_worker",
    "engine_child": "import engine_worker.runtime.host, engine_worker.engine_core, engine_worker.runner.loader",
}


def import_times(top: int = 8) -> dict[str, dict]:
    """Per process kind: wall seconds of its imports, and its ``top`` slowest modules (cumulative)."""
    out = {}
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "inference_service.settings"}
    for name, code in IMPORT_PROBES.items():
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=ROOT, env=env,
                              capture_output=True, text=True)
        wall = time.perf_counter() - t0
        rows = []
        for line in proc.stderr.splitlines():
            m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
            if m and len(m.group(3)) <= 2:  # top-level imports only
                rows.append((int(m.group(2)), m.group(4)))
        rows.sort(reverse=True)
        out[name] = {"wall_s": round(wall, 2), "ok": proc.returncode == 0,
                     "top_ms": {mod: round(us / 1000) for us, mod in rows[:top]}}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: run.sh's default, the demo model)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--importtime", action="store_true", help="also time each process kind's imports")
    parser.add_argument("--out", default=None, help="also write the JSON result to this file")
    parser.add_argument("--old", default=None, metavar="DIR",
                        help="another checkout (with its .venv) to start in turn with this one: an A/B")
    args = parser.parse_args()
    trees = {"new": ROOT, **({"old": Path(args.old).resolve()} if args.old else {})}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for i in range(args.runs):
        for name, tree in (trees.items() if i % 2 == 0 else reversed(trees.items())):
            with tempfile.TemporaryDirectory(prefix="startup-") as work:
                figures = Start(args, Path(work), tree).run()
            runs[name].append(figures)
            print(f"run {i + 1} {name}: " + ", ".join(f"{k} {v:.1f}s" for k, v in figures.items()), flush=True)
    medians = {name: {k: round(statistics.median(r[k] for r in rs), 2) for k in PHASES if all(k in r for r in rs)}
               for name, rs in runs.items()}
    for name, med in medians.items():
        print(f"median {name}: " + ", ".join(f"{k} {v:.1f}s" for k, v in med.items()), flush=True)
    result = {"bench": "startup", "model": args.model, "runs": runs, "median_s": medians}
    if args.old:
        result["old_over_new"] = {k: round(medians["old"][k] / medians["new"][k], 2)
                                  for k in PHASES if medians["new"].get(k) and medians["old"].get(k)}
    if args.importtime:
        result["imports"] = import_times()
        for name, row in result["imports"].items():
            print(f"imports {name}: {row['wall_s']}s {row['top_ms']}", flush=True)
    line = json.dumps(result)
    if args.out:
        Path(args.out).write_text(line + "\n")
    print(line, flush=True)


if __name__ == "__main__":
    main()
