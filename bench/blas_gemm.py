"""CPU GEMM GFLOP/s of mlx with and without the OpenBLAS preload (engine_worker/runner/blas.py).

Each measurement runs in a fresh subprocess, because the BLAS is chosen when ``mlx.core`` is first
loaded: one child imports it through ``engine_worker.runner.mlx_core`` (OpenBLAS preloaded), the other with
``MLX_DISABLE_OPENBLAS=1`` (mlx's bundled reference BLAS). The children alternate
(OpenBLAS, OpenBLAS with ``OPENBLAS_NUM_THREADS=1``, bundled, ...) ``--rounds`` times; the
report gives medians and the ratios.
The LAST printed line is one JSON object.

    python bench/blas_gemm.py [--rounds 3] [--iters 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SHAPES = {
    # name: (M, K, N)
    "fp32_1024x1024x1024": (1024, 1024, 1024),
    "fp32_decode_8x1024x2816": (8, 1024, 2816),
    "fp32_decode_32x1024x2816": (32, 1024, 2816),
}


def child(iters: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from engine_worker.runner.mlx_core import mx  # the preload, unless MLX_DISABLE_OPENBLAS=1

    from engine_worker.runner.blas import blas_status

    out = {"blas": blas_status()}
    for name, (m, k, n) in SHAPES.items():
        a = mx.random.normal((m, k), dtype=mx.float32)
        b = mx.random.normal((k, n), dtype=mx.float32)
        mx.eval(a, b)
        mx.eval(a @ b)  # warm-up
        flop = 2.0 * m * k * n
        # repeat small shapes so each timing lasts long enough to measure
        inner = max(1, int(2e9 // flop)) if flop < 2e9 else 1
        rates = []
        for _ in range(iters):
            t = time.perf_counter()
            for _ in range(inner):
                mx.eval(a @ b)
            dt = time.perf_counter() - t
            rates.append(flop * inner / dt / 1e9)
        out[name] = statistics.median(rates)
    print(json.dumps(out), flush=True)


# label -> environment changes of the child
VARIANTS = {
    "openblas": {},  # OpenBLAS preloaded, its default thread count (one per core)
    "openblas_1thread": {"OPENBLAS_NUM_THREADS": "1"},
    "bundled": {"MLX_DISABLE_OPENBLAS": "1"},  # mlx's bundled reference BLAS
}


def run_child(label: str, iters: int, timeout: float) -> dict:
    env = dict(os.environ)
    env.pop("MLX_DISABLE_OPENBLAS", None)
    env.pop("OPENBLAS_NUM_THREADS", None)
    env.update(VARIANTS[label])
    proc = subprocess.run(
        [sys.executable, __file__, "--child", "--iters", str(iters)],
        env=env, capture_output=True, text=True, timeout=timeout, check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="alternating (preload, no preload) pairs")
    ap.add_argument("--iters", type=int, default=5, help="timed repetitions per shape inside a child")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default=None, help="also append the final JSON line to this file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.iters)
        return

    runs = {label: [] for label in VARIANTS}
    for r in range(args.rounds):
        for label in VARIANTS:
            res = run_child(label, args.iters, args.timeout)
            runs[label].append(res)
            print(f"# round {r} {label}: " + ", ".join(f"{k} {res[k]:.1f}" for k in SHAPES)
                  + f" GFLOP/s (blas loaded={res['blas']['loaded']})", flush=True)
    result = {
        "bench": "blas_gemm",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "openblas_path": runs["openblas"][0]["blas"].get("path"),
        "bundled_blas_status": runs["bundled"][0]["blas"].get("reason"),
    }
    for name in SHAPES:
        fast = statistics.median(r[name] for r in runs["openblas"])
        one = statistics.median(r[name] for r in runs["openblas_1thread"])
        slow = statistics.median(r[name] for r in runs["bundled"])
        result[name] = {
            "gflops_openblas": round(fast, 2),
            "gflops_openblas_1thread": round(one, 2),
            "gflops_bundled": round(slow, 2),
            "speedup": round(fast / slow, 1),
            "speedup_1thread": round(one / slow, 1),
        }
        print(f"# {name}: OpenBLAS preload {fast:.1f} GFLOP/s (1 thread {one:.1f}), bundled BLAS {slow:.1f} "
              f"GFLOP/s: x{fast / slow:.1f} (1 thread x{one / slow:.1f})", flush=True)
    print(json.dumps(result), flush=True)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
