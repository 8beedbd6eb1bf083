#!/usr/bin/env bash
# Runs every test of the project on a Debian bookworm machine with a Rust
# toolchain: installs what is missing (HAProxy, Consul, promtool, Ruby, ...),
# then lint, unit and integration tests against a real Consul and HAProxy,
# the cookbook tests, the alert rule tests, and the packaging tests.
# Prints one line per suite and a closing "suites: N passed, N failed".
#
#   --quick   format, lint, unit, table and simulation tests only: no
#             installs and no services (a few minutes on a built tree)
#
# The Rust tests run under cargo-nextest (.config/nextest.toml): each test
# in its own process, several at once. The tests that wait for Consul's
# tombstone reap (about 15 minutes, mostly asleep; `#[ignore]`d, so no
# other run of the tests has them) are built first, alone, then run in the
# background beside every other suite (cargo builds nothing while they run:
# a run only checks that its binaries are current) and are collected after
# the other suites, as a suite of their own.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

quick=false
case "${1:-}" in
  --quick) quick=true ;;
  "") ;;
  *)
    echo "usage: scripts/test.sh [--quick]" >&2
    exit 64
    ;;
esac

sudo_if_needed() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if ! command -v cargo >/dev/null; then
  echo "test.sh: cargo not found; install a Rust toolchain (1.85 or newer) first" >&2
  exit 1
fi
if ! $quick; then
  sudo_if_needed scripts/install-deps.sh || { echo "test.sh: installing dependencies failed" >&2; exit 1; }
fi

# cargo-nextest when installed (scripts/install-deps.sh installs it), else
# cargo test: the same tests, one binary at a time.
have_nextest() { cargo nextest --version >/dev/null 2>&1; }
rust_tests() {
  if have_nextest; then
    cargo nextest run --locked --no-fail-fast "$@"
  else
    cargo test --locked --no-fail-fast "$@"
  fi
}
# Builds what rust_tests "$@" runs, and runs nothing.
rust_build() {
  if have_nextest; then
    cargo nextest run --locked --no-run "$@"
  else
    cargo test --locked --no-run "$@"
  fi
}
# The ignored tests, those that wait for Consul's tombstone reap
# (tests/lost_data.rs), under nextest's `reap` profile: stopped after 25
# minutes rather than 10. A command, not a function, so that the PID a
# background run leaves in $! is its own (cargo execs cargo-nextest).
if have_nextest; then
  reap_tests=(cargo nextest run --locked --no-fail-fast --profile reap --run-ignored only --test lost_data)
else
  reap_tests=(cargo test --locked --no-fail-fast --test lost_data -- --ignored)
fi

passed=0
failed=0
failed_names=()
# record NAME STATUS START: counts a suite that began at $SECONDS = START.
record() {
  if [ "$2" -eq 0 ]; then
    passed=$((passed + 1))
    echo "<== $1: ok ($((SECONDS - $3)) s)"
  else
    failed=$((failed + 1))
    failed_names+=("$1")
    echo "<== $1: FAILED ($((SECONDS - $3)) s)"
  fi
}
suite() {
  local name=$1
  shift
  echo "==> $name"
  local start=$SECONDS
  "$@"
  local status=$?
  record "$name" "$status" "$start"
  return "$status"
}

# The background suite: its output goes to a file, shown when it is
# collected; stopped (by its PID) if this script ends before that.
bg_name="consul tombstone reap (background)"
bg_pid=""
bg_log=""
bg_began=0
bg_start() {
  bg_log=$(mktemp -t gha-test-reap.XXXXXX) || return 1
  bg_began=$SECONDS
  "${reap_tests[@]}" >"$bg_log" 2>&1 &
  bg_pid=$!
  echo "--- $bg_name: started (PID $bg_pid), collected after the other suites"
}
bg_collect() {
  [ -n "$bg_pid" ] || return 0
  echo "==> $bg_name"
  wait "$bg_pid"
  local status=$?
  bg_pid=""
  cat "$bg_log"
  rm -f "$bg_log"
  record "$bg_name" "$status" "$bg_began"
}
bg_stop() {
  if [ -n "$bg_pid" ]; then
    kill "$bg_pid" 2>/dev/null && wait "$bg_pid"
    echo "--- $bg_name: stopped, not collected; its output so far:"
    cat "$bg_log"
    rm -f "$bg_log"
  fi
}
trap bg_stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

