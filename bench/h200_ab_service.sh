#!/usr/bin/env bash
# Interleaved A/B of the service benchmark on the lent GPU machine (device tool), as
# bench/ab_service.sh does locally. The device gets no .git, so the old side travels as a tree:
#
#   here:   rm -rf _old && mkdir _old && git archive OLD_COMMIT | tar x -C _old
#           rm -rf _old/bench/results _old/docs _old/tests _old/engine_worker/model/corpus.txt
#           (the device copies at most 64 MiB with .whl/; the corpus, which both sides' model and
#           prompts come from, is copied back from this tree on the device)
#   device: carry [".whl"], command "bash bench/h200_ab_service.sh ROUNDS [service_bench args]"
#           (MODEL=/tmp/m300 MODEL_ARGS="..." for another model, as bench/h200_service.sh reads)
#
# Rounds alternate old (_old/) and new (this tree), each with DB=postgres; every run appends its
# JSON line to $OUT/ab.jsonl and prints a one-line summary. Remove _old/ afterwards (untracked).
# With TRACE=1 both sides run under this tree's bench/trace_site, tracing into $OUT/trace_old and
# $OUT/trace_new, sent back packed as $OUT/traces.tar.gz (read them with bench/worker_timeline.py
# and bench/web_timeline.py).
set -u
ROUNDS=$1
shift
ln -sfn ../.whl _old/.whl
[ -f _old/engine_worker/model/corpus.txt ] || cp engine_worker/model/corpus.txt _old/engine_worker/model/corpus.txt
for _ in $(seq "$ROUNDS"); do
    for side in old new; do
        dir=.
        [ "$side" = old ] && dir=_old
        trace=(env)
        if [ -n "${TRACE:-}" ]; then  # both sides traced by this tree's bench/trace_site, each to its own folder
            mkdir -p "$OUT/trace_$side"
            trace=(env PYTHONPATH="$PWD/bench/trace_site" WORKER_TRACE_DIR="$OUT/trace_$side")
        fi
        (cd "$dir" && "${trace[@]}" DB=postgres bash bench/h200_service.sh "$@" --out "$OUT/ab.jsonl" > "$OUT/last_$side.out" 2>&1) \
            || tail -20 "$OUT/last_$side.out"
        python3 - "$side" "$OUT/ab.jsonl" <<'PY'
import json, sys
d = json.loads(open(sys.argv[2]).read().splitlines()[-1])
s = d["service"]
print(sys.argv[1], "added_ttft", d["added_ttft_ms_p50"], "ratio", d["service_over_engine"],
      "engine tok/s", d["engine"]["tok_s"], "service tok/s", s["tok_s"], "stages", s.get("stages_ms_p50"))
PY
    done
done
# The device sends back at most 8 files from $OUT: the traces (one file per process) travel as one
# archive, traces.tar.gz (unpack it here, then read it as above).
if [ -n "${TRACE:-}" ]; then
    tar czf "$OUT/traces.tar.gz" -C "$OUT" trace_old trace_new && rm -rf "$OUT/trace_old" "$OUT/trace_new"
fi
