#!/usr/bin/env bash
# `make run`: the whole service on embedded defaults, in the foreground. Ctrl-C stops everything.
#
#   database  SQLite under var/ (DATABASE_URL switches to Postgres)
#   Redis     REDIS_URL, default redis://127.0.0.1:6379/0; a local redis-server is started if none answers
#   model     MODEL_PATH, default the trained demo model shipped in demo_model/demo
#   models    MODELS=name=path,name2=path2 serves several models (MODEL_PATH is then ignored);
#             WORKERS_PER_MODEL (default 1) engine workers each
#   processes daphne (HTTP + WebSocket), the engine workers, celery beat, a light celery worker,
#             a webhooks celery worker
#
# `make setup` (a dependency of `make run`) installs the packages; this script installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

# PYTHON: the interpreter (default the virtualenv's; bench/h200_all.sh runs it on a machine without one).
PY="${PYTHON:-.venv/bin/python}"
PORT="${PORT:-8000}"
HOST="${HOST:-127.0.0.1}"
LOG_DIR=var/log
DEMO_USER="${DEMO_USER:-demo}"
DEMO_PASSWORD="${DEMO_PASSWORD:-demo}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"
export DJANGO_SETTINGS_MODULE=inference_service.settings
export PYTHONUNBUFFERED=1
mkdir -p "$LOG_DIR"

