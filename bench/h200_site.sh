# Sourced by bench/h200_*.sh on the lent GPU machine: mlx on CUDA (.whl/gpu-env.sh), the service's
# and vllm-mlx's packages unpacked from .whl/site.tar.xz into /tmp/site (on PYTHONPATH, set by
# gpu-env.sh), and a local redis-server from .whl/bin on port 6379. bench/h200_prepare.sh fills .whl/.
source .whl/gpu-env.sh || return 1
mkdir -p /tmp/site && tar xJf .whl/site.tar.xz -C /tmp/site || return 1
# The archive carries no bytecode (it would not fit the carry); compile it once here, as pip does on
# install, so that no measured process compiles Django, DRF or Celery on the fly (a cold import of
# the app takes about 3x a warm one). -j0: every core.
python3 -m compileall -q -j0 /tmp/site >/dev/null 2>&1 || true
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} MLX_DISABLE_OPENBLAS=1
if ! python3 -c 'import redis; redis.Redis().ping()' 2>/dev/null; then
    LD_LIBRARY_PATH=$PWD/.whl/bin .whl/bin/redis-server --port 6379 --save '' --appendonly no --daemonize yes \
        --logfile /tmp/redis.log
    for _ in $(seq 50); do python3 -c 'import redis; redis.Redis().ping()' 2>/dev/null && break; sleep 0.1; done
fi
