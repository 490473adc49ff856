#!/usr/bin/env bash
# Interleaved A/B (or A/B/C...) of environment settings with the service benchmark on the lent GPU
# machine (device tool), in this tree: each round runs every side once, in order, each with
# DB=postgres.
#
#   device: carry [".whl"], command
#           "bash bench/h200_ab_env.sh ROUNDS 'A_ASSIGNMENTS' 'B_ASSIGNMENTS' ['C_ASSIGNMENTS' ...] [service_bench args]"
#   e.g.    bash bench/h200_ab_env.sh 2 'GIL_SWITCH_INTERVAL_MS=0' 'GIL_SWITCH_INTERVAL_MS=0.5' --concurrency 32
#
# The sides are the arguments before the first one that starts with "-" (use 'X=0' for a side
# with nothing set). Every run appends its JSON line (with "ab_side" and "ab_env" added) to
# $OUT/ab.jsonl and prints a one-line summary. The service's processes inherit the environment
# (bench/service_bench.py).
set -u
ROUNDS=$1
shift
SIDES=()
while [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; do SIDES+=("$1"); shift; done
for _ in $(seq "$ROUNDS"); do
    for i in "${!SIDES[@]}"; do
        side=$(printf "\\x$(printf %x $((65 + i)))")  # A, B, C, ...
        assignments=${SIDES[$i]}
        (env $assignments DB=postgres bash bench/h200_service.sh "$@" --out "$OUT/run.jsonl" > "$OUT/last_$side.out" 2>&1) \
            || tail -20 "$OUT/last_$side.out"
        python3 - "$side" "$assignments" "$OUT/run.jsonl" "$OUT/ab.jsonl" <<'PY'
import json, sys
side, assignments, run, ab = sys.argv[1:]
d = json.loads(open(run).read().splitlines()[-1])
d.update(ab_side=side, ab_env=assignments)
open(ab, "a").write(json.dumps(d) + "\n")
s = d["service"]
print(side, assignments, "added_ttft", d["added_ttft_ms_p50"], "ratio", d["service_over_engine"],
      "post", s.get("post_ms_p50"), "stages", s.get("stages_ms_p50"))
PY
    done
done