summary() {
  if [ "$failed" -gt 0 ]; then
    echo "failed suites: ${failed_names[*]}"
  fi
  echo "suites: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}

# The reap tests first: they are the longest suite, so they are built
# alone and started before everything else.
if ! $quick; then
  if suite "build the reap tests" rust_build --test lost_data; then
    bg_start
  else
    echo "==> $bg_name"
    echo "not started: the tests did not build"
    record "$bg_name" 1 "$SECONDS"
  fi
fi
suite "cargo fmt" cargo fmt --all --check
suite "cargo clippy" cargo clippy --workspace --all-targets --locked -- -D warnings
if $quick; then
  # The libraries' unit and table tests (the core crate's decision tables
  # among them), tests/layout.rs (no import cycle in src/ or core/src/, the
  # writer under its line budget, the core free of a runtime) and the
  # simulation: nothing started, nothing installed.
  suite "unit, table and simulation tests" rust_tests --workspace --lib --bins --test layout --test simulation
  summary
  exit
fi
# The agent of 89740e7, the last writer that kept its records below the
# prefix, for tests/upgrade.rs (GITLAB_HAPROXY_AGENT_OLD_BIN; without it
# that test says it is skipped): a debug build of the commit's tree, in a
# target folder of its own under target/ (about 2 minutes the first time,
# nothing after). A clone without the commit (shallow) skips it.
old_rev=89740e7
old_dir=target/old-$old_rev
build_old_agent() {
  git cat-file -e "$old_rev^{commit}" 2>/dev/null || {
    echo "commit $old_rev is not in this clone (shallow?): tests/upgrade.rs is skipped"
    return 0
  }
  rm -rf "$old_dir/src" && mkdir -p "$old_dir/src" &&
    git archive "$old_rev" | tar -x -C "$old_dir/src" &&
    (cd "$old_dir/src" && CARGO_INCREMENTAL=0 CARGO_TARGET_DIR="$PWD/../target" \
      cargo build --locked --bin gitlab-haproxy-agent) &&
    export GITLAB_HAPROXY_AGENT_OLD_BIN="$PWD/$old_dir/target/debug/gitlab-haproxy-agent"
}
suite "build the agent of $old_rev (upgrade test)" build_old_agent
# Every test of the workspace, the core crate's too (the benches,
# harness = false, are built by clippy above).
suite "cargo nextest" rust_tests --workspace --lib --bins --tests
# The HAProxy-facing tests again on HAProxy 3.0 and 3.2 (the fleet's 2.8 lies
# between bookworm's 2.6 and these), run from scripts/haproxy-chroots.sh; the
# fault schedule with two of its CI seeds cut to their first 20 steps (both
# change the token policy while writes go on; seed 10 reloads HAProxy then),
# run side by side, about 30 s.
haproxy_tests() { # haproxy_tests VERSION
  (
    export GITLAB_HAPROXY_AGENT_TEST_HAPROXY="/opt/gitlab-haproxy-agent-test/haproxy-$1/bin/haproxy"
    export GHA_FAULT_SEEDS="4 10" GHA_FAULT_STEPS=20
    rust_tests --test haproxy --test cookbook_e2e --test fault_schedule \
      --test runtime_commands --test reload_guard --test idle_and_ramp
  )
}
for v in 3.0 3.2; do
  suite "HAProxy $v (tests haproxy, cookbook_e2e, fault_schedule, runtime_commands, reload_guard, idle_and_ramp)" \
    haproxy_tests "$v"
done
[ -x cookbook/gitlab-haproxy-agent/test/run.sh ] && suite "cookbook" cookbook/gitlab-haproxy-agent/test/run.sh
[ -x scripts/check-alerts.sh ] && suite "alerts and dashboard" scripts/check-alerts.sh
suite "shellcheck" bash -c 'git ls-files -z "*.sh" .ci/run | xargs -0 shellcheck'
[ -x debian/tests/static.sh ] && suite "package (static)" debian/tests/static.sh
[ -x debian/tests/apt-repo.sh ] && suite "apt repository signing key" debian/tests/apt-repo.sh
[ -x debian/tests/nspawn.sh ] && suite "package (systemd)" debian/tests/nspawn.sh
[ -x deploy/kubernetes/test.sh ] && suite "kubernetes sidecar (podman)" deploy/kubernetes/test.sh
bg_collect

summary
