#!/usr/bin/env bash
# Demo: a local Consul, a local HAProxy with five enrolled servers, and the
# agent, all on loopback. Drains the canary group with one `consul kv put`,
# overrides one server, then undrains with `consul kv delete`, printing
# HAProxy's `show stat` after each step. Stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "Installing HAProxy and Consul if missing, then building the agent (a few minutes on a fresh machine)..."
if [ "$(id -u)" -eq 0 ]; then scripts/install-deps.sh --demo >/dev/null; else sudo scripts/install-deps.sh --demo >/dev/null; fi
cargo build --quiet --locked
agent_bin=${CARGO_TARGET_DIR:-target}/debug/gitlab-haproxy-agent

work=$(mktemp -d /tmp/gitlab-haproxy-agent-demo.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# Nine distinct free loopback ports, below the kernel's ephemeral range so
# no outgoing connection can take one before the process given it binds it.
read -r http_port agent_port metrics_port app_port dns_port serf_lan_port \
  serf_wan_port server_port grpc_port < <(python3 -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
ports = []
for port in random.sample(range(10000, max(low, 10100)), 1000):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    ports.append(port)
    if len(ports) == 9:
        break
print(*ports)
')

echo "Starting Consul (dev mode) on 127.0.0.1:$http_port"
consul agent -dev -bind 127.0.0.1 -client 127.0.0.1 -http-port "$http_port" \
  -dns-port "$dns_port" -serf-lan-port "$serf_lan_port" -serf-wan-port "$serf_wan_port" \
  -server-port "$server_port" -grpc-port "$grpc_port" >"$work/consul.log" 2>&1 &
pids+=($!)
export CONSUL_HTTP_ADDR="127.0.0.1:$http_port"
for _ in $(seq 1 150); do
  consul kv put demo-ping 1 >/dev/null 2>&1 && break
  sleep 0.2
done

echo "Starting the agent on 127.0.0.1:$agent_port (metrics on 127.0.0.1:$metrics_port)"
"$agent_bin" --listen "127.0.0.1:$agent_port" --http-listen "127.0.0.1:$metrics_port" \
  --log-format text >"$work/agent.log" 2>&1 &
pids+=($!)
ready=false
for _ in $(seq 1 100); do
  if curl -fs "http://127.0.0.1:$metrics_port/-/ready" >/dev/null; then ready=true; break; fi
  sleep 0.1
done
if ! $ready; then
  echo "demo: the agent did not become ready within 10 s; its log:" >&2
  cat "$work/agent.log" >&2
  exit 1
fi

server() { # backend server groups...
  local backend=$1 name=$2; shift 2
  local send="$backend/$name${*:+ $*}"
  printf '    server %s 127.0.0.1:%s check inter 1s weight 100 agent-check agent-addr 127.0.0.1 agent-port %s agent-inter 2s agent-send "%s\\n"\n' \
    "$name" "$app_port" "$agent_port" "$send"
}
{
  echo "global"
  echo "    stats socket $work/admin.sock mode 600 level admin"
  echo "defaults"
  echo "    mode http"
  echo "    timeout connect 1s"
  echo "    timeout client 5s"
  echo "    timeout server 5s"
  echo "    timeout check 1s"
  echo "# Stands in for the application servers, so health checks pass."
  echo "frontend app"
  echo "    bind 127.0.0.1:$app_port"
  echo "    http-request return status 200 content-type text/plain string ok"
  echo "backend web"
  server web web-01
  server web web-02
  server web web-cny-01 canary
  server web web-cny-02 canary
  echo "backend api"
  server api api-cny-01 canary
} >"$work/haproxy.cfg"
echo "HAProxy server lines:"
grep '    server' "$work/haproxy.cfg"
haproxy -W -db -f "$work/haproxy.cfg" >"$work/haproxy.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 50); do [ -S "$work/admin.sock" ] && break; sleep 0.1; done

show_stat() {
  echo "--- $1"
  echo "show stat" | socat stdio "unix-connect:$work/admin.sock" \
    | awk -F, -v OFS=, 'NR==1 || ($2 != "" && $2 != "FRONTEND" && $2 != "BACKEND") {print $1, $2, $18, $19}' \
    | sed 's/^# //' | column -t -s,
}
settle() { sleep 3; } # agent-inter is 2 s

settle
show_stat "Before: no keys in Consul, every server ready"

echo; echo "\$ consul kv put gitlab-haproxy-agent/state/canary drain"
consul kv put gitlab-haproxy-agent/state/canary drain
settle
show_stat "After draining the canary group"

echo; echo "\$ consul kv put gitlab-haproxy-agent/state/web/web-cny-02 50%"
consul kv put gitlab-haproxy-agent/state/web/web-cny-02 50%
echo "\$ consul kv put gitlab-haproxy-agent/state/web/web-01 maint"
consul kv put gitlab-haproxy-agent/state/web/web-01 maint
settle
show_stat "A row key overrides the group; one server in maintenance"

# Back through maint, so HAProxy's slowstart ramps the canaries up, then
# one key at a time: deleting the whole prefix would also delete the
# writer's store id and records, which agents take for a Consul that lost
# its data (they would hold every drain).
echo; echo "\$ consul kv put gitlab-haproxy-agent/state/canary maint"
consul kv put gitlab-haproxy-agent/state/canary maint
settle
for key in canary web/web-cny-02 web/web-01; do
	echo; echo "\$ consul kv delete gitlab-haproxy-agent/state/$key"
	consul kv delete "gitlab-haproxy-agent/state/$key"
done
settle
show_stat "After deleting the keys: back to ready at configured weight"

echo; echo "What the agent logged:"
sed -n 's/^[^ ]* *//p' "$work/agent.log"
