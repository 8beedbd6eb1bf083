#!/usr/bin/env bash
# Installs HAProxy 3.0 (Debian trixie) and 3.2 (Debian sid) for the tests, each
# in its own chroot, since neither runs on bookworm's libc:
#
#   /opt/gitlab-haproxy-agent-test/haproxy-3.0/root      the chroot
#   /opt/gitlab-haproxy-agent-test/haproxy-3.0/bin/haproxy   a wrapper
#
# The wrapper runs the chroot's /usr/sbin/haproxy with the caller's PID (so
# USR2 reloads and TERM reach HAProxy itself) in a private mount namespace
# where /tmp, /proc, /dev and /sys are bind-mounted into the chroot; nothing
# stays mounted on the host. Only /tmp is shared: configs, pid files and
# sockets must live under /tmp. The wrapper runs from the caller's directory
# when that is under /tmp, from / otherwise.
#
# Cached: a chroot whose wrapper answers `haproxy -v` with the expected major
# version is kept, so a second run takes well under a second; a first run
# takes about 30 s per version. Set GITLAB_HAPROXY_AGENT_TEST_OPT to build
# elsewhere. Run as root (debootstrap, chroot).
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
  echo "haproxy-chroots: run as root (debootstrap and chroot need it)" >&2
  exit 1
fi

base=${GITLAB_HAPROXY_AGENT_TEST_OPT:-/opt/gitlab-haproxy-agent-test}
mirror=http://deb.debian.org/debian

# wrapper SUITE: the bin/haproxy script; it finds the chroot next to itself.
wrapper() {
  echo '#!/bin/sh'
  echo "# HAProxy from Debian $1 in the chroot ../root (written by scripts/haproxy-chroots.sh)."
  cat <<'EOF'
# Keeps the caller's PID (every step execs); only /tmp is shared with the host.
if [ "${GITLAB_HAPROXY_AGENT_CHROOT_NS:-}" != 1 ]; then
  export GITLAB_HAPROXY_AGENT_CHROOT_NS=1
  exec unshare --mount --propagation private "$(readlink -f "$0")" "$@"
fi
unset GITLAB_HAPROXY_AGENT_CHROOT_NS
self=$(readlink -f "$0") || exit 70
root=$(cd "$(dirname "$self")/../root" && pwd) || exit 70
case "$PWD" in
  /tmp | /tmp/*) dir=$PWD ;;
  *) dir=/ ;;
esac
for d in /tmp /proc /dev /sys; do
  mount --rbind "$d" "$root$d" || exit 70
done
exec chroot "$root" /bin/sh -c 'cd "$1" && shift && exec /usr/sbin/haproxy "$@"' sh "$dir" "$@"
EOF
}

# build VERSION SUITE: one chroot with HAProxy VERSION.x from SUITE.
build() {
  local version=$1 suite=$2
  local dir=$base/haproxy-$version
  if [ -x "$dir/root/usr/sbin/haproxy" ]; then
    # Built before: rewrite the wrapper (cheap) and keep the chroot.
    wrapper "$suite" >"$dir/bin/haproxy.new"
    chmod 755 "$dir/bin/haproxy.new"
    mv "$dir/bin/haproxy.new" "$dir/bin/haproxy"
    # grep reads all of it: `grep -q` would exit at the first line and,
    # under pipefail, a SIGPIPE of haproxy -v would read as a wrong version.
    if "$dir/bin/haproxy" -v 2>/dev/null | grep "^HAProxy version $version\." >/dev/null; then
      "$dir/bin/haproxy" -v | sed -n 1p
      return 0
    fi
  fi
  local tmp=$dir.new
  rm -rf "$tmp"
  mkdir -p "$tmp/bin"
  debootstrap --variant=minbase "$suite" "$tmp/root" "$mirror" >"$tmp/debootstrap.log" 2>&1 || {
    tail -n 20 "$tmp/debootstrap.log" >&2
    return 1
  }
  # No daemon is started by the package's maintainer scripts.
  printf '#!/bin/sh\nexit 101\n' >"$tmp/root/usr/sbin/policy-rc.d"
  chmod +x "$tmp/root/usr/sbin/policy-rc.d"
  # sid's InRelease may be past its Valid-Until on a mirror snapshot.
  if ! {
    chroot "$tmp/root" apt-get -q -o Acquire::Check-Valid-Until=false update &&
      chroot "$tmp/root" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends haproxy &&
      chroot "$tmp/root" apt-get clean
  } >"$tmp/apt.log" 2>&1; then
    tail -n 20 "$tmp/apt.log" >&2
    return 1
  fi
  wrapper "$suite" >"$tmp/bin/haproxy"
  chmod 755 "$tmp/bin/haproxy"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  if ! "$dir/bin/haproxy" -v 2>/dev/null | grep "^HAProxy version $version\." >/dev/null; then
    echo "haproxy-chroots: $dir/bin/haproxy is not HAProxy $version:" >&2
    "$dir/bin/haproxy" -v >&2 || true
    return 1
  fi
  "$dir/bin/haproxy" -v | sed -n 1p
}

build 3.0 trixie
build 3.2 sid
