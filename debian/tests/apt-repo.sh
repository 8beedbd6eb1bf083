#!/usr/bin/env bash
# scripts/apt-repo.sh and its signing key, with real gpg and aptly (no
# container, about 20 s):
#   - a user ID (shared by an expired key and its successor) is refused:
#     the key is named by fingerprint;
#   - with both keys in the keyring, naming the new one signs with it alone:
#     release.asc holds exactly that key, "signed by" names it, and gpgv
#     verifies InRelease with release.asc alone;
#   - the expired key alone is refused with a message that says it expired;
#   - a key expiring in 2 days publishes with a warning naming the date;
#   - APT_REPO_OVERLAP_KEY (a rotation) adds that public key to release.asc,
#     and only it.
#
# Usage: debian/tests/apt-repo.sh
#   DEB=path   publish this .deb (default: a minimal one built here)
# Needs: aptly, gpg, gpgv, dpkg-deb.
# Functions are mostly called through check (SC2317).
# shellcheck disable=SC2317
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
finish() {
	tally
	[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
	exit $?
}
not() { ! "$@"; }

work=$(mktemp -d /tmp/gitlab-haproxy-agent-apt-repo.XXXXXX)
export GNUPGHOME=$work/gnupg
cleanup() {
	gpgconf --kill gpg-agent 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
install -d -m 0700 "$GNUPGHOME"

# A .deb to publish: the one given, or a minimal package.
mkdir -p "$work/debs"
if [ -n "${DEB:-}" ]; then
	cp "$DEB" "$work/debs/"
else
	mkdir -p "$work/pkg/DEBIAN"
	arch=$(dpkg --print-architecture)
	printf 'Package: gitlab-haproxy-agent\nVersion: 0.0.1\nArchitecture: %s\nMaintainer: test <test@example.invalid>\nDescription: test\n' \
		"$arch" >"$work/pkg/DEBIAN/control"
	dpkg-deb -b --root-owner-group "$work/pkg" "$work/debs/gitlab-haproxy-agent_0.0.1_$arch.deb" >/dev/null
fi

uid="gitlab-haproxy-agent release <apt@example.invalid>"
# new_key UID EXPIRY: a new signing key; prints its fingerprint.
new_key() {
	gpg --batch --yes --passphrase '' --quick-gen-key "$1" ed25519 sign "$2" 2>/dev/null &&
		gpg --batch --with-colons --list-secret-keys "$1" | awk -F: '$1 == "fpr" { f = $10 } END { print f }'
}
old=$(new_key "$uid" seconds=2)
sleep 3 # the old key has expired
new=$(new_key "$uid" 2y)
soon=$(new_key "soon <soon@example.invalid>" 2d)
if [ -z "$old" ] || [ -z "$new" ] || [ -z "$soon" ] || [ "$old" = "$new" ]; then
	fail "three test keys made"
	finish
fi

# publish NAME VAR=VALUE...: scripts/apt-repo.sh into $work/NAME; output in
# $work/NAME.log, exit status in $rc.
publish() {
	local name=$1
	shift
	env APT_REPO_DEBS="$work/debs" "$@" "$repo/scripts/apt-repo.sh" "$work/$name" >"$work/$name.log" 2>&1
	rc=$?
}
log_has() { grep -F -- "$2" "$work/$1.log" >/dev/null; }
# keys_in FILE: fingerprints of the primary keys in an armored key file.
keys_in() {
	gpg --batch --with-colons --show-keys "$1" 2>/dev/null |
		awk -F: '$1 == "pub" { p = 1; next } $1 == "fpr" && p { print $10; p = 0 }' | sort | tr '\n' ' '
}
# signer DIR: the key that signed DIR's InRelease, verified with its
# release.asc alone.
signer() {
	gpg --batch --dearmor <"$1/release.asc" >"$work/check.gpg" &&
		gpgv --status-fd 1 --keyring "$work/check.gpg" "$1/dists/bookworm/InRelease" 2>/dev/null |
		awk '$2 == "VALIDSIG" { print $3 }'
	rm -f "$work/check.gpg"
}

publish by-uid APT_REPO_KEY="$uid"
check "a user ID is refused (exit $rc): 'not a key fingerprint'" \
	test "$rc" -ne 0 -a -n "$(grep 'not a key fingerprint' "$work/by-uid.log")"
check "a user ID is refused: nothing published" test ! -e "$work/by-uid"

publish new APT_REPO_KEY="$new"
check "both keys in the keyring, the new one named: published (exit $rc)" test "$rc" -eq 0
check "release.asc holds the new key only" test "$(keys_in "$work/new/release.asc")" = "$new "
check "InRelease verifies with release.asc alone, signed by the new key" \
	test "$(signer "$work/new")" = "$new"
check "the script says it was signed by the new key" log_has new "signed by $new"
check "no expiry warning for a key valid 2 years" not log_has new WARNING

publish expired APT_REPO_KEY="$old"
check "the expired key is refused (exit $rc)" test "$rc" -ne 0
check "the message says it expired" log_has expired "signing key $old expired on"
check "the expired key: nothing published" test ! -e "$work/expired"

publish soon APT_REPO_KEY="$soon"
check "a key expiring in 2 days publishes (exit $rc)" test "$rc" -eq 0
check "with a warning naming its expiry date" \
	log_has soon "WARNING: signing key $soon expires on $(date -u -d '+2 days' +%Y-%m-%d), in 2 days"

publish overlap APT_REPO_KEY="$new" APT_REPO_OVERLAP_KEY="$soon"
check "a rotation's overlap key: published (exit $rc)" test "$rc" -eq 0
check "release.asc holds the signing key and the overlap key, and no other" \
	test "$(keys_in "$work/overlap/release.asc")" = "$(printf '%s\n' "$new" "$soon" | sort | tr '\n' ' ')"
check "signed by the signing key only" test "$(signer "$work/overlap")" = "$new"

finish
