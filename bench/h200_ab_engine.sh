#!/usr/bin/env bash
# Interleaved A/B of issue 2's engine benchmark (bench/engine_bench.py) on the lent GPU machine:
# the old tree's engine_worker against this tree's, same model, same prompts, in one call.
#
#   here:   rm -rf _old && mkdir _old && git archive OLD_COMMIT | tar x -C _old
#           rm -rf _old/bench/results _old/docs _old/tests _old/engine_worker/model/corpus.txt
#   device: carry [".whl"], command "bash bench/h200_ab_engine.sh ROUNDS [engine_bench args]"
#           (MODEL=/tmp/m300 MODEL_ARGS="..." for another model, built once by this tree)
#
# Each round runs old (_old/) then new (this tree); every run appends its JSON line to
# $OUT/engine_old.jsonl or $OUT/engine_new.jsonl and prints engine/raw per level.
set -u
ROUNDS=$1
shift
source .whl/gpu-env.sh
export MLX_DISABLE_OPENBLAS=1
MODEL=${MODEL:-$PWD/var/models/tiny}
[ -d "$MODEL" ] || python3 -m engine_worker.model.builder "$MODEL" ${MODEL_ARGS:-}
[ -f _old/engine_worker/model/corpus.txt ] || cp engine_worker/model/corpus.txt _old/engine_worker/model/corpus.txt
for _ in $(seq "$ROUNDS"); do
    for side in old new; do
        dir=.
        [ "$side" = old ] && dir=_old
        (cd "$dir" && python3 bench/engine_bench.py --model "$MODEL" "$@" --out "$OUT/engine_$side.jsonl" \
            > "$OUT/last_$side.out" 2>&1) || tail -20 "$OUT/last_$side.out"
        python3 - "$side" "$OUT/engine_$side.jsonl" <<'PY'
import json, sys
d = json.loads(open(sys.argv[2]).read().splitlines()[-1])
print(sys.argv[1], {n: (round(v["engine"]["tok_s_median"] / v["raw"]["tok_s_median"], 3),
                         v["raw"]["ttft_p50_ms"], v["engine"]["ttft_p50_ms"]) for n, v in d["levels"].items()})
PY
    done
done
