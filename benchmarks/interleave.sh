#!/usr/bin/env bash
# One benchmark on two checkouts of gpumux (say, before and after a change), interleaved:
# ROUNDS rounds, A then B in odd rounds and B then A in even ones, each checkout running its
# own copy of the benchmark against its own code (PYTHONPATH). Quote the medians per checkout.
#
#   benchmarks/interleave.sh TREE_A TREE_B ROUNDS BENCHMARK [ARGS...]
#   git worktree add /tmp/before e7603ed
#   benchmarks/interleave.sh /tmp/before . 3 launch_overhead.py --repeats 1
set -euo pipefail
if [ $# -lt 4 ]; then
    sed -n '2,8p' "$0" >&2
    exit 2
fi
a=$(cd "$1" && pwd) b=$(cd "$2" && pwd) rounds=$3 benchmark=$4
shift 4
python=${PYTHON:-python3}
for round in $(seq 1 "$rounds"); do
    if [ $((round % 2)) = 1 ]; then order="$a $b"; else order="$b $a"; fi
    for tree in $order; do
        echo "=== round $round: $tree ($(git -C "$tree" rev-parse --short HEAD))"
        (cd "$tree" && PYTHONPATH="$tree" PYTHONUNBUFFERED=1 "$python" "benchmarks/$benchmark" "$@")
    done
done
