#!/usr/bin/env bash
# Static checks of the Debian package: builds the .deb with `cargo deb`, then
# checks its contents, runs lintian, `systemd-analyze verify` and
# `systemd-analyze security --offline=true` (exposure must stay under 5.0) on
# the packaged unit, checks that /etc/default lists every setting of
# docs/options.md with its default, and shellchecks the scripts.
#
# Usage: debian/tests/static.sh [--clean-clone]
#   --clean-clone  build from a fresh `git clone` of HEAD instead of the work
#                  tree (proves the committed files are enough).
#   DEB=path       check this .deb instead of building one.
# Needs: cargo-deb, lintian, systemd (systemd-analyze), shellcheck, dpkg-dev.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
pkg=gitlab-haproxy-agent
unit=$pkg.service
max_exposure=5.0

# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"

work=$(mktemp -d /tmp/$pkg-static.XXXXXX)
cleanup() { rm -rf "$work"; }
not() { ! "$@"; }
trap cleanup EXIT

clean_clone=0
for arg in "$@"; do
	case $arg in
	--clean-clone) clean_clone=1 ;;
	*)
		echo "usage: $0 [--clean-clone]" >&2
		exit 64
		;;
	esac
done

# --- build ------------------------------------------------------------------
deb=${DEB:-}
if [ -z "$deb" ]; then
	src=$repo
	if [ "$clean_clone" = 1 ]; then
		src=$work/clone
		git clone --quiet "$repo" "$src" || {
			fail "git clone of $repo"
			tally
			exit 1
		}
		# A target folder of its own, kept between runs for the compiled
		# dependencies, so the work tree's target/release is left alone.
		export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target/clean-clone}"
	fi
	start=$SECONDS
	if (cd "$src" && cargo deb --output "$work/" >"$work/cargo-deb.log" 2>&1); then
		deb=$(find "$work" -maxdepth 1 -name "${pkg}_*.deb" | sed -n 1p)
		pass "cargo deb built $(basename "$deb") in $((SECONDS - start)) s"
	else
		tail -n 30 "$work/cargo-deb.log"
		fail "cargo deb"
		tally
		exit 1
	fi
fi
if [ ! -f "$deb" ]; then
	fail "no .deb at '$deb'"
	tally
	exit 1
fi

# --- contents ---------------------------------------------------------------
# The unpacked package over a copy of the host's unit folder, so that
# `systemd-analyze verify --root` finds the standard targets and the binary.
root=$work/root
mkdir -p "$root/usr/lib/systemd" "$work/control"
cp -a /usr/lib/systemd/system "$root/usr/lib/systemd/"
for d in bin sbin lib; do ln -s "usr/$d" "$root/$d"; done
dpkg-deb -x "$deb" "$root"
dpkg-deb -e "$deb" "$work/control"
unit_file=$root/usr/lib/systemd/system/$unit

has_file() { [ -f "$root/$1" ]; }
check "binary /usr/bin/$pkg is executable" test -x "$root/usr/bin/$pkg"
check "unit /usr/lib/systemd/system/$unit is packaged" has_file "usr/lib/systemd/system/$unit"
check "settings /etc/default/$pkg are packaged" has_file "etc/default/$pkg"
check "copyright is packaged" has_file "usr/share/doc/$pkg/copyright"
check "changelog is packaged" has_file "usr/share/doc/$pkg/changelog.Debian.gz"
check "/etc/default/$pkg is a conffile" grep -qx "/etc/default/$pkg" "$work/control/conffiles"
check "Depends names adduser (postinst creates the user with it)" \
	grep -Eq '^Depends:.*\badduser\b' "$work/control/control"
check "postinst creates the system user" grep -q 'adduser --system' "$work/control/postinst"
check "postinst starts the unit on a first install" grep -q "deb-systemd-invoke start .*$unit" "$work/control/postinst"
check "postinst restarts it on upgrade only if it runs (try-restart)" \
	grep -q "deb-systemd-invoke try-restart .*$unit" "$work/control/postinst"
check "postinst never restarts unconditionally" not grep -Eq "deb-systemd-invoke (restart|\\\$_dh_action)" "$work/control/postinst"
check "postrm cleans up on purge" grep -q 'purge' "$work/control/postrm"

directive() { # directive Key value: the unit has exactly the line Key=value
	grep -qx "$1=$2" "$unit_file"
}
check "unit: Type=notify" directive Type notify
check "unit: runs the binary directly" directive ExecStart "/usr/bin/$pkg"
check "unit: settings from EnvironmentFile" directive EnvironmentFile "-/etc/default/$pkg"
check "unit: Restart=on-failure" directive Restart on-failure
check "unit: no start limit (a failing start is retried until it succeeds)" \
	directive StartLimitIntervalSec 0
