#!/usr/bin/env bash
# Build the root filesystem of the retool_exec sandbox image as a tarball,
# from Debian's packages alone: no container registry is needed (air-gapped
# clusters only need a Debian mirror, or a local copy of one).
#
# Usage: build-rootfs.sh OUT.tar AGENT.pyz [PACKAGES.txt [REQUIREMENTS.txt]]
#
#   OUT.tar           the tarball to write, for `docker import`
#   AGENT.pyz         the in-container agent (a zipapp), installed as /opt/retool_exec/agent.pyz
#   PACKAGES.txt      packages to add to the Essential set, one a line, '#' comments
#                     (default: preset-math.txt beside this script)
#   REQUIREMENTS.txt  PyPI requirements, one a line, installed with the image's own
#                     pip (PACKAGES.txt must then list python3-pip); what pip
#                     installed is written to OUT.tar.pip-freeze
#
# Env:
#   RETOOL_EXEC_MIRRORS  apt source lines, one a line ("deb URI SUITE main"),
#                        to use instead of the Debian entries of the host's
#                        apt sources (e.g. an internal mirror)
#
# Needs: mmdebstrap, dpkg-deb and apt on the host; root, or a user with
# subordinate ids for mmdebstrap's unshare mode.
#
# What the image holds: `mmdebstrap --variant=essential` (the Essential:yes
# set: dpkg, coreutils, bash, ... but no apt) plus the packages listed, their
# hard dependencies only (no Recommends). /usr is merged the way Debian's own
# images do it (usr-is-merged, not the usrmerge package, which needs perl).
# Then the customize hook below: the agent, no setuid/setgid bit anywhere, no
# docs/man pages/locales/apt caches/test suites.
set -euo pipefail

SUITE=bookworm

# Debian's python3-scipy (1.10.1-2) hard-depends on python3-pythran, an
# ahead-of-time compiler that scipy does not import at run time; it drags in
# g++, boost and the Python headers (~700 MB, and a C compiler inside a
# sandbox). An empty package of the same name takes its place.
STUB_PACKAGES=(python3-pythran)

die() {
  echo "build-rootfs: $*" >&2
  exit 1
}

