#!/usr/bin/env bash
# Reproduce docs/benchmarks.{md,png,json}.
#
# 1. A baseline interpreter for the local backend with the same numpy, sympy,
#    scipy and mpmath versions as the sandbox image (Debian bookworm's), so
#    local and Docker import the same libraries.
# 2. benchmarks/make_report.py: waits (up to 10 min) for a quiet machine, runs
#    `retool-exec bench` over every backend and policy, renders the page.
# 3. benchmarks/peers.py: epicbox and llm-sandbox (each in its own venv, made
#    by benchmarks/peers/setup.sh) against local, docker-reuse and docker-fresh,
#    interleaved, into docs/benchmarks-peers.json; then the page is rendered
#    again with its Peers section. BENCH_PEERS=0 skips this step.
#
# Extra arguments go to `retool-exec bench` (e.g. --quick for a dry run; the
# peers run gets --quick too).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
BASELINE=${BENCH_BASELINE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/retool-exec-bench/baseline-venv}
PINS="numpy==1.24.2 sympy==1.11.1 scipy==1.10.1 mpmath==1.2.1"

if ! "$BASELINE/bin/python" -c 'import numpy, sympy, scipy, mpmath' 2>/dev/null; then
    echo "creating the local baseline interpreter in $BASELINE ($PINS)" >&2
    "$PYTHON" -m venv "$BASELINE"
    # shellcheck disable=SC2086  # the pins are words
    "$BASELINE/bin/pip" install --quiet $PINS
fi
"$PYTHON" -c 'import matplotlib' 2>/dev/null || "$PYTHON" -m pip install --quiet -e '.[bench]'

# 160 recorded calls per cell (the bench's default is 40): a throughput cell at 16
# callers is then 10 batches, not 3, and at 64 callers 3, not 1. With 3 batches one
# slow batch (65.7 ms among 29-34) moved error's 16-caller ratio from 1.64x to 1.30x
# between two runs of the same code. A later --calls (or --quick) overrides it.
calls=(--calls 160)
for arg in "$@"; do
    [ "$arg" != --quick ] || calls=()
done
uptime >&2
"$PYTHON" benchmarks/make_report.py --local-python "$BASELINE/bin/python" "${calls[@]}" "$@"

if [ "${BENCH_PEERS:-1}" != 0 ]; then
    peers_args=()
    for arg in "$@"; do
        [ "$arg" != --quick ] || peers_args+=(--quick)
    done
    PYTHON="$PYTHON" benchmarks/peers/setup.sh
    "$PYTHON" benchmarks/peers.py --no-setup --local-python "$BASELINE/bin/python" "${peers_args[@]}"
    "$PYTHON" benchmarks/make_report.py --render-only
fi