check "unit: WatchdogSec set" grep -Eq '^WatchdogSec=[0-9]+s?$' "$unit_file"
check "unit: token as a credential" directive LoadCredential "consul-token:/etc/$pkg/consul-token"
check "unit: unprivileged user" directive User "$pkg"
check "unit: no capabilities" directive CapabilityBoundingSet ""
check "unit: syscall filter" directive SystemCallFilter "@system-service"

# --- /etc/default against docs/options.md -----------------------------------
# Every env var of the options table ("Defaults and ranges") is in the file, commented out, with the
# default the table gives (in backticks), so uncommenting changes nothing.
default_file=$root/etc/default/$pkg
options_md=$repo/docs/options.md
if [ -f "$options_md" ]; then
	rows=0
	while IFS='|' read -r _ _opt env def _; do
		name=$(grep -oE 'GITLAB_HAPROXY_AGENT_[A-Z_]+' <<<"$env" | sed -n 1p)
		[ -n "$name" ] || continue
		rows=$((rows + 1))
		# shellcheck disable=SC2016 # literal backticks of the Markdown table
		value=$(grep -oE '^ *`[^`]*`' <<<"$def" | tr -d ' `')
		if [ -n "$value" ]; then
			check "/etc/default: #$name=$value" grep -qx "#$name=$value" "$default_file"
		else
			check "/etc/default: #$name=" grep -q "^#$name=" "$default_file"
		fi
	done < <(sed -n '/^## Defaults and ranges/,/^## [^D]/p' "$options_md")
	check "docs/options.md lists options ($rows)" test "$rows" -gt 0
else
	fail "docs/options.md not found"
fi
# Nothing in the file is set: the defaults are the binary's.
check "/etc/default sets nothing by default" \
	bash -c "! grep -Ev '^[[:space:]]*(#|\$)' '$default_file'"

# --- lintian ----------------------------------------------------------------
# Clean at every level, info and pedantic included. Overrides are shown with
# their justification; an override without a comment above it fails.
lintian --pedantic -I -E --show-overrides "$deb" >"$work/lintian.out" 2>&1
grep -E '^[NO]: ' "$work/lintian.out"
# The spelling-error-in-binary override covers machine-code false positives
# that come and go between builds: it may be unused.
tolerated='^I: [^ ]+ unused-override spelling-error-in-binary '
if grep -E '^[EWIPX]: ' "$work/lintian.out" | grep -Ev "$tolerated"; then
	fail "lintian reports tags"
else
	pass "lintian: no tags at any level ($(grep -c '^O: ' "$work/lintian.out") justified overrides)"
fi
unjustified=$(awk '
	/^#/ { justified = 1; next }
	/^[[:space:]]*$/ { justified = 0; next }
	{ if (!justified) print; justified = 0 }
' "$repo/debian/$pkg.lintian-overrides")
if [ -z "$unjustified" ]; then
	pass "every lintian override has a comment"
else
	fail "lintian overrides without a comment: $unjustified"
fi

# --- systemd-analyze ----------------------------------------------------------
# verify prints problems (and may still exit 0): any output fails.
verify_out=$(systemd-analyze verify --root="$root" "/usr/lib/systemd/system/$unit" 2>&1)
verify_rc=$?
if [ "$verify_rc" -eq 0 ] && [ -z "$verify_out" ]; then
	pass "systemd-analyze verify: clean"
else
	echo "$verify_out"
	fail "systemd-analyze verify (exit $verify_rc)"
fi

systemd-analyze security --offline=true --no-pager --root="$root" "$unit" >"$work/security.out" 2>&1
grep -E '✗' "$work/security.out"
exposure=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' "$work/security.out")
if [ -n "$exposure" ] && awk -v e="$exposure" -v m="$max_exposure" 'BEGIN { exit !(e < m) }'; then
	pass "systemd-analyze security --offline=true: exposure $exposure < $max_exposure ($(grep -o 'Overall.*' "$work/security.out"))"
else
	tail -n 3 "$work/security.out"
	fail "systemd-analyze security: exposure '${exposure:-?}' not under $max_exposure"
fi

# --- shellcheck ---------------------------------------------------------------
check "shellcheck maintainer scripts" shellcheck -s sh "$repo/debian/postinst" "$repo/debian/postrm"
check "shellcheck packaged maintainer scripts" \
	shellcheck -s sh "$work/control/postinst" "$work/control/postrm" "$work/control/prerm"
check "shellcheck test scripts" shellcheck "$repo"/debian/tests/*.sh

tally
[ "$failed" -eq 0 ]
