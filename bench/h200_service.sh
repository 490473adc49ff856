#!/usr/bin/env bash
# The service benchmark on the lent GPU machine (device tool, nvidia-h200: 16 cores, no registry).
#
# That machine has Python 3.12, PyTorch's image and transformers, but no Django stack, no Redis and
# no PostgreSQL. `bash bench/h200_prepare.sh` fills .whl/ (git-ignored) here, once per checkout:
# mlx on CUDA (as ../shared/tools/gpu-env.sh says), the service's packages in .whl/site.tar.xz, this
# machine's redis-server in .whl/bin/, and with PG=1 PostgreSQL 16 out of the pgserver wheel in
# .whl/pg.tar.xz and psycopg (for DB=postgres). The carry limit is 64 MiB: that script prints the size.
# Then: device run, carry [".whl"], command "[DB=postgres] bash bench/h200_service.sh [service_bench args]".
# The database is SQLite (the embedded default) or, with DB=postgres, a local PostgreSQL as deployed;
# Redis is a local redis-server.
set -euo pipefail
source bench/h200_site.sh
if [ "${DB:-sqlite}" = postgres ]; then
    [ -f .whl/pg.tar.xz ] || { echo "error: DB=postgres needs .whl/pg.tar.xz: run PG=1 bash bench/h200_prepare.sh" >&2; exit 1; }
    if ! python3 -c 'import psycopg; psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres").close()' 2>/dev/null; then
        mkdir -p /tmp/pg && tar xJf .whl/pg.tar.xz -C /tmp/pg && chmod -R a+rX /tmp/pg
        PGBIN=/tmp/pg/pgserver/pginstall/bin
        id pgrun >/dev/null 2>&1 || useradd -M pgrun  # PostgreSQL refuses to run as root
        mkdir -p /tmp/pgdata && chown pgrun /tmp/pgdata
        su pgrun -s /bin/bash -c "$PGBIN/initdb -D /tmp/pgdata -U postgres -A trust >/tmp/initdb.log 2>&1 &&
            $PGBIN/pg_ctl -D /tmp/pgdata -l /tmp/pg.log -o '-p 5432 -k /tmp -c max_connections=300' start -w"
    fi
    unset BENCH_DATABASE_URL  # service_bench's default: a service_bench database on 127.0.0.1:5432
else
    export BENCH_DATABASE_URL=sqlite:////tmp/service_bench.sqlite3
fi
MODEL=${MODEL:-var/models/tiny}
[ -d "$MODEL" ] || python3 -m demo_model.builder "$MODEL" ${MODEL_ARGS:-}
# SCRIPT=bench/engine_bench.py (or another script taking --model) runs that instead of the service benchmark.
python3 "${SCRIPT:-bench/service_bench.py}" --model "$MODEL" "$@"
