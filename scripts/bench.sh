#!/usr/bin/env bash
# Benchmarks the agent against its targets on this machine: responder cost
# against a floor responder, footprint, convergence (100 agents, and a real
# HAProxy with 1,000 rows), Consul load. Starts its own Consul, HAProxy and
# agents on loopback and stops them by PID. Prints one table and records it
# in BENCHMARKS.md. About 3 minutes.
#
#   ./scripts/bench.sh           the default run
#   ./scripts/bench.sh --soak    the 10-minute soak at 2,000 checks/s instead
#   ./scripts/bench.sh --responder   only footprint and responder cost, 3 runs
#
# Other options are passed to the benchmark: --no-record, --quick,
# --soak-secs N, --runs N, --baseline-bin PATH (an earlier agent binary
# measured beside this one).
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in consul haproxy; do
  if ! command -v "$tool" >/dev/null; then
    echo "bench.sh: $tool not found; run scripts/install-deps.sh as root first" >&2
    exit 1
  fi
done

cargo build --release --locked --bin gitlab-haproxy-agent
exec cargo bench --locked --bench agent -- --agent-bin "$PWD/target/release/gitlab-haproxy-agent" "$@"
