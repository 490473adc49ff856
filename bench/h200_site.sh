# Sourced by bench/h200_*.sh on the lent GPU machine: mlx on CUDA (.whl/gpu-env.sh), the service's
# and vllm-mlx's packages unpacked from .whl/site.tar.xz into /tmp/site (on PYTHONPATH, set by
# gpu-env.sh), and a local redis-server from .whl/redis.tar.xz on port 6379. bench/h200_prepare.sh fills .whl/.
source .whl/gpu-env.sh || return 1
mkdir -p /tmp/site && tar xJf .whl/site.tar.xz -C /tmp/site || return 1
# The archive carries no bytecode (it would not fit the carry); compile it once here, as pip does on
# install, so that no measured process compiles Django, DRF or Celery on the fly (a cold import of
# the app takes about 3x a warm one). -j0: every core.
python3 -m compileall -q -j0 /tmp/site >/dev/null 2>&1 || true
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} MLX_DISABLE_OPENBLAS=1
if ! python3 -c 'import redis; redis.Redis().ping()' 2>/dev/null; then
    mkdir -p /tmp/redis && tar xJf .whl/redis.tar.xz -C /tmp/redis
    LD_LIBRARY_PATH=/tmp/redis /tmp/redis/redis-server --port 6379 --save '' --appendonly no --daemonize yes \
        --logfile /tmp/redis.log
    for _ in $(seq 50); do python3 -c 'import redis; redis.Redis().ping()' 2>/dev/null && break; sleep 0.1; done
fi

# A local PostgreSQL 16 on 127.0.0.1:5432 (user postgres, trust), out of .whl/pg.tar.xz (PG=1 bash
# bench/h200_prepare.sh), unless one answers already: for DB=postgres and peer_bench's ourspg.
start_postgres() {
    [ -f .whl/pg.tar.xz ] || { echo "error: PostgreSQL needs .whl/pg.tar.xz: run PG=1 bash bench/h200_prepare.sh" >&2; return 1; }
    python3 -c 'import psycopg; psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres").close()' 2>/dev/null && return 0
    mkdir -p /tmp/pg && tar xJf .whl/pg.tar.xz -C /tmp/pg && chmod -R a+rX /tmp/pg
    local bin=/tmp/pg/pgserver/pginstall/bin
    id pgrun >/dev/null 2>&1 || useradd -M pgrun  # PostgreSQL refuses to run as root
    mkdir -p /tmp/pgdata && chown pgrun /tmp/pgdata
    su pgrun -s /bin/bash -c "$bin/initdb -D /tmp/pgdata -U postgres -A trust >/tmp/initdb.log 2>&1 &&
        $bin/pg_ctl -D /tmp/pgdata -l /tmp/pg.log -o '-p 5432 -k /tmp -c max_connections=300' start -w"
}
