#!/usr/bin/env bash
# Fills .whl/ (git-ignored) with what bench/h200_all.sh, h200_service.sh and h200_peer.sh carry to
# the lent GPU machine, which reaches no registry: run it here, in the repo root, once per checkout.
#
#   bash bench/h200_prepare.sh          # service + vllm-mlx (peer), SQLite: what h200_all.sh needs
#   PG=1 bash bench/h200_prepare.sh     # also PostgreSQL and psycopg, for "DB=postgres bash bench/h200_service.sh"
#                                       # and peer_bench's server ourspg
#   PG=1 PEER=0 bash bench/h200_prepare.sh   # without vllm-mlx: PostgreSQL alone does not fit beside it
#   PEER=0 PYSPY=1 bash bench/h200_prepare.sh  # with py-spy, for bench/h200_profile.sh
#
# It writes, for that machine's Python 3.12:
#   * mlx, mlx-lm and mlx-cuda-13 (slimmed to sm_90 by ../shared/tools/slim_cuda_wheel.py) and gpu-env.sh;
#   * site.tar.xz: the service's wheels with their dependencies and vllm-mlx 0.6.0 with the server
#     packages it needs, less those the machine's image already has, unpacked into one folder and
#     packed with xz (the script prints its size). Left out: Django's and DRF's translations,
#     Django's GIS package, Twisted's and autobahn's tests, autobahn's bundled flatc binary (no
#     process of the benchmark imports them); vllm-mlx's own dependencies (they would pull
#     gigabytes and another mlx-lm). The device side unpacks it into /tmp/site (bench/h200_site.sh);
#   * redis.tar.xz: this machine's redis-server with the two libraries the machine's image lacks;
#   * with PG=1: pg.tar.xz (PostgreSQL 16 out of the pgserver wheel) and psycopg in site.tar.xz;
#   * with PYSPY=1: py-spy.xz (py-spy's static binary).
# What travels is the working tree plus .whl/, at most 64 MiB: the script prints every part and the total.
# SHARED names the folder of the shared GPU tools (default ../shared, beside the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${SHARED:-../shared}
rm -rf .whl && mkdir -p .whl/full
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/wheels" "$work/site"
download() {  # pip download for the GPU machine's CPython 3.12 on x86-64
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
        --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "$@" 2>&1 | grep -v 'is ignored' || true
}

download --no-deps -d .whl/full mlx==0.32.4 mlx-lm==0.32.2 mlx-cuda-13==0.32.4
mv .whl/full/mlx-0*.whl .whl/full/mlx_lm-*.whl .whl/
python3 "$SHARED/tools/slim_cuda_wheel.py" .whl/full/mlx_cuda_13-*.whl .whl 90
rm -r .whl/full
cp "$SHARED/tools/gpu-env.sh" .whl/

# The service's pins (pyproject.toml) and the bench client's websockets, with their dependencies.
pg=()
[ "${PG:-0}" = 1 ] && pg=('psycopg[binary]==3.3.9' psycopg-pool==3.3.3)
download -d "$work/wheels" django==5.2.19 djangorestframework==3.18.3 drf-spectacular==0.30.0 channels==4.3.2 \
    channels-redis==4.3.0 daphne==4.2.3 celery==5.7.0 redis==8.1.0 dj-database-url==3.1.2 \
    prometheus-client==0.26.0 standardwebhooks==1.1.0 httpx==0.29.0 websockets==17.4 llguidance==1.9.1 "${pg[@]}"
# vllm-mlx for peer_bench.py's vllm server. Pinned: with --no-deps no resolver checks them against
# each other, so the set stays one that ran.
[ "${PEER:-1}" = 1 ] && download --no-deps -d "$work/wheels" vllm-mlx==0.6.0 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 \
    pydantic==2.14.4 pydantic-core==2.50.5 python-multipart==0.0.34 annotated-types==0.8.0 \
    typing-inspection==0.4.5 opentelemetry-api==1.45.2
