#!/usr/bin/env bash
# Every GPU figure of issue 43 in one device call of at most 600 s, on the lent GPU machine:
#
#   here:   bash bench/h200_prepare.sh      (fills .whl/, git-ignored; prints the carry size, <= 64 MiB)
#   device: run(command="bash bench/h200_all.sh", carry=[".whl"], timeout_s=600)
#
# In order, each bounded so that the whole ends by BUDGET seconds (default 570):
#   1. engine.json: bench/engine_bench.py at 128 requests x 128 tokens, engine and raw BatchGenerator;
#      then (a second JSON line in engine.json) 128 one-token requests, the prefix cache on (as the
#      service runs it), every prompt behind one shared 32-token prefix, after 1,024 such requests
#      filled the cache (at most 60 s; about 25 s);
#   2. step_memory.json: bench/step_memory.py, one step's working memory at 128 rows;
#   3. startup.json: bench/startup_bench.py, scripts/run.sh from start to web ready, model loaded,
#      worker ready and first job served (STARTUP_RUNS, default 1);
#   4. peer/peer_bench.json: bench/peer_bench.py, this service against its own engine in process
#      (the same load: issue 43's service / engine) and vllm-mlx serve, completion batch 128,
#      1/32/128 clients and one-token requests at 128, PEER_ROUNDS (3) rounds with the servers
#      interleaved; per level tok/s, requests/s, TTFT p50/p95, peak GPU memory, and each
#      server's start-to-ready. Written after every server run, so a cut run keeps what it measured.
# Everything printed also goes to all.log. All of it lands in $OUT (at most 8 files come back).
# MODEL: the model folder (default /tmp/m300, the ~316M bf16 Llama of issue 43's figures, built here).
set -uo pipefail
start=$SECONDS
OUT=${OUT:-/tmp/h200_all}
mkdir -p "$OUT/peer"
exec > >(tee -a "$OUT/all.log") 2>&1
source bench/h200_site.sh || { echo "error: the carried .whl/ did not install" >&2; exit 1; }
export PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-570}
left() { echo $(( BUDGET - (SECONDS - start) )); }
MODEL=${MODEL:-/tmp/m300}
if [ ! -d "$MODEL" ]; then
    python3 -m demo_model.builder "$MODEL" --hidden 1024 --layers 24 --heads 16 --kv_heads 8 \
        --intermediate 2816 --vocab 32000 --dtype bfloat16 >/tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
fi
echo "== $(( SECONDS - start )) s: engine_bench at 128"
timeout 120 python3 bench/engine_bench.py --model "$MODEL" --concurrency 128 --repeats 2 --seq-requests 0 \
    --out "$OUT/engine.json"
echo "== $(( SECONDS - start )) s: engine_bench, 128 one-token requests, prefix cache on and filled"
timeout 60 python3 bench/engine_bench.py --model "$MODEL" --concurrency 128 --max-tokens 1 --warmup-tokens 1 \
    --repeats 3 --seq-requests 0 --prefix-cache --chat-prefix 32 --cache-fill 1024 --out "$OUT/engine.json"
echo "== $(( SECONDS - start )) s: step_memory at 128 rows"
timeout 60 python3 bench/step_memory.py --model "$MODEL" --rows 128 | tail -1 > "$OUT/step_memory.json"
cat "$OUT/step_memory.json"
echo "== $(( SECONDS - start )) s: startup (scripts/run.sh)"
PYTHON=$(command -v python3) timeout 150 python3 bench/startup_bench.py --model "$MODEL" --runs "${STARTUP_RUNS:-1}" \
    --redis-url redis://127.0.0.1:6379/5 --out "$OUT/startup.json"
echo "== $(( SECONDS - start )) s: peer bench, $(left) s left"
PEER_REDIS_URL=redis://127.0.0.1:6379/11 timeout "$(left)" python3 bench/peer_bench.py --model "$MODEL" \
    --out "$OUT/peer" --servers ours,engine,vllm --batch 128 --concurrency 1,32,128 --one-token 128 \
    --rounds "${PEER_ROUNDS:-3}"
rm -f "$OUT"/peer/*.sqlite3*  # the service's databases: nothing to bring back
echo "== $(( SECONDS - start )) s: done; files in $OUT:"
ls -la "$OUT" "$OUT/peer"
