#!/usr/bin/env bash
# Builds the signed apt repository that load balancers install the agent from:
# every .deb in APT_REPO_DEBS (default target/debian/) joins the versions
# OUT_DIR already publishes, and OUT_DIR is replaced by the new tree:
#
#   OUT_DIR/dists/SUITE/{InRelease,Release,Release.gpg,main/...}
#   OUT_DIR/pool/main/g/gitlab-haproxy-agent/*.deb
#   OUT_DIR/release.asc          the public key, for apt's signed-by
#
# Every version stays in the index, so a node pinned to an older version
# (the cookbook's package.version) can still install it. A .deb whose name,
# version and architecture are already published with other contents is
# refused (exit 1, nothing changed): apt would fail its checksum on some
# nodes and not others. Built with aptly in a scratch folder next to OUT_DIR;
# OUT_DIR is swapped in only when the whole tree is signed.
#
# Usage: scripts/apt-repo.sh OUT_DIR
#   APT_REPO_KEY=   the signing key: fingerprint or user ID of a secret key in
#                   gpg's keyring ($GNUPGHOME); required
#   APT_REPO_DEBS=  folder of .debs to add (default target/debian)
#   APT_REPO_SUITE= the distribution (default bookworm)
# Needs: aptly, gpg, dpkg-deb (scripts/install-deps.sh).
set -euo pipefail

usage() {
  echo "usage: APT_REPO_KEY=FINGERPRINT scripts/apt-repo.sh OUT_DIR" >&2
  exit 64
}
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
  exit 0
fi
if [ $# -ne 1 ] || [ -z "$1" ]; then usage; fi
out=$1
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
debs=${APT_REPO_DEBS:-$repo/target/debian}
suite=${APT_REPO_SUITE:-bookworm}
key=${APT_REPO_KEY:-}

die() {
  echo "apt-repo: $*" >&2
  exit 1
}
[ -n "$key" ] || die "APT_REPO_KEY is not set (fingerprint of the signing key)"
for tool in aptly gpg dpkg-deb; do
  command -v "$tool" >/dev/null || die "'$tool' is missing (scripts/install-deps.sh installs it)"
done
gpg --batch --list-secret-keys "$key" >/dev/null 2>&1 ||
  die "no secret key '$key' in gpg's keyring (${GNUPGHOME:-~/.gnupg})"
[[ $suite =~ ^[a-z0-9][a-z0-9.+-]*$ ]] || die "APT_REPO_SUITE '$suite' is not a suite name"

# OUT_DIR is replaced as a whole: refuse a folder that is not a repository
# this script built (an empty or missing one is fine).
if [ -d "$out" ] && [ -n "$(ls -A "$out")" ] && { [ ! -d "$out/dists" ] || [ ! -f "$out/release.asc" ]; }; then
  die "$out is not empty and has no dists/ and release.asc: not a repository built by apt-repo.sh"
fi
[ ! -e "$out" ] || [ -d "$out" ] || die "$out is not a folder"

new=()
[ -d "$debs" ] && mapfile -t new < <(find "$debs" -maxdepth 1 -name '*.deb' -type f | sort)
[ ${#new[@]} -gt 0 ] || die "no .deb in $debs"
old=()
[ -d "$out/pool" ] && mapfile -t old < <(find "$out/pool" -name '*.deb' -type f | sort)

out_parent=$(dirname "$out")
mkdir -p "$out_parent"
scratch=$(mktemp -d "$out_parent/.apt-repo.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
cat >"$scratch/aptly.conf" <<EOF
{"rootDir": "$scratch/aptly", "gpgProvider": "gpg", "architectures": [],
 "downloadSourcePackages": false, "skipContentsPublishing": true}
EOF
apt_ly() { aptly -config="$scratch/aptly.conf" "$@" >>"$scratch/aptly.log" 2>&1; }
fail_with_log() {
  grep -E '^\[!\]|ERROR' "$scratch/aptly.log" >&2 || tail -n 20 "$scratch/aptly.log" >&2
  die "$1; $out is unchanged"
}

apt_ly repo create -distribution="$suite" -component=main agent || fail_with_log "aptly repo create"
# What is published first, then the new files: a conflict names the new one.
for deb in ${old[@]+"${old[@]}"} "${new[@]}"; do
  apt_ly repo add agent "$deb" || fail_with_log "cannot add $deb"
done
# by-hash: a node reading the index while the mirror is being synced gets a
# consistent set of files, never a checksum mismatch.
apt_ly publish repo -batch -gpg-key="$key" -acquire-by-hash \
  -origin=gitlab-haproxy-agent -label=gitlab-haproxy-agent agent ||
  fail_with_log "aptly publish"
gpg --batch --armor --export "$key" >"$scratch/aptly/public/release.asc"
[ -s "$scratch/aptly/public/release.asc" ] || die "cannot export the public key '$key'"

if [ -e "$out" ]; then
  mv "$out" "$scratch/previous"
fi
mv "$scratch/aptly/public" "$out"

fingerprint=$(gpg --batch --with-colons --list-keys "$key" | awk -F: '$1 == "fpr" { print $10; exit }')
echo "apt-repo: $out: suite $suite, signed by $fingerprint"
aptly -config="$scratch/aptly.conf" repo show -with-packages agent 2>/dev/null |
  sed -n '/^Packages:/,$p' | sed -n '2,$s/^ */  /p'
