"""A process that uses the engine exits with status 0: the example of docs/engine.md as written, an engine
left running at exit, and ``with EngineCore(...)``.

mlx 0.32 aborts the process at exit (status 134, ``terminate called without an active
exception``) when a finished non-main thread's streams are left for interpreter shutdown; before
the engine thread destroyed its streams, this happened in most runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from demo_model import DEMO_MODEL_DIR
from engine_worker.common.errors import EngineClosed
from engine_worker.common.request import Request, SamplingParams
from engine_worker.engine_core import EngineCore

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.timeout(600)


def readme_engine_example() -> str:
    """The first Python block of docs/engine.md ("The engine on its own", linked from the README)."""
    section = (ROOT / "docs/engine.md").read_text().split("# The engine on its own", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def _runs(code: str, times: int) -> list[subprocess.CompletedProcess]:
    """``times`` independent runs of ``code``, as many at once as there are cores (each run is one
    single-threaded process, mostly importing and loading)."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(lambda _: _run(code), range(times)))


def test_the_readme_engine_example_runs_as_written_and_exits_0_ten_times(tiny_model_path):
    code = readme_engine_example()
    if not (DEMO_MODEL_DIR / "model.safetensors").exists():
        # A checkout without the trained weights: the same example on the test model.
        code = code.replace('"demo_model/demo"', repr(str(tiny_model_path)))
    for attempt, result in enumerate(_runs(code, 10)):
        assert result.returncode == 0, (attempt, result.returncode, result.stderr[-3000:])
        assert result.stdout.endswith("\n")  # it printed the generated text


def test_a_process_that_leaves_its_engine_running_exits_0(tiny_model_path):
    code = f"""
from engine_worker.engine_core import EngineCore
from engine_worker.runner.loader import load_model
from engine_worker.request import SamplingParams

model, tokenizer = load_model({str(tiny_model_path)!r})
engine = EngineCore(model, tokenizer)
outs = engine.generate_batch_sync(["def f(x):", "class A:"], SamplingParams(max_tokens=8, temperature=0.0))
print(sum(o.completion_tokens for o in outs))
"""
    for attempt, result in enumerate(_runs(code, 5)):
        assert result.returncode == 0, (attempt, result.returncode, result.stderr[-3000:])
        assert result.stdout.strip() == "16"


def test_with_engine_core_starts_the_engine_and_closes_it_on_exit(tiny_model):
    model, tokenizer = tiny_model
    with EngineCore(model, tokenizer) as engine:
        assert engine.is_running()
        [out] = engine.generate_batch_sync([[1, 5, 6]], SamplingParams(max_tokens=4, temperature=0.0,
                                                                       ignore_eos=True))
        assert out.completion_tokens == 4
        thread = engine._thread
    assert not engine.is_running() and not thread.is_alive()
    with pytest.raises(EngineClosed):
        engine.submit(Request("late", [1, 2], SamplingParams(max_tokens=2)))
