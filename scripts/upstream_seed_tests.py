"""Run vllm-mlx's own tests of its scheduler, engine core and request types against this engine.

    python scripts/upstream_seed_tests.py PATH [--ref REF]

``PATH`` is a vllm-mlx checkout, or with ``--ref`` any git repository of it (a bare mirror too),
from which the test files are taken at ``REF``. The upstream test files that use nothing of
vllm-mlx but ``vllm_mlx.scheduler``, ``vllm_mlx.engine_core`` and ``vllm_mlx.request`` (and the
same names from the package itself) are copied, with upstream's ``tests/conftest.py``, into a
temporary directory, beside a temporary ``vllm_mlx`` package whose modules re-export ours; pytest
runs them there. Nothing of vllm-mlx is copied into this repository.

Upstream's tests that load a model from the Hugging Face hub skip here (the hub is offline); the
others must pass. Prints the counts and exits non-zero on a failure.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# vllm-mlx's test files that exercise only the seed API this engine keeps (RequestStatus,
# SamplingParams, Request, RequestOutput; Scheduler and SchedulerConfig; AsyncEngineCore and
# EngineConfig).
UPSTREAM_TESTS = ("tests/test_request.py", "tests/test_continuous_batching.py")
UPSTREAM_SUPPORT = ("tests/conftest.py",)

# The temporary vllm_mlx package: each seed module is ours, re-exported under the seed's name.
SHIM = {
    "__init__.py": (
        "from engine_worker.engine_core import AsyncEngineCore, EngineConfig, EngineCore\n"
        "from engine_worker.request import Request, RequestOutput, RequestStatus, SamplingParams\n"
        "from engine_worker.scheduler import Scheduler, SchedulerConfig, SchedulerOutput, SchedulingPolicy\n"
    ),
    "scheduler.py": "from engine_worker.scheduler import *  # noqa: F403\n",
    "engine_core.py": "from engine_worker.engine_core import *  # noqa: F403\n",
    "request.py": "from engine_worker.request import *  # noqa: F403\n",
}


def fetch_tests(source: Path, ref: str | None, into: Path) -> None:
    """Copy the upstream test files from a checkout, or from a git repository at ``ref``."""
    names = [*UPSTREAM_TESTS, *UPSTREAM_SUPPORT]
    if ref is None:
        for name in names:
            (into / Path(name).name).write_bytes((source / name).read_bytes())
        return
    for name in names:
        shown = subprocess.run(["git", "-C", str(source), "show", f"{ref}:{name}"], capture_output=True, check=True)
        (into / Path(name).name).write_bytes(shown.stdout)


def write_shim(into: Path) -> None:
    package = into / "vllm_mlx"
    package.mkdir()
    for name, text in SHIM.items():
        (package / name).write_text(text)


def run(source: Path, ref: str | None) -> int:
    with tempfile.TemporaryDirectory(prefix="upstream-seed-tests-") as tmp:
        work = Path(tmp)
        tests = work / "tests"
        tests.mkdir()
        fetch_tests(source, ref, tests)
        write_shim(work)
        (work / "pytest.ini").write_text("[pytest]\n")
        report = work / "report.xml"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), str(ROOT)]), "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:django",
                   "--rootdir", str(work), "-c", str(work / "pytest.ini"), f"--junitxml={report}",
                   *(str(tests / Path(name).name) for name in UPSTREAM_TESTS)]
        done = subprocess.run(command, cwd=work, env=env)
        counts = summarise(report) if report.exists() else None
    if counts is None:
        print("upstream seed tests: pytest produced no report", file=sys.stderr)
        return done.returncode or 1
    passed, failed, skipped = counts
    print(f"upstream seed tests: {passed} passed, {failed} failed, {skipped} skipped "
          f"(passed {passed} of the {passed + failed} that ran)")
    return 1 if failed else done.returncode


def summarise(report: Path) -> tuple[int, int, int]:
    """``(passed, failed, skipped)`` from pytest's JUnit XML (errors count as failures)."""
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    total = int(suite.get("tests", 0))
    failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    skipped = int(suite.get("skipped", 0))
    return total - failed - skipped, failed, skipped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a vllm-mlx checkout (or git repository, with --ref)")
    parser.add_argument("--ref", help="take the test files from this git ref of SOURCE")
    args = parser.parse_args()
    return run(args.source, args.ref)


if __name__ == "__main__":
    sys.exit(main())
