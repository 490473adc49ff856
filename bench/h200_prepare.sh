#!/usr/bin/env bash
# Fills .whl/ (git-ignored) with what bench/h200_service.sh and bench/h200_peer.sh carry to the lent
# GPU machine, which reaches no registry: run it here, in the repo root, once per checkout.
#
#   bash bench/h200_prepare.sh          # then: device run, carry [".whl"], command "DB=postgres bash bench/h200_service.sh ..."
#   PEER=1 bash bench/h200_prepare.sh   # also .whl/peer/, for "bash bench/h200_peer.sh ..."
#
# It writes, for that machine's Python 3.12:
#   * mlx, mlx-lm and mlx-cuda-13 (slimmed to sm_90 by ../shared/tools/slim_cuda_wheel.py) and gpu-env.sh;
#   * svc/: the service's wheels with their dependencies, less those the machine's image already has,
#     Django's and DRF's translations, Django's GIS package, Twisted's and autobahn's tests, autobahn's bundled
#     flatc binary (no process of the benchmark imports them);
#   * bin/: this machine's redis-server with the two libraries the machine's image lacks;
#   * pg.tar.xz: PostgreSQL 16 out of the pgserver wheel (server, initdb, pg_ctl, its libraries);
#   * with PEER=1, peer/: vllm-mlx 0.6.0 without its dependencies (they would pull gigabytes and
#     another mlx-lm) and the server packages it needs that the machine's image lacks, for
#     bench/peer_bench.py's vllm-mlx server (mlx_lm.server needs nothing more).
# What travels is the working tree plus .whl/, at most 64 MiB: the script prints the total.
# SHARED names the folder of the shared GPU tools (default ../shared, beside the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${SHARED:-../shared}
rm -rf .whl && mkdir -p .whl/full .whl/svc .whl/bin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
download() {  # pip download for the GPU machine's CPython 3.12 on x86-64
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "$@" 2>&1 | grep -v 'is ignored' || true
}

download --no-deps -d .whl/full mlx==0.32.4 mlx-lm==0.32.2 mlx-cuda-13==0.32.4
mv .whl/full/mlx-0*.whl .whl/full/mlx_lm-*.whl .whl/
python3 "$SHARED/tools/slim_cuda_wheel.py" .whl/full/mlx_cuda_13-*.whl .whl 90
rm -r .whl/full
cp "$SHARED/tools/gpu-env.sh" .whl/

# The service's pins (pyproject.toml) and the bench client's websockets, with their dependencies.
download -d .whl/svc django==5.2.19 djangorestframework==3.18.3 drf-spectacular==0.30.0 channels==4.3.2 \
    channels-redis==4.3.0 daphne==4.2.3 celery==5.7.0 redis==8.1.0 dj-database-url==3.1.2 \
    'psycopg[binary]==3.3.9' psycopg-pool==3.3.3 prometheus-client==0.26.0 standardwebhooks==1.1.0 \
    httpx==0.29.0 websockets==17.4
(cd .whl/svc && rm -f attrs-* click-8* idna-* msgpack-* packaging-* python_dateutil-* pyyaml-* six-* \
    typing_extensions-*)
python3 - <<'PY'
import glob, os, re, zipfile

def strip(pattern, drop):
    src = glob.glob(os.path.join(".whl/svc", pattern))[0]
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(src + ".tmp", "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            if not drop(item.filename):
                zout.writestr(item, zin.read(item.filename))
    os.replace(src + ".tmp", src)

strip("django-5*.whl", lambda f: f.startswith("django/contrib/gis/") or ("/locale/" in f and not f.endswith(".py")))
strip("djangorestframework-*.whl", lambda f: "/locale/" in f)
strip("twisted-*.whl", lambda f: re.search(r"/test/|/newsfragments/", f) is not None)
strip("autobahn-*.whl", lambda f: f.startswith(("autobahn/_flatc/", "autobahn/test/")))  # a bundled flatc binary
PY

cp "$(command -v redis-server)" .whl/bin/
cp /lib/x86_64-linux-gnu/libjemalloc.so.2 /lib/x86_64-linux-gnu/liblzf.so.1 .whl/bin/

download --no-deps -d "$work" pgserver==0.1.4
(cd "$work" && unzip -q pgserver-*.whl && tar cJf "$OLDPWD/.whl/pg.tar.xz" --exclude='*/vector.so' --exclude='*/pgxs' \
    pgserver.libs pgserver/pginstall/bin/postgres pgserver/pginstall/bin/initdb pgserver/pginstall/bin/pg_ctl \
    pgserver/pginstall/lib/postgresql pgserver/pginstall/share/postgresql)

if [ "${PEER:-0}" = 1 ]; then
    mkdir -p .whl/peer
    # Pinned: with --no-deps no resolver checks them against each other, so the set stays one that ran.
    download --no-deps -d .whl/peer vllm-mlx==0.6.0 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 \
        pydantic==2.14.4 pydantic-core==2.50.5 python-multipart==0.0.34 annotated-types==0.8.0 \
        typing-inspection==0.4.5 opentelemetry-api==1.45.2
fi

tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
carried=$(du -sb .whl | cut -f1)
echo "working tree $((tree / 1048576)) MiB + .whl $((carried / 1048576)) MiB = $(((tree + carried) / 1048576)) MiB (limit 64; an _old/ tree for peer_bench.py --old adds ~1)"
