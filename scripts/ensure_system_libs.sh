#!/usr/bin/env bash
# The fast BLAS for mlx on Linux (engine_worker/runner/blas.py picks the first one that loads and can run
# on this CPU): cmeel-openblas (a pip package) needs libgfortran.so.5 and, being built for SKYLAKEX
# only, a CPU with AVX-512; Debian's libopenblas0-pthread chooses its kernels at run time and is
# the one used elsewhere. Without either the engine still works, on mlx's slow reference BLAS, so a
# failure here is a warning, not an error.
set -u
[ "$(uname -s)" = "Linux" ] || exit 0
have() { ldconfig -p 2>/dev/null | grep -q "$1 "; }
missing=()
have libgfortran.so.5 || missing+=(libgfortran5)
[ "$(uname -m)" = "x86_64" ] && ! have libopenblas.so.0 && missing+=(libopenblas0-pthread)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  echo "installing ${missing[*]} (fast BLAS for mlx)"
  apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1; }
fi
have libgfortran.so.5 || echo "warning: libgfortran5 missing; mlx may use its slow reference BLAS (install libgfortran5)"
have libopenblas.so.0 || echo "warning: libopenblas0 missing; on CPUs without AVX-512 mlx uses its slow reference BLAS (install libopenblas0-pthread)"
exit 0
