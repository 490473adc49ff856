#!/usr/bin/env bash
# The peer benchmark (bench/peer_bench.py) on the lent GPU machine (device tool, nvidia-h200; it
# reaches no registry): this service's OpenAI endpoint against `vllm-mlx serve --continuous-batching`
# and `mlx_lm.server`, the same model folder, one server at a time, loopback only.
#
#   here:   bash bench/h200_prepare.sh   (fills .whl/, git-ignored, and prints the carry size)
#   device: carry [".whl"], command "bash bench/h200_peer.sh [peer_bench.py args]", e.g.
#           bash bench/h200_peer.sh --concurrency 1,32,128 --batch 32,128
#
# An A/B of this tree against an older one: here, `rm -rf _old && mkdir _old && git archive OLD | tar x
# -C _old && rm -rf _old/bench/results _old/docs _old/tests` (untracked, so it travels with the tree),
# then add `--servers ours,old --old _old`; remove _old/ afterwards.
#
# MODEL: the model folder (default /tmp/m300, the ~316M bf16 Llama of issue 29's figures, built here
# by the project's builder with MODEL_ARGS if missing). The service runs on SQLite and a local
# redis-server from .whl/bin. The JSON result and the servers' logs go to $OUT (default /tmp/peer).
set -euo pipefail
source bench/h200_site.sh
MODEL=${MODEL:-/tmp/m300}
if [ ! -d "$MODEL" ]; then
    python3 -m demo_model.builder "$MODEL" ${MODEL_ARGS:---hidden 1024 --layers 24 --heads 16 --kv_heads 8 \
        --intermediate 2816 --vocab 32000 --dtype bfloat16} >/tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
fi
out=${OUT:-/tmp/peer}
status=0
python3 bench/peer_bench.py --model "$MODEL" --out "$out" "$@" || status=$?
rm -f "$out"/*.sqlite3*  # the service's databases: nothing to bring back
exit $status
