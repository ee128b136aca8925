#!/usr/bin/env bash
# Make a Docker Engine with gVisor reachable on this Debian machine (for
# `make demo`, the tests and CI).
#
# - If `docker info` already answers, it changes nothing and exits 0.
# - Otherwise (root only) it installs Debian's `docker.io` and `runsc` (gVisor)
#   with apt-get when missing, registers runsc in /etc/docker/daemon.json as
#   the runtimes "runsc" and "runsc-ptrace" (a new file also turns the default
#   bridge off, so no container can reach any network), starts dockerd and
#   waits until `docker info` answers.
#
# Usage: bash images/docker-up.sh        (from the repository root; `make docker-up`)
# Env:   DOCKER_UP_TIMEOUT   seconds to wait for the daemon (default 60)
#        DOCKER_UP_LOG       dockerd log file (default /tmp/dockerd.log)
set -euo pipefail

timeout_s=${DOCKER_UP_TIMEOUT:-60}
log=${DOCKER_UP_LOG:-/tmp/dockerd.log}
daemon_json=/etc/docker/daemon.json

die() {
  echo "docker-up: $*" >&2
  exit 1
}

# The executable path of a command, if there is one (`command -v` alone also
# names a non-executable file found on PATH).
exe() {
  local path
  path=$(command -v "$1" 2>/dev/null) && [ -x "$path" ] && echo "$path"
}

reachable() {
  exe docker >/dev/null && timeout 20 docker info >/dev/null 2>&1
}

runtimes() {
  local names
  names=$(docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}' 2>/dev/null) || true
  echo "${names% }"
}

case $timeout_s in
  '' | *[!0-9]*) die "DOCKER_UP_TIMEOUT must be a whole number of seconds, not '$timeout_s'" ;;
esac

# 1. Nothing to do when a daemon already answers.
if reachable; then
  echo "docker-up: daemon already reachable (server $(docker version --format '{{.Server.Version}}' 2>/dev/null); runtimes: $(runtimes))"
  case " $(runtimes) " in
    *" runsc "*) ;;
    *) echo "docker-up: note: runtime 'runsc' is not registered, so gVisor is unavailable (add it to $daemon_json and restart dockerd)" >&2 ;;
  esac
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  die "no reachable Docker daemon and not root: start Docker yourself, run this script as root, or set DOCKER_HOST"
fi

# 2. Install what is missing, from Debian's own packages (docker.io ships
#    dockerd and the docker CLI; runsc is gVisor).
need=()
{ exe dockerd >/dev/null || [ -x /usr/sbin/dockerd ]; } && exe docker >/dev/null || need+=(docker.io)
exe runsc >/dev/null || [ -x /usr/bin/runsc ] || need+=(runsc)
if [ ${#need[@]} -gt 0 ]; then
  exe apt-get >/dev/null || die "${need[*]} missing and no apt-get: this script needs a Debian machine"
  echo "docker-up: installing ${need[*]} from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt_log=$(mktemp /tmp/docker-up-apt.XXXXXX)
  if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } >"$apt_log" 2>&1; then
    tail -n 20 "$apt_log" >&2 || true
    die "apt-get install ${need[*]} failed (full output in $apt_log)"
  fi
  rm -f "$apt_log"
fi
dockerd_bin=$(exe dockerd || echo /usr/sbin/dockerd)
runsc_bin=$(exe runsc || echo /usr/bin/runsc)
[ -x "$dockerd_bin" ] || die "dockerd not found after installing docker.io"
[ -x "$runsc_bin" ] || die "runsc not found after installing runsc"

# 3. Register runsc. A new daemon.json also disables the default bridge and
#    the daemon's iptables/forwarding, so containers have no network at all.
#    An existing file is kept; runsc is merged into its "runtimes" if absent.
mkdir -p /etc/docker
config_changed=0
if [ ! -s "$daemon_json" ]; then
  cat >"$daemon_json" <<JSON
{
  "bridge": "none",
  "iptables": false,
  "ip-forward": false,
  "ip-masq": false,
  "runtimes": {
    "runsc": {"path": "$runsc_bin", "runtimeArgs": ["--network=none"]},
    "runsc-ptrace": {"path": "$runsc_bin", "runtimeArgs": ["--network=none", "--platform=ptrace"]}
  }
}
JSON
  echo "docker-up: wrote $daemon_json (no bridge network; runtimes runsc, runsc-ptrace)"
  config_changed=1
elif ! grep -q '"runsc"' "$daemon_json"; then
  exe python3 >/dev/null || die "$daemon_json exists without runsc and python3 is missing to add it: add the runtime by hand"
  python3 - "$daemon_json" "$runsc_bin" 2>/dev/null <<'PY' || die "$daemon_json is not valid JSON: fix it or remove it"
import json, sys
path, runsc = sys.argv[1], sys.argv[2]
with open(path) as f:
    config = json.load(f)
runtimes = config.setdefault("runtimes", {})
runtimes.setdefault("runsc", {"path": runsc, "runtimeArgs": ["--network=none"]})
runtimes.setdefault(
    "runsc-ptrace", {"path": runsc, "runtimeArgs": ["--network=none", "--platform=ptrace"]}
)
with open(path, "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")
PY
  echo "docker-up: added runtimes runsc, runsc-ptrace to the existing $daemon_json"
  config_changed=1
fi

# 4. Start dockerd: through systemd when it runs this machine (installing
#    docker.io may already have started the service, before runsc was
#    registered), else in the background, without systemd.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  if [ "$config_changed" = 1 ]; then
    systemctl restart docker >/dev/null 2>&1 || die "systemctl restart docker failed; see: journalctl -u docker"
  else
    systemctl start docker >/dev/null 2>&1 || die "systemctl start docker failed; see: journalctl -u docker"
  fi
  log="journalctl -u docker"
elif pgrep -x dockerd >/dev/null 2>&1; then
  echo "docker-up: a dockerd process already runs; waiting for it to answer"
  log="(dockerd started by someone else; log unknown)"
else
  # A previous dockerd of this machine may have left its pid file behind.
  rm -f /var/run/docker.pid
  # Its own session: a job control or timeout that ends the caller's process
  # group (a CI step, a terminal) must not take the daemon with it.
  setsid nohup "$dockerd_bin" >"$log" 2>&1 </dev/null &
  dockerd_pid=$!
fi

# 5. Wait until it answers.
for _ in $(seq "$timeout_s"); do
  if reachable; then
    echo "docker-up: dockerd started (server $(docker version --format '{{.Server.Version}}'); runtimes: $(runtimes))"
    exit 0
  fi
  if [ -n "${dockerd_pid:-}" ] && ! kill -0 "$dockerd_pid" 2>/dev/null; then
    tail -n 20 "$log" >&2 || true
    die "dockerd exited at start; log: $log"
  fi
  sleep 1
done
if [ -f "$log" ]; then
  tail -n 20 "$log" >&2 || true
fi
die "dockerd did not answer within ${timeout_s}s; log: $log"
