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
# The tree is signed with exactly one key, named by its full fingerprint (a
# user ID may match several keys, such as an expired key and its successor
# during a rotation). A key that is expired, revoked or cannot sign is
# refused; one that expires within 30 days is used with a warning. After
# signing, InRelease is verified against release.asc alone and the key that
# really signed it is printed.
#
# Usage: scripts/apt-repo.sh OUT_DIR
#   APT_REPO_KEY=   the signing key: the 40-hex fingerprint of a secret key
#                   in gpg's keyring ($GNUPGHOME); required
#   APT_REPO_OVERLAP_KEY=  during a key rotation only: the fingerprint of the
#                   other key (public part only), exported to release.asc
#                   beside the signing key so that nodes trust both while
#                   the mirror switches (runbook: "Rotating the apt signing
#                   key"); it does not sign
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
overlap=${APT_REPO_OVERLAP_KEY:-}
[ -n "$key" ] || die "APT_REPO_KEY is not set (fingerprint of the signing key)"
for tool in aptly gpg gpgv dpkg-deb; do
  command -v "$tool" >/dev/null || die "'$tool' is missing (scripts/install-deps.sh installs it)"
done
# fingerprint NAME VALUE: the value as 40 upper-case hex digits (spaces
# dropped), or exit naming the variable.
fingerprint() {
  local f
  f=$(tr -d ' ' <<<"$2" | tr '[:lower:]' '[:upper:]')
  [[ $f =~ ^[0-9A-F]{40}$ ]] ||
    die "$1 '$2' is not a key fingerprint (40 hex digits; a user ID or short ID may name several keys): gpg --list-secret-keys --with-colons"
  printf '%s' "$f"
}
key=$(fingerprint APT_REPO_KEY "$key") || exit 1
[ -z "$overlap" ] || overlap=$(fingerprint APT_REPO_OVERLAP_KEY "$overlap") || exit 1
[ "$overlap" != "$key" ] || die "APT_REPO_OVERLAP_KEY is the signing key itself"

# The signing key's record (sec: a primary key, ssb: a subkey) in gpg's
# colon listing: validity (field 2), expiry (field 7, seconds since the
# epoch, empty for never), capabilities (field 12); and its primary key's.
listing=$(gpg --batch --with-colons --fixed-list-mode --list-secret-keys "$key" 2>/dev/null) ||
  die "no secret key $key in gpg's keyring (${GNUPGHOME:-~/.gnupg})"
read -r primary_fpr validity expires caps primary_validity primary_expires < <(
  awk -F: -v want="$key" '
    $1 == "sec" { pv = $2; pe = $7; rec = "" }
    $1 == "sec" || $1 == "ssb" { v = $2; e = $7; c = $12; rec = $1 }
    $1 == "fpr" && rec == "sec" { primary = $10 }
    $1 == "fpr" && $10 == want && rec != "" {
      printf "%s %s %s %s %s %s\n", primary, (v == "" ? "-" : v), (e == "" ? "-" : e), (c == "" ? "-" : c), (pv == "" ? "-" : pv), (pe == "" ? "-" : pe)
      exit
    }
    $1 == "fpr" { rec = "" }' <<<"$listing")
[ -n "${primary_fpr:-}" ] || die "no secret key with fingerprint $key in gpg's keyring (${GNUPGHOME:-~/.gnupg})"
now=$(date +%s)
day() { date -u -d "@$1" +%Y-%m-%d; }
# The key expires when it or its primary key does, whichever is first.
until=
for e in "$expires" "$primary_expires"; do
  [ "$e" = - ] || { [ -n "$until" ] && [ "$until" -le "$e" ]; } || until=$e
done
case "$validity$primary_validity" in
  *r*) die "signing key $key is revoked: sign with its successor (runbook: \"Rotating the apt signing key\")" ;;
esac
if [ -n "$until" ] && [ "$until" -le "$now" ]; then
  die "signing key $key expired on $(day "$until"): nodes refuse what it signs; extend it (gpg --quick-set-expire) or sign with its successor (runbook: \"Rotating the apt signing key\")"
fi
case "$validity$primary_validity" in
  *e*) die "signing key $key has expired: extend it (gpg --quick-set-expire) or sign with its successor" ;;
esac
[[ $caps == *s* ]] || die "key $key cannot sign (capabilities '$caps')"
if [ -n "$until" ] && [ $((until - now)) -lt $((30 * 86400)) ]; then
  echo "apt-repo: WARNING: signing key $key expires on $(day "$until"), in $(((until - now + 86399) / 86400)) days: after that nodes refuse the mirror; extend it or rotate (runbook: \"Rotating the apt signing key\")" >&2
fi
if [ -n "$overlap" ]; then
  gpg --batch --list-keys "$overlap" >/dev/null 2>&1 ||
    die "APT_REPO_OVERLAP_KEY: no key $overlap in gpg's keyring (${GNUPGHOME:-~/.gnupg})"
fi
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
# KEY! makes gpg use exactly that key, not another of the same primary.
apt_ly publish repo -batch -gpg-key="$key!" -acquire-by-hash \
  -origin=gitlab-haproxy-agent -label=gitlab-haproxy-agent agent ||
  fail_with_log "aptly publish"
public=$scratch/aptly/public
# Only the signing key (its primary key's block) and, in a rotation, the
# overlap key: never every key that shares a user ID.
gpg --batch --armor --export "$primary_fpr" ${overlap:+"$overlap"} >"$public/release.asc"
keys=$(gpg --batch --with-colons --show-keys "$public/release.asc" 2>/dev/null | awk -F: '$1 == "pub" { n++ } END { print n + 0 }')
[ "$keys" -eq $((1 + ${#overlap} / 40)) ] ||
  die "release.asc holds $keys keys, not the signing key${overlap:+ and the overlap key}; $out is unchanged"
# What apt will see: InRelease verified with release.asc alone, and the key
# that really signed it.
gpg --batch --dearmor <"$public/release.asc" >"$scratch/release.gpg"
signed_by=$(gpgv --status-fd 1 --keyring "$scratch/release.gpg" "$public/dists/$suite/InRelease" 2>/dev/null |
  awk '$2 == "VALIDSIG" { print $3; exit }')
[ "$signed_by" = "$key" ] ||
  die "InRelease is signed by '${signed_by:-no valid key}', not $key; $out is unchanged"

if [ -e "$out" ]; then
  mv "$out" "$scratch/previous"
fi
mv "$scratch/aptly/public" "$out"

echo "apt-repo: $out: suite $suite, signed by $signed_by (expires ${until:+$(day "$until")}${until:-never})${overlap:+; release.asc also holds $overlap}"
aptly -config="$scratch/aptly.conf" repo show -with-packages agent 2>/dev/null |
  sed -n '/^Packages:/,$p' | sed -n '2,$s/^ */  /p'