PIDS=()
stop_all() {
  trap - INT TERM HUP EXIT
  echo
  echo "stopping..."
  # Reverse start order; SIGTERM lets the engine worker hand its jobs back.
  for ((i=${#PIDS[@]}-1; i>=0; i--)); do kill -TERM "${PIDS[i]}" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  echo "stopped."
}
# Ctrl-C (or a TERM, or the terminal closing) is an orderly stop: stop everything and exit 0.
trap 'stop_all; exit 0' INT TERM HUP
trap stop_all EXIT

start() {  # name, command...: run in the background with its log under var/log
  local name=$1; shift
  # A process group of its own (job control on for this fork only): Ctrl-C reaches this script
  # alone, which then stops the processes in order, instead of all of them at once.
  set -m
  "$@" >"$LOG_DIR/$name.log" 2>&1 &
  set +m
  PIDS+=($!)
  echo "  $name (pid $!, log $LOG_DIR/$name.log)"
}

wait_until() {  # seconds, description, command... (status 2 from the command: it never will)
  local seconds=$1 what=$2 rc; shift 2
  for _ in $(seq 1 "$((seconds * 2))"); do
    rc=0; "$@" >/dev/null 2>&1 || rc=$?
    [ "$rc" -eq 0 ] && return 0
    [ "$rc" -eq 2 ] && { echo "error: $what exited (see $LOG_DIR/)" >&2; exit 1; }
    sleep 0.5
  done
  echo "error: $what did not come up within ${seconds}s (see $LOG_DIR/)" >&2
  exit 1
}

# A plain bind (no SO_REUSEPORT, which the web processes set to share the port among themselves,
# and which would let this run share it with another service's): refused while anything listens.
port_free() { $PY -c "
import socket, sys
s = socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))" "$HOST" "$PORT"; }
# Our web server answers on the port (2: it exited, so the answer would be another service's).
# It answers HTTP: its listening socket opens before its processes have loaded the app.
web_answers() {
  kill -0 "$WEB_PID" 2>/dev/null || return 2
  (exec 3<>"/dev/tcp/$HOST/$PORT" && printf 'GET /api/v1/health HTTP/1.0\r\n\r\n' >&3 && read -r -t 5 line <&3 &&
   [[ "$line" == HTTP/* ]]) 2>/dev/null
}

echo "starting the mlx inference service"
# Before anything else: a second service on a held port would otherwise migrate, replace the demo
# key and start workers on the shared Redis before its web server failed to listen.
if ! port_free 2>/dev/null; then
  echo "error: port $PORT on $HOST is in use by another process (another \`make run\`?). Stop it, or pick another port: PORT=$((PORT + 1)) make run" >&2
  exit 1
fi

redis_answers() { $PY -c "import os, redis; redis.Redis.from_url(os.environ['REDIS_URL'], socket_timeout=1).ping()"; }
if ! redis_answers 2>/dev/null; then
  command -v redis-server >/dev/null || { echo "error: no Redis at $REDIS_URL and no redis-server to start" >&2; exit 1; }
  REDIS_PORT=$($PY -c "import os, urllib.parse as u; print(u.urlsplit(os.environ['REDIS_URL']).port or 6379)")
  start redis redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no
  wait_until 30 "redis-server" redis_answers
fi

if [ -z "${MODEL_PATH:-}" ]; then
  if [ -f demo_model/demo/model.safetensors ]; then
    export MODEL_PATH="$PWD/demo_model/demo"
    echo "  model: the demo code model in $MODEL_PATH"
  else  # a checkout without the trained weights: the untrained test model, which writes gibberish
    export MODEL_PATH="$PWD/var/models/tiny"
    echo "  model: no trained weights in demo_model/demo; building the untrained test model in $MODEL_PATH"
    $PY -m demo_model.builder "$MODEL_PATH" >"$LOG_DIR/model-build.log" 2>&1
  fi
fi

# Served on loopback: webhooks to receivers on loopback are allowed too (the service refuses
# private addresses otherwise), so a local receiver works without a restart.
if [ -z "${WEBHOOK_ALLOWED_NETWORKS+set}" ] && [[ "$HOST" == 127.* || "$HOST" == localhost || "$HOST" == ::1 ]]; then
  export WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8,::1/128"
fi

# The database's migrations and the demo key, in one Django process, while the engine workers load
# their models and the web loads its app (below): a worker waits for the migrations before it
# takes a job (WAIT_FOR_MIGRATIONS).
# --replace: the demo keys of earlier runs are revoked, so only the one printed below is valid.
KEY_FILE=$(mktemp "${TMPDIR:-/tmp}/demo-key.XXXXXX")
$PY - "$DEMO_USER" "$DEMO_PASSWORD" "$LOG_DIR/migrate.log" >"$KEY_FILE" <<'PY' &
import io, sys

import django

django.setup()
from django.core.management import call_command

with open(sys.argv[3], "w") as log:
    call_command("migrate", interactive=False, stdout=log)
created = io.StringIO()
call_command("create_api_user", sys.argv[1], staff=True, password=sys.argv[2], key_name="make run", replace=True,
             quiet=True, with_webhook_secret=True, stdout=created)
print(created.getvalue().strip())
PY
PREPARE_PID=$!
# GET /metrics wants this bearer token (or a staff session); one per run unless it is set.
export METRICS_TOKEN="${METRICS_TOKEN:-$(head -c 18 /dev/urandom | base64 | tr '+/' '-_')}"

# On a small machine the worker shares the cores with daphne, Redis and the database; OpenBLAS's
# spinning threads would take them all (measured: 3x the worker's CPU time on 2 cores). Leave
# one core to the rest unless OPENBLAS_NUM_THREADS is set.
CORES=$(nproc 2>/dev/null || echo 2)
BLAS_THREADS="${OPENBLAS_NUM_THREADS:-$(( CORES <= 4 ? (CORES > 1 ? CORES - 1 : 1) : CORES ))}"
# The engine workers: WORKERS_PER_MODEL for each model of MODELS (name=path or a bare path, named
# after its folder), or for the one model at MODEL_PATH. Each consumes its model's queues; the
# cores left to the workers are split between them.
WORKERS_PER_MODEL="${WORKERS_PER_MODEL:-1}"
IFS=',' read -r -a MODEL_ENTRIES <<< "${MODELS:-$MODEL_PATH}"
WORKER_COUNT=$(( ${#MODEL_ENTRIES[@]} * WORKERS_PER_MODEL ))
WORKER_BLAS_THREADS=$(( BLAS_THREADS / WORKER_COUNT > 0 ? BLAS_THREADS / WORKER_COUNT : 1 ))
for entry in "${MODEL_ENTRIES[@]}"; do
  entry="${entry// /}"
  if [[ "$entry" == *=* ]]; then name="${entry%%=*}"; path="${entry#*=}"; else path="$entry"; name=$(basename "$path"); fi
  for i in $(seq 1 "$WORKERS_PER_MODEL"); do
    start "engine-worker-$name-$i" env DB_POOL=0 OPENBLAS_NUM_THREADS="$WORKER_BLAS_THREADS" WAIT_FOR_MIGRATIONS=300 \
      MODEL_PATH="$path" MODEL_NAME="$name" $PY manage.py run_engine_worker
  done
done
# daphne runs each request on a thread of its own, so without a pool every request opens a
# database connection (~8 ms of PostgreSQL CPU). On PostgreSQL with psycopg[pool] installed it
# borrows from psycopg's pool instead (DB_POOL; set it to force either way). The engine worker
# keeps persistent connections and never uses the pool.
WEB_DB_POOL="${DB_POOL:-}"
if [ -z "$WEB_DB_POOL" ]; then
  WEB_DB_POOL=0
  if [[ "${DATABASE_URL:-}" == postgres* ]] && $PY -c "import psycopg_pool" 2>/dev/null; then WEB_DB_POOL=1; fi
fi
# Several daphne processes on one port (WEB_PROCESSES, default: one per core up to 4): one daphne
# runs every view and consumer under a single GIL, and a burst of submissions queued there.
start web env DB_POOL="$WEB_DB_POOL" $PY -m inference_service.serve_web -b "$HOST" -p "$PORT" \
  ${WEB_PROCESSES:+--processes "$WEB_PROCESSES"}
WEB_PID=${PIDS[-1]}
# The web starts beside the migrations too: nothing is announced (and no key exists) before they end.
wait "$PREPARE_PID" || { echo "error: the database's migrations or the demo key failed (see $LOG_DIR/migrate.log)" >&2; exit 1; }
DEMO_KEY=$(sed -n 1p "$KEY_FILE")
DEMO_WEBHOOK_SECRET=$(sed -n 2p "$KEY_FILE")
rm -f "$KEY_FILE"
FIRST_MODEL="${MODEL_ENTRIES[0]}"
FIRST_MODEL="${FIRST_MODEL// /}"
if [[ "$FIRST_MODEL" == *=* ]]; then FIRST_MODEL="${FIRST_MODEL%%=*}"; else FIRST_MODEL=$(basename "$FIRST_MODEL"); fi
wait_until 120 "the web server" web_answers
# One Python polls every 0.1 s: a Python per poll of wait_until would pay its start (0.1-0.3 s of a
# core) each time, and its half-second pauses would hold `ready.` back.
$PY -c "
import os, sys, time, redis
r = redis.Redis.from_url(os.environ['REDIS_URL'])
deadline = time.monotonic() + 300
while not any(True for _ in r.scan_iter('engine:workers:*')):
    if time.monotonic() > deadline:
        sys.exit('error: the engine worker did not come up within 300s (see $LOG_DIR/)')
    time.sleep(0.1)" || exit 1
# Webhooks, batches and the periodic sweeps: started once the rest is up, so that on a small
# machine they do not take the cores from the web and engine starts.
start celery-beat $PY -m celery -A inference_service beat --loglevel INFO -s var/celerybeat-schedule
start celery-worker $PY -m celery -A inference_service worker -Q celery -P solo --loglevel INFO -n "light@%h"
# Webhook attempts on a worker of their own, WEBHOOK_WORKERS at once (Celery's thread pool; an
# attempt mostly waits on its receiver): on the light worker, one key's hanging receivers held every
# batch and every other key's webhooks for 100 s. WEBHOOK_CONCURRENCY_PER_KEY bounds one key's share.
start webhooks-worker $PY -m celery -A inference_service worker -Q webhooks -P threads -c "${WEBHOOK_WORKERS:-8}" \
  --loglevel INFO -n "webhooks@%h"

BASE="http://$HOST:$PORT"
cat <<EOF

ready. Demo API key of user '$DEMO_USER' (the keys of earlier runs no longer work); in your shell:
  export KEY=$DEMO_KEY

Submit a job and read it back:
  curl -s -X POST $BASE/api/v1/jobs -H "Authorization: Bearer \$KEY" -H "Content-Type: application/json" \\
       -d '{"prompt": "def fibonacci(n):", "max_tokens": 64}'
  curl -s $BASE/api/v1/jobs/<id> -H "Authorization: Bearer \$KEY"

Stream over a WebSocket (type the JSON line and press Enter):
  $PY -m websockets "ws://$HOST:$PORT/ws/v1/generate?api_key=\$KEY"
  {"prompt": "class Stack:", "max_tokens": 64}
or watch an existing job (resume with ?after=<seq>):
  $PY -m websockets "ws://$HOST:$PORT/ws/v1/jobs/<id>/?api_key=\$KEY"
or as server-sent events over plain HTTP:
  curl -N $BASE/api/v1/jobs/<id>/events -H "Authorization: Bearer \$KEY"

OpenAI-compatible (any OpenAI SDK with base_url $BASE/v1 and this key):
  curl -s $BASE/v1/chat/completions -H "Authorization: Bearer \$KEY" -H "Content-Type: application/json" \\
       -d '{"model": "$FIRST_MODEL", "messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 64}'

Webhooks: a job or batch that names "webhook_url" is POSTed there when it ends, signed with
this key's webhook secret (loopback receivers allowed on this run). To watch them locally:
  WEBHOOK_SECRET=$DEMO_WEBHOOK_SECRET $PY scripts/webhook_receiver.py 9000
and add "webhook_url": "http://127.0.0.1:9000/" to a job's JSON.

Admin and engine dashboard: $BASE/admin/  (user '$DEMO_USER', password '$DEMO_PASSWORD')
Prometheus metrics: curl -s $BASE/metrics -H "Authorization: Bearer $METRICS_TOKEN"
API docs: $BASE/api/v1/docs
Logs: $LOG_DIR/   Ctrl-C stops everything.
EOF

# Stop the rest as soon as a process exits by itself. Ctrl-C never gets here: its trap stops
# everything and exits.
status=0
wait -n "${PIDS[@]}" || status=$?
echo "a process exited by itself (status $status); stopping the rest. See $LOG_DIR/"
exit 1
