#!/usr/bin/env bash
# Runs the cookbook's checks without Chef: Ruby syntax of every cookbook file,
# every minitest file, and `haproxy -c -dW` on the rendered sample role (agent
# enabled and disabled) with HAProxy 2.6, 3.0 and 3.2. Prints "N passed, M
# failed"; exits 1 if any failed. Needs ruby, ruby-erubis, ruby-minitest,
# haproxy and the HAProxy 3.x chroots (scripts/install-deps.sh).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

passed=0
failed=0
skipped=0
pass() { passed=$((passed + 1)); }
fail() { failed=$((failed + 1)); echo "FAIL: $*" >&2; }

# Under /tmp: the only directory the HAProxy 3.x chroots share with the host.
work=$(mktemp -d /tmp/cookbook-test.XXXXXX)
trap 'rm -rf "$work"' EXIT

# 1. Syntax of everything Chef loads, and of the test code.
while IFS= read -r -d '' file; do
  if ruby -c "$file" >/dev/null 2>"$work/syntax.err"; then
    pass
  else
    fail "ruby -c $file: $(cat "$work/syntax.err")"
  fi
done < <(find metadata.rb attributes libraries recipes test -name '*.rb' -print0 | sort -z)

# 2. minitest files: each counts its runs.
for test_file in test/*_test.rb; do
  out="$work/$(basename "$test_file").out"
  if ruby "$test_file" >"$out" 2>&1; then
    status=0
  else
    status=$?
  fi
  summary=$(grep -E '^[0-9]+ runs, ' "$out" | tail -n 1)
  if [ -z "$summary" ]; then
    fail "$test_file did not run (exit $status)"
    cat "$out" >&2
    continue
  fi
  read -r runs failures errors skips <<<"$(sed -E \
    's/^([0-9]+) runs, [0-9]+ assertions, ([0-9]+) failures, ([0-9]+) errors, ([0-9]+) skips.*/\1 \2 \3 \4/' \
    <<<"$summary")"
  bad=$((failures + errors))
  skipped=$((skipped + skips))
  passed=$((passed + runs - bad - skips))
  failed=$((failed + bad))
  if [ "$status" -ne 0 ] || [ "$bad" -ne 0 ]; then
    [ "$bad" -ne 0 ] || fail "$test_file exited $status"
    echo "--- $test_file: $summary" >&2
    cat "$out" >&2
  else
    echo "ok   $test_file: $summary"
  fi
done

# 3. The rendered sample is a valid HAProxy config with no warning
#    (`haproxy -c -dW`), with and without the agent, on HAProxy 2.6 (bookworm,
#    on PATH) and on 3.0 and 3.2 (the chroots of scripts/haproxy-chroots.sh),
#    which bracket the fleet's 2.8; and it keeps no server-state file and no
#    admin listener over TCP. HAProxy 3.x prints nothing on a valid config.
opt=${GITLAB_HAPROXY_AGENT_TEST_OPT:-/opt/gitlab-haproxy-agent-test}
haproxies=(haproxy "$opt/haproxy-3.0/bin/haproxy" "$opt/haproxy-3.2/bin/haproxy")
for variant in enabled disabled; do
  cfg="$work/haproxy-$variant.cfg"
  args=(--stats-socket "$work/admin.sock")
  [ "$variant" = disabled ] && args+=(--disable-agent)
  if ! ruby test/render_sample.rb "${args[@]}" >"$cfg" 2>"$work/render.err"; then
    fail "render_sample.rb ($variant): $(cat "$work/render.err")"
    continue
  fi
  for bin in "${haproxies[@]}"; do
    if ! command -v "$bin" >/dev/null 2>&1; then
      fail "$bin not installed (scripts/install-deps.sh)"
      continue
    fi
    version=$("$bin" -v 2>/dev/null | sed -n 's/^HAProxy version \([0-9]*\.[0-9]*\)\..*/\1/p')
    if "$bin" -c -dW -f "$cfg" >"$work/check.out" 2>&1; then
      pass
      echo "ok   haproxy $version -c -dW on the sample role (agent $variant)"
    else
      fail "haproxy $version -c -dW on the sample role (agent $variant):"
      cat "$work/check.out" >&2
    fi
  done
  if grep -Eq 'server-state|stats +admin' "$cfg" ||
    grep -E '^\s*stats +socket ' "$cfg" | grep -vEq '^\s*stats +socket +/'; then
    fail "sample ($variant) has a server-state file or an admin TCP listener"
  else
    pass
  fi
done
if [ -f "$work/haproxy-enabled.cfg" ] && [ -f "$work/haproxy-disabled.cfg" ]; then
  agents=$(grep -c ' agent-check ' "$work/haproxy-enabled.cfg")
  # 14 server lines and one server-template line.
  if [ "$agents" -eq 15 ] && ! grep -q 'agent-' "$work/haproxy-disabled.cfg"; then
    pass
  else
    fail "expected 15 enrolled server lines with the agent enabled and none disabled (got $agents)"
  fi
fi

[ "$skipped" -eq 0 ] || echo "$skipped skipped"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
