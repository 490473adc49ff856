#!/usr/bin/env bash
# Where the engine process's time goes, this service's against the engine alone's, under the same
# load: peer_bench.py runs each server at C clients (one round, one level), and py-spy samples
# the engine process (every thread, by thread id) for PROFILE_S seconds in the middle of the level.
# On the lent GPU machine (device tool):
#
#   here:   PEER=0 PYSPY=1 bash bench/h200_prepare.sh   (adds .whl/py-spy.xz)
#   device: carry [".whl"], command "OUT=$OUT/profile bash bench/h200_profile.sh"
#   here:   python bench/probes/pyspy_threads.py <files_at>/profile/ours.txt <files_at>/profile/engine.txt
#
# C (default 128) clients, REQUESTS per client (default 6: the level outlasts START_S + PROFILE_S), PROFILE_S (10)
# seconds of samples from START_S (8) seconds after the server is ready (past the warm-up).
set -euo pipefail
out=${OUT:-/tmp/profile}
mkdir -p "$out" /tmp/pyspy
xz -dc .whl/py-spy.xz > /tmp/pyspy/py-spy && chmod +x /tmp/pyspy/py-spy
for server in ours engine; do
    log="$out/$server.log"
    bash bench/h200_peer.sh --servers "$server" --concurrency "${C:-128}" --batch "${C:-128}" --rounds 1 \
        --one-token 0 --requests-per-client "${REQUESTS:-6}" >"$log" 2>&1 &
    bench=$!
    until grep -q "ready in" "$log" 2>/dev/null; do kill -0 $bench 2>/dev/null || break; sleep 0.5; done
    sleep "${START_S:-8}"
    # The engine process: the worker's spawned child (ours), bench/engine_loop.py itself (engine).
    if [ "$server" = ours ]; then pid=$(pgrep -f spawn_main | head -1); else pid=$(pgrep -f engine_loop.py | head -1); fi
    /tmp/pyspy/py-spy record --pid "$pid" --duration "${PROFILE_S:-10}" --rate 100 --threads --nonblocking \
        --format raw --output "$out/$server.txt" >"$out/$server.pyspy.log" 2>&1 || tail -3 "$out/$server.pyspy.log"
    wait $bench || true
    grep -E "tok/s=|cpu cores" "$log" || tail -5 "$log"
done
