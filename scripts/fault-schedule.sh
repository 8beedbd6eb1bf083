#!/usr/bin/env bash
# Runs the seeded fault-schedule test (tests/fault_schedule.rs) on demand,
# with longer schedules than CI: a real HAProxy, a real Consul that keeps its
# data, and the agent, under random writes, invalid values, restarts,
# reloads and token policy changes. Each seed's schedule is generated from
# the seed alone, so a failing seed replays the same steps.
#
#   scripts/fault-schedule.sh SEED...            run these seeds
#   scripts/fault-schedule.sh --count N          run N random seeds
#   options: --steps S (steps per schedule, default 60)
#            --without F,... (leave out fault families: invalid, narrow,
#              agent-restart, consul-restart, reload; their steps become
#              valid writes, to tell which family a violation needs)
#            --agent-log (print the agent's log for a failing seed)
#
# Prints one line per seed, every violation with the steps before it, the
# total "N schedules, M steps, K samples, V violations", and for each
# failing seed the command that replays it. Exit status 0 only if no seed
# failed. Needs HAProxy and Consul (scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  echo "usage: $0 [--steps S] [--without F,...] [--agent-log] (SEED... | --count N)" >&2
  exit 64
}
# --help: the header comment above, as the usage text.
help() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
  exit 0
}

steps=60
count=
seeds=()
while [ $# -gt 0 ]; do
  case $1 in
    --steps) [ $# -ge 2 ] || usage; steps=$2; shift 2 ;;
    --count) [ $# -ge 2 ] || usage; count=$2; shift 2 ;;
    --without) [ $# -ge 2 ] || usage; export GHA_FAULT_WITHOUT=$2; shift 2 ;;
    --agent-log) export GHA_FAULT_AGENT_LOG=1; shift ;;
    -h|--help) help ;;
    -*) usage ;;
    *) seeds+=("$1"); shift ;;
  esac
done
for n in "$steps" ${count:+"$count"} ${seeds[@]+"${seeds[@]}"}; do
  case $n in ''|*[!0-9]*) echo "$0: not a number: $n" >&2; exit 64 ;; esac
done
if [ -n "$count" ]; then
  [ "${#seeds[@]}" -eq 0 ] || usage
  for _ in $(seq "$count"); do
    seeds+=("$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')")
  done
fi
[ "${#seeds[@]}" -gt 0 ] || usage

echo "seeds: ${seeds[*]} ($steps steps each${GHA_FAULT_WITHOUT:+, without $GHA_FAULT_WITHOUT})"
GHA_FAULT_SEEDS="${seeds[*]}" GHA_FAULT_STEPS="$steps" \
  cargo test --locked --test fault_schedule drained_servers_stay_out -- --nocapture --test-threads 1
