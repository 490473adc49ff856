#!/usr/bin/env bash
# OpenBLAS from cmeel-openblas needs libgfortran.so.5. Without it the engine still works, on mlx's
# slow reference BLAS (see engine_worker/blas.py), so a failure here is a warning, not an error.
set -u
[ "$(uname -s)" = "Linux" ] || exit 0
ldconfig -p 2>/dev/null | grep -q 'libgfortran.so.5 ' && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  echo "installing libgfortran5 (needed by OpenBLAS)"
  apt-get install -y -qq libgfortran5 >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libgfortran5 >/dev/null 2>&1; }
fi
ldconfig -p 2>/dev/null | grep -q 'libgfortran.so.5 ' || echo "warning: libgfortran5 missing; mlx will use its slow reference BLAS (install libgfortran5)"
exit 0