# ---------------------------------------------------------------------------
# Customize hook, run by mmdebstrap (as `build-rootfs.sh --customize-hook ROOT
# AGENT [REQUIREMENTS FREEZE]`) once all packages are installed. ROOT is the
# root filesystem.
customize() {
  local root=$1 agent=$2 requirements=${3:-} freeze=${4:-}

  # PyPI extras: installed by the image's own pip, so the image's Python and the
  # Debian packages already there (numpy, ...) are what pip resolves against;
  # then pip itself goes (the sandbox has no network to use it).
  if [ -n "$requirements" ]; then
    install -m 0644 "$requirements" "$root/tmp/requirements.txt"
    # The host's trust store goes in for the download: a host behind a TLS-
    # inspecting proxy trusts its CA, the fresh root filesystem does not. Host
    # paths in pip's environment (find-links, constraints, config) mean nothing
    # in the chroot; index URLs, proxies and timeouts are kept.
    local ca= candidate
    for candidate in "${PIP_CERT:-}" "${REQUESTS_CA_BUNDLE:-}" "${SSL_CERT_FILE:-}" \
      /etc/ssl/certs/ca-certificates.crt; do
      if [ -n "$candidate" ] && [ -r "$candidate" ]; then ca=$candidate && break; fi
    done
    local pipenv=(env -u PIP_FIND_LINKS -u PIP_CONSTRAINT -u PIP_CONFIG_FILE -u PIP_CERT
      PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CONFIG_FILE=/dev/null)
    if [ -n "$ca" ]; then
      install -m 0644 "$ca" "$root/tmp/host-ca.crt"
      pipenv+=(PIP_CERT=/tmp/host-ca.crt SSL_CERT_FILE=/tmp/host-ca.crt REQUESTS_CA_BUNDLE=/tmp/host-ca.crt)
      echo "build-rootfs: pip trusts the host's CA bundle $ca" >&2
    fi
    # Debian's pip, run as root, installs into /usr/local/lib/python3.X/dist-packages.
    chroot "$root" "${pipenv[@]}" python3 -m pip install \
      --no-cache-dir --break-system-packages --root-user-action=ignore \
      --no-warn-script-location -r /tmp/requirements.txt
    local site
    site=$(chroot "$root" python3 -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    chroot "$root" python3 -m pip list --format=freeze --path "$site" >"$freeze"
    chroot "$root" dpkg --purge python3-pip
    find "$root/usr/local" -name __pycache__ -type d -prune -exec rm -rf {} +
  fi

  # The agent: the only project code inside the image.
  install -d -m 0755 -o 0 -g 0 "$root/opt" "$root/opt/retool_exec"
  install -m 0644 -o 0 -g 0 "$agent" "$root/opt/retool_exec/agent.pyz"

  # No setuid/setgid program (su, newgrp, unix_chkpwd in the Essential set),
  # and no setgid directory either (/var/mail, /var/local), so that an audit
  # with `find / -xdev -perm /6000` comes back empty.
  find "$root" -xdev -perm /6000 -type f -exec chmod ug-s {} +
  find "$root" -xdev -perm /6000 -type d -exec chmod ug-s {} +

  # Nothing that only apt, a human reader or another language needs.
  # (dpkg's path-exclude options already kept most of it out; this is the rest.)
  rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/*
  rm -f "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old
  rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* \
    "$root"/usr/share/lintian "$root"/usr/share/linda "$root"/usr/share/bug
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias \
    -exec rm -rf {} + 2>/dev/null || true
  if [ -d "$root/usr/share/doc" ]; then
    # Keep the copyright files (licences); drop the rest.
    find "$root/usr/share/doc" -type f ! -name copyright -delete
    find "$root/usr/share/doc" -type l -delete
    find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  fi
  find "$root/var/log" -type f -delete

  # The packages' own test suites (~100 MB of numpy/scipy/sympy/mpmath):
  # nothing imports them at run time.
  find "$root/usr/lib/python3/dist-packages" -mindepth 2 -depth -type d \
    -name tests -exec rm -rf {} +

  # Names: the containers have no network at all (hardening.py), so Docker
  # mounts no /etc/hosts or /etc/resolv.conf (the host's name server) and
  # /etc/hosts stays the empty file of its init layer. localhost (and
  # *.localhost) resolve through nss-myhostname; nothing asks a DNS server.
  [ -n "$(find "$root/usr/lib" -name 'libnss_myhostname.so.2' -print -quit)" ] \
    || die "libnss-myhostname is not installed (it is in preset-math.txt)"
  sed -i -E 's/^hosts:.*/hosts:          files myhostname/' "$root/etc/nsswitch.conf"
  grep -qx 'hosts: *files myhostname' "$root/etc/nsswitch.conf" \
    || die "no hosts line in /etc/nsswitch.conf to set"
  : >"$root/etc/resolv.conf"

  # /tmp is a tmpfs at run time; it must exist as a mount point.
  rm -rf "$root/tmp"
  install -d -m 1777 -o 0 -g 0 "$root/tmp"

  # The sandbox runs as nobody:nogroup (65534:65534).
  grep -q '^nobody:[^:]*:65534:65534:' "$root/etc/passwd" \
    || die "no nobody (uid 65534) in /etc/passwd"
  grep -q '^nogroup:[^:]*:65534:' "$root/etc/group" \
    || die "no nogroup (gid 65534) in /etc/group"

  # Refuse to produce an image that breaks the promises above.
  local left
  left=$(find "$root" -xdev -perm /6000)
  [ -z "$left" ] || die "setuid/setgid files left: $left"
  local stub list
  for stub in "${STUB_PACKAGES[@]}"; do
    # The stub must be what got installed: an empty package, no files.
    list=$root/var/lib/dpkg/info/$stub.list
    if [ -f "$list" ] && grep -qv '^/\.$' "$list"; then
      die "$stub is the real package, not the empty stub"
    fi
  done
}

if [ "${1:-}" = --customize-hook ]; then
  [ $# -eq 3 ] || [ $# -eq 5 ] || die "usage: $0 --customize-hook ROOT AGENT [REQUIREMENTS FREEZE]"
  shift
  customize "$@"
  exit 0
fi

# ---------------------------------------------------------------------------
# Build.
if [ $# -lt 2 ] || [ $# -gt 4 ]; then
  die "usage: $0 OUT.tar AGENT.pyz [PACKAGES.txt [REQUIREMENTS.txt]]"
fi
self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
out=$1
if [ ! -f "$2" ] || [ ! -r "$2" ]; then
  die "agent file not readable: $2"
fi
agent=$(realpath "$2")
packages_file=${3:-$(dirname "$self")/preset-math.txt}
requirements=
if [ $# -eq 4 ]; then
  [ -r "$4" ] || die "requirements not readable: $4"
  requirements=$(realpath "$4")
  grep -qx 'python3-pip' <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$packages_file") \
    || die "PyPI requirements need python3-pip in $packages_file"
fi

[ -r "$packages_file" ] || die "package list not readable: $packages_file"
command -v mmdebstrap >/dev/null || die "mmdebstrap not found: apt-get install -y mmdebstrap"
command -v dpkg-deb >/dev/null || die "dpkg-deb not found: apt-get install -y dpkg"
command -v apt-get >/dev/null || die "apt-get not found: a Debian host is needed"

read -r -a packages <<<"$(sed -e 's/#.*//' "$packages_file" | tr -s '[:space:]' ' ')"
[ ${#packages[@]} -gt 0 ] || die "no package in $packages_file"

# Mirrors: the Debian entries of the host's apt sources (one-line or deb822
# format alike), so a host that uses an internal mirror builds from it too.
mirrors=()
if [ -n "${RETOOL_EXEC_MIRRORS:-}" ]; then
  while IFS= read -r line; do
    if [ -n "${line// /}" ]; then mirrors+=("$line"); fi
  done <<<"$RETOOL_EXEC_MIRRORS"
else
  while read -r uri suite; do
    mirrors+=("deb $uri $suite main")
  done < <(
    # shellcheck disable=SC2016 # apt's own $(FIELD) syntax, not the shell's
    apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT) $(ORIGIN)' \
      'Identifier: Packages' 2>/dev/null \
      | awk -v s="$SUITE" '
          ($2 == s || $2 == s "-updates" || $2 == s "-security") && $3 == "main" \
            && ($4 == "" || $4 == "Debian") { print $1, $2 }' \
      | sort -u
  )
fi
if [ ${#mirrors[@]} -eq 0 ]; then
  mirrors=("deb http://deb.debian.org/debian $SUITE main"
    "deb http://deb.debian.org/debian $SUITE-updates main"
    "deb http://deb.debian.org/debian-security $SUITE-security main")
fi

# Apt settings of the host that decide whether its mirror can be reached or
# trusted (a proxy; a snapshot mirror whose Release files are past Valid-Until).
aptopts=()
for key in Acquire::http::Proxy Acquire::https::Proxy Acquire::Check-Valid-Until Acquire::Check-Date; do
  value=
  eval "$(apt-config shell value "$key")"
  if [ -n "$value" ]; then aptopts+=("--aptopt=$key \"$value\";"); fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/retool-exec-rootfs.XXXXXX")
trap 'rm -rf "$work"' EXIT
chmod 0755 "$work"

stub_args=()
for stub in "${STUB_PACKAGES[@]}"; do
  mkdir -p "$work/$stub/DEBIAN"
  cat >"$work/$stub/DEBIAN/control" <<EOF
Package: $stub
Version: 0~retool.stub1
Architecture: all
Multi-Arch: foreign
Maintainer: retool_exec <noreply@invalid>
Priority: optional
Section: oldlibs
Description: empty stand-in for $stub (retool_exec sandbox image)
 Satisfies a hard dependency that nothing imports at run time, without
 installing a compiler toolchain into the sandbox.
EOF
  dpkg-deb --root-owner-group -Zgzip --build "$work/$stub" "$work/${stub}_stub_all.deb" >/dev/null
  chmod 0644 "$work/${stub}_stub_all.deb"
  stub_args+=("--include=$work/${stub}_stub_all.deb")
done

# shellcheck disable=SC2016 # "$1" is for the hook's shell: mmdebstrap passes the root there
hook=$(printf '%q --customize-hook "$1" %q' "$self" "$agent")
if [ -n "$requirements" ]; then
  hook+=$(printf ' %q %q' "$requirements" "$(realpath "$out").pip-freeze")
fi

set -x
mmdebstrap \
  --variant=essential \
  --format=tar \
  --include="$(IFS=,; echo "${packages[*]}")" \
  "${stub_args[@]}" \
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
  --hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount \
  --dpkgopt='force-unsafe-io' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-include=/usr/share/locale/locale.alias' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/lintian/*' \
  "${aptopts[@]}" \
  --customize-hook="bash $hook" \
  "$SUITE" "$out" "${mirrors[@]}"
