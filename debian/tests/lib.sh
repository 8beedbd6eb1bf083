# shellcheck shell=bash
# Shared by the package tests: TAP-like result lines and their count.
# Sourced, not run. Each script ends with "N passed, N failed".

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok   - $*"; }
fail() { failed=$((failed + 1)); echo "FAIL - $*"; }
check() { # check "description" command...
	local what=$1
	shift
	if "$@"; then pass "$what"; else fail "$what"; fi
}
