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
# by the project's builder with MODEL_ARGS if missing). The service runs on SQLite (server ourspg:
# on a local PostgreSQL, which needs PG=1 at prepare) and a local redis-server from .whl/redis.tar.xz. The
# JSON result and the servers' logs go to $OUT (default /tmp/peer). With bench/probes on PYTHONPATH
# and TTFT_PROBE or STEP_PROBE set, their tables are printed at the end (the files stay on that machine).
set -euo pipefail
source bench/h200_site.sh
MODEL=${MODEL:-/tmp/m300}
if [ ! -d "$MODEL" ]; then
    python3 -m demo_model.builder "$MODEL" ${MODEL_ARGS:---hidden 1024 --layers 24 --heads 16 --kv_heads 8 \
        --intermediate 2816 --vocab 32000 --dtype bfloat16} >/tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
fi
psql_names() {  # ourspg's databases, as URLs
    python3 -c 'import psycopg; c = psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres")
print(*(f"postgresql://postgres@127.0.0.1:5432/{n}" for n, in c.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", ("peer_ourspg%",))))'
}
case " $* " in *ourspg*) start_postgres ;; esac  # server ourspg: the service on PostgreSQL
out=${OUT:-/tmp/peer}
for probe in "${TTFT_PROBE:-}" "${STEP_PROBE:-}"; do  # the probes write beside their prefix
    [ -z "$probe" ] || mkdir -p "$(dirname "$probe")"
done
status=0
python3 bench/peer_bench.py --model "$MODEL" --out "$out" "$@" || status=$?
if [ -n "${TTFT_PROBE:-}" ]; then
    for db in "$out"/ours_b*.sqlite3; do [ -f "$db" ] && python3 bench/ttft_phases.py "$TTFT_PROBE" --db "$db"; done
    case " $* " in *ourspg*) for db in $(psql_names); do python3 bench/ttft_phases.py "$TTFT_PROBE" --db "$db"; done ;; esac
fi
[ -z "${STEP_PROBE:-}" ] || python3 bench/probes/probe_step_times.py "$STEP_PROBE"
rm -f "$out"/*.sqlite3*  # the service's databases: nothing to bring back
exit $status
