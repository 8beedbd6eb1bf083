#!/usr/bin/env bash
# Installs what the demo and the tests need on a Debian bookworm machine:
# HAProxy 2.6 (bookworm) and 3.0 and 3.2 (chroots, scripts/haproxy-chroots.sh),
# Consul 1.8.7 (bullseye, pinned so nothing else is taken from that suite),
# and the Debian packages in `want` below (promtool/prometheus, Alertmanager,
# Ruby for the cookbook tests, aptly and gnupg for the apt mirror test, podman
# and golang-go for the Kubernetes sidecar suite, stress-ng to load the
# machine beside the suite, ...), then cargo-deb, cargo-nextest (which runs
# the Rust tests) and kubernetes-validate (PyPI, in a venv). Idempotent; run
# as root.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: run as root (apt-get is needed)" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive

if [ ! -f /etc/apt/sources.list.d/bullseye-consul.sources ]; then
  cat >/etc/apt/sources.list.d/bullseye-consul.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bullseye
Components: main
SRC
  cat >/etc/apt/preferences.d/bullseye-consul.pref <<'PREF'
Package: *
Pin: release n=bullseye
Pin-Priority: 100
PREF
fi

# `--demo`: only what scripts/demo.sh needs (HAProxy, Consul, socat, curl,
# python3, column); without it, everything the tests need as well.
demo=false
[ "${1:-}" = "--demo" ] && demo=true

want=(
  haproxy consul socat curl bsdextrautils python3
)
$demo || want+=(
  prometheus prometheus-alertmanager
  ruby ruby-erubis ruby-minitest
  shellcheck lintian jq
  systemd-container debootstrap
  aptly gnupg
  podman crun netavark aardvark-dns slirp4netns uidmap conmon catatonit runc
  golang-go python3-venv python3-yaml
  nftables stress-ng
)
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep 'install ok installed' >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  # Keep the packaged daemons (haproxy, prometheus) from being started while
  # they are installed: the tests start their own on loopback ports. The
  # policy applies only to this install and is removed after it.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if $demo; then
  haproxy -v | sed -n 1p
  consul version | sed -n 1p
  exit 0
fi

# cargo-deb builds the .deb from debian/ and [package.metadata.deb].
if ! cargo deb --version >/dev/null 2>&1; then
  cargo install cargo-deb --locked
fi
# cargo-nextest runs the Rust tests, each in its own process, several at
# once (scripts/test.sh, .config/nextest.toml).
if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install cargo-nextest --locked
fi

# HAProxy 3.0 (trixie) and 3.2 (sid) in chroots, for the tests that also run
# against them; cached, so a second run is instant.
"$(dirname "$0")/haproxy-chroots.sh"

haproxy -v | sed -n 1p
consul version | sed -n 1p
promtool --version 2>&1 | sed -n 1p

# The Kubernetes sidecar suite (deploy/kubernetes/test.sh): podman (in `want`)
# runs the shipped manifest as a pod, golang-go's pprof reads the profiles.
# podman 4.3 on a hybrid cgroup layout: crun refuses it, runc works; the
# default ulimits exceed what may be set in a container here.
if [ ! -f /etc/containers/containers.conf ] || ! grep -q '^runtime = "runc"' /etc/containers/containers.conf; then
  mkdir -p /etc/containers
  cat >/etc/containers/containers.conf <<'CONF'
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]

[engine]
runtime = "runc"
CONF
fi
kv_venv=/opt/kubernetes-validate
if [ ! -x "$kv_venv/bin/kubernetes-validate" ]; then
  python3 -m venv "$kv_venv"
  "$kv_venv/bin/pip" install -q kubernetes-validate==1.37.0
fi
