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
#   ./scripts/bench.sh --hostile     only agent-checks beside hostile clients
#                                (idle, one-byte, slow readers, new lines)
#   ./scripts/bench.sh --fleet   instead: 1,000 and 5,000 agents on a
#                                three-server Consul cluster with client
#                                agents (benches/fleet.rs; about 20 minutes,
#                                8 GB of memory, every core busy)
#   ./scripts/bench.sh --consul-cost   instead: Consul requests and bytes per
#                                KV change, the agent beside `consul watch
#                                -type=keyprefix`, ACLs off and on, default
#                                and stale reads (benches/consul_cost.rs;
#                                about 3 minutes: 2 of them idle, to count
#                                the index checks; needs only consul)
#   ./scripts/bench.sh --partition   instead: time from an acknowledged
#                                write to every HAProxy showing it while a
#                                Consul leader, a follower, a client agent
#                                or a 1|2 split is cut off (nftables in a
#                                private network namespace; as root; about
#                                4 minutes; benches/partition_delay.rs)
#
# Other options are passed to the benchmark: --no-record, --quick,
# --soak-secs N, --runs N, --baseline-bin PATH (an earlier agent binary
# measured beside this one); with --fleet: --agents N,N, --writes N,
# --outage-secs S, --gprd (919 keys without and with writer records),
# --agent-arg=OPT (passed to every agent); with --consul-cost: --keys N,
# --idle-secs S; with --partition: --secs S (per cut), --rpc-hold-timeout
# DUR (Consul's, on every node), --fallback (the servers as every agent's
# --consul-fallback-addr), --label TEXT (the BENCHMARKS.md section,
# e.g. before).
set -euo pipefail
cd "$(dirname "$0")/.."

tools="consul haproxy"
if [ "${1:-}" = "--consul-cost" ]; then
  tools=consul
fi
for tool in $tools; do
  if ! command -v "$tool" >/dev/null; then
    echo "bench.sh: $tool not found; run scripts/install-deps.sh as root first" >&2
    exit 1
  fi
done

cargo build --release --locked --bin gitlab-haproxy-agent
if [ "${1:-}" = "--fleet" ]; then
  shift
  # Thousands of agents, each with its own descriptors and threads.
  ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
  exec cargo bench --locked --bench fleet -- --agent-bin "$PWD/target/release/gitlab-haproxy-agent" "$@"
fi
if [ "${1:-}" = "--partition" ]; then
  shift
  exec cargo bench --locked --bench partition_delay -- --agent-bin "$PWD/target/release/gitlab-haproxy-agent" "$@"
fi
if [ "${1:-}" = "--consul-cost" ]; then
  shift
  exec cargo bench --locked --bench consul_cost -- --agent-bin "$PWD/target/release/gitlab-haproxy-agent" "$@"
fi
exec cargo bench --locked --bench agent -- --agent-bin "$PWD/target/release/gitlab-haproxy-agent" "$@"
