#!/usr/bin/env bash
# Create (or refresh) the peers' venvs for benchmarks/peers.py, one per peer,
# from the pins beside this script (epicbox.txt, llm-sandbox.txt).
#
# Why their own venvs: epicbox 1.1.0 needs urllib3 < 2 and retool_exec's venv
# has urllib3 2, and no peer should be imported into the process that times
# our backends. benchmarks/peers_worker.py runs in each venv.
#
# A venv whose installed packages already match its pins is left alone; one
# that differs is recreated. Usage: benchmarks/peers/setup.sh [PEER...]
# Env: PYTHON  the interpreter to base the venvs on (default .venv/bin/python)
#      BENCH_PEERS_DIR  where the venvs go
#                       (default ${XDG_CACHE_HOME:-$HOME/.cache}/retool-exec-bench/peers)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
dir=${BENCH_PEERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/retool-exec-bench/peers}
peers=("$@")
[ ${#peers[@]} -gt 0 ] || peers=(epicbox llm-sandbox)

# The pins without comments, extras or case differences: what `pip freeze` prints.
wanted() {
  grep -v '^#' "$1" | sed -e 's/\[[^]]*\]//' | tr 'A-Z_' 'a-z-' | sort
}

for peer in "${peers[@]}"; do
  pins=$here/$peer.txt
  [ -f "$pins" ] || { echo "peers/setup.sh: no pins for '$peer' ($pins)" >&2; exit 2; }
  venv=$dir/$peer-venv
  if [ -x "$venv/bin/python" ] &&
    diff -q <(wanted "$pins") <("$venv/bin/python" -m pip freeze --all --exclude pip --exclude setuptools --exclude wheel 2>/dev/null | tr 'A-Z_' 'a-z-' | sort) >/dev/null; then
    echo "peers/setup.sh: $venv matches $peer.txt" >&2
    continue
  fi
  echo "peers/setup.sh: creating $venv from $peer.txt" >&2
  rm -rf "$venv"
  mkdir -p "$dir"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$pins"
  "$venv/bin/python" -m pip check >&2
done