# What the machine's image already has.
(cd "$work/wheels" && rm -f attrs-* click-8* idna-* msgpack-* packaging-* python_dateutil-* pyyaml-* six-* \
    typing_extensions-*)
# A wheel unpacked is an installed package (less its scripts, which nothing here runs): its
# *.data/purelib and platlib go to the top, the rest of *.data is dropped.
python3 - "$work/wheels" "$work/site" <<'PY'
import glob, os, re, shutil, sys, zipfile

src, site = sys.argv[1:]
drops = {
    "django-5": lambda f: f.startswith("django/contrib/gis/") or ("/locale/" in f and not f.endswith(".py")),
    "djangorestframework-": lambda f: "/locale/" in f,
    "twisted-": lambda f: re.search(r"/test/|/newsfragments/", f) is not None,
    "autobahn-": lambda f: f.startswith(("autobahn/_flatc/", "autobahn/test/")),  # a bundled flatc binary
}
for wheel in sorted(glob.glob(os.path.join(src, "*.whl"))):
    drop = next((d for prefix, d in drops.items() if os.path.basename(wheel).startswith(prefix)), lambda f: False)
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if drop(name) or name.endswith("/"):
                continue
            target = re.sub(r"^[^/]+\.data/(purelib|platlib)/", "", name)
            if re.match(r"^[^/]+\.data/", target):
                continue
            path = os.path.join(site, target)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with z.open(name) as fin, open(path, "wb") as fout:
                shutil.copyfileobj(fin, fout)
PY
find "$work/site" -name '__pycache__' -prune -exec rm -rf {} +
tar cf - -C "$work/site" . | xz -9 -T0 > .whl/site.tar.xz

mkdir -p "$work/bin"
cp "$(command -v redis-server)" /lib/x86_64-linux-gnu/libjemalloc.so.2 /lib/x86_64-linux-gnu/liblzf.so.1 "$work/bin/"
tar cJf .whl/redis.tar.xz -C "$work/bin" .

if [ "${PG:-0}" = 1 ]; then
    download --no-deps -d "$work" pgserver==0.1.4
    # Left out, to fit beside the rest: the server's symbols, the encoding conversions (a UTF-8
    # database loads none) and every time zone but UTC's.
    (cd "$work" && unzip -q pgserver-*.whl && strip pgserver/pginstall/bin/postgres &&
        tar cJf "$OLDPWD/.whl/pg.tar.xz" --exclude='*/vector.so' --exclude='*/pgxs' --exclude='*_and_*.so' \
        --exclude='*/timezone/[A-DFH-TV-Z]*' --exclude='*/timezone/Europe' --exclude='*/timezone/US' \
        pgserver.libs pgserver/pginstall/bin/postgres pgserver/pginstall/bin/initdb pgserver/pginstall/bin/pg_ctl \
        pgserver/pginstall/lib/postgresql pgserver/pginstall/share/postgresql)
fi

if [ "${PYSPY:-0}" = 1 ]; then  # bench/h200_profile.sh's sampler: one static binary
    download --no-deps -d "$work" py-spy==0.4.3
    (cd "$work" && unzip -q -o py_spy-*.whl 'py_spy-*.data/scripts/py-spy' && xz -9c py_spy-*.data/scripts/py-spy) \
        > .whl/py-spy.xz
fi

du -sh .whl/* | sed 's/^/  /'
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r du -cb | tail -1 | cut -f1)
carried=$(du -sb .whl | cut -f1)
total=$((tree + ${untracked:-0} + carried))
echo "working tree $((tree / 1048576)) MiB + untracked $((${untracked:-0} / 1048576)) MiB + .whl $((carried / 1048576)) MiB" \
     "= $((total / 1048576)) MiB (limit 64)"
[ "$total" -le $((64 * 1048576)) ] || { echo "error: over the 64 MiB carry limit" >&2; exit 1; }
