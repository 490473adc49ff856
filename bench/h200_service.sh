#!/usr/bin/env bash
# The service benchmark on the lent GPU machine (device tool, nvidia-h200: 16 cores, no registry).
#
# That machine has Python 3.12, PyTorch's image and transformers, but no Django stack, no Redis and
# no PostgreSQL. `bash bench/h200_prepare.sh` fills .whl/ (git-ignored) here, once per checkout:
# mlx on CUDA (as ../shared/tools/gpu-env.sh says), the service's packages in .whl/site.tar.xz, this
# machine's redis-server in .whl/redis.tar.xz, and with PG=1 PostgreSQL 16 out of the pgserver wheel in
# .whl/pg.tar.xz and psycopg (for DB=postgres). The carry limit is 64 MiB: that script prints the size.
# Then: device run, carry [".whl"], command "[DB=postgres] bash bench/h200_service.sh [service_bench args]".
# The database is SQLite (the embedded default) or, with DB=postgres, a local PostgreSQL as deployed;
# Redis is a local redis-server.
set -euo pipefail
source bench/h200_site.sh
if [ "${DB:-sqlite}" = postgres ]; then
    start_postgres
    unset BENCH_DATABASE_URL  # service_bench's default: a service_bench database on 127.0.0.1:5432
else
    export BENCH_DATABASE_URL=sqlite:////tmp/service_bench.sqlite3
fi
MODEL=${MODEL:-var/models/tiny}
[ -d "$MODEL" ] || python3 -m demo_model.builder "$MODEL" ${MODEL_ARGS:-}
# SCRIPT=bench/engine_bench.py (or another script taking --model) runs that instead of the service benchmark.
python3 "${SCRIPT:-bench/service_bench.py}" --model "$MODEL" "$@"
