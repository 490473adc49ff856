#!/usr/bin/env bash
# Interleaved A/B of the service benchmark between two commits, on this machine.
#
#   bash bench/ab_service.sh OLD_COMMIT NEW_COMMIT ROUNDS [service_bench args...]
#
# Each commit is checked out into a worktree under ${AB_DIR:-/tmp/ab_service} that shares this
# checkout's .venv and var/models. The rounds alternate old, new, old, new... (the machines are
# noisy, so the sides share the same drifts), and every run appends its JSON line to
# $AB_DIR/{old,new}.jsonl. Compare medians. Worktrees are removed at the end; a failed run's
# service logs are kept beside its output.
set -euo pipefail
OLD=$1 NEW=$2 ROUNDS=$3
shift 3
ROOT=$(cd "$(dirname "$0")/.." && pwd)
AB_DIR=${AB_DIR:-/tmp/ab_service}
mkdir -p "$AB_DIR"
cleanup() { for side in old new; do git -C "$ROOT" worktree remove --force "$AB_DIR/$side" 2>/dev/null || true; done; }
trap cleanup EXIT
for side in old new; do
    commit=$OLD; [ "$side" = new ] && commit=$NEW
    git -C "$ROOT" worktree add -q --detach "$AB_DIR/$side" "$commit"
    ln -s "$ROOT/.venv" "$AB_DIR/$side/.venv"
    mkdir -p "$AB_DIR/$side/var" && ln -s "$ROOT/var/models" "$AB_DIR/$side/var/models"
done
for round in $(seq "$ROUNDS"); do
    for side in old new; do
        echo "round $round: $side"
        if ! (cd "$AB_DIR/$side" && OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} .venv/bin/python bench/service_bench.py "$@" \
            --out "$AB_DIR/$side.jsonl" > "$AB_DIR/${side}_$round.log" 2>&1); then
            # Keep the services' logs of a failed run: the worktree (and its var/log) goes at the end.
            cp -r "$AB_DIR/$side/var/log" "$AB_DIR/${side}_${round}_service_logs"
            echo "round $round: $side failed; see $AB_DIR/${side}_$round.log and ${side}_${round}_service_logs"
        fi
    done
done
