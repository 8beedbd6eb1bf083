# shellcheck shell=bash
# Shared by the package tests: TAP-like result lines and their count.
# Sourced, not run. Each script ends with tally: "N passed, N failed" and
# the failed checks again, so a log cut in the middle still names them.

passed=0
failed=0
failures=
pass() { passed=$((passed + 1)); echo "ok   - $*"; }
fail() {
	failed=$((failed + 1))
	failures="$failures
FAIL - $*"
	echo "FAIL - $*"
}
tally() { # prints the count, then every failed check again
	echo "$passed passed, $failed failed$failures"
}
check() { # check "description" command...
	local what=$1
	shift
	if "$@"; then pass "$what"; else fail "$what"; fi
}
