#!/usr/bin/env bash
# Runs the shipped manifest (haproxy-agent.yaml) as a real pod with podman
# and checks the sidecar behaves as the manifest promises:
#
#  1. the manifest passes `kubernetes-validate --strict`;
#  2. the agent image (build-image.sh) is under 20 MB;
#  3. while Consul is away the agent stays up, /-/ready answers 503 and the
#     readiness probe never passes;
#  4. Consul comes up in the pod: /-/ready answers 200 and the pod becomes
#     ready by the manifest's probes, no sooner than their thresholds allow;
#  5. a drain written to KV reaches HAProxy in the pod within agent-inter;
#  6. the agent container is restarted: HAProxy keeps running with its
#     state, no drained or maintained server flips to ready, the new agent
#     starts from the state file in the pod's emptyDir, and the pod is
#     ready again;
#  7. the image serves a CPU profile that `go tool pprof` reads.
#
# podman 4.3 runs no readiness or startup probes, so kubelet_probes.py runs
# the manifest's probes (period, thresholds, startup before readiness) from
# inside the pod's network namespace. Consul runs as `consul agent -dev` in
# that namespace too (nsenter), standing in for the node's Consul agent:
# a host process the test starts and stops by PID, on the pod's own
# loopback, with no image to build. HAProxy's image is the host's HAProxy
# with its libraries (no registry). podman_manifest.py lists the few
# changes podman needs. Every pod, volume, secret, image tag and process
# this starts is removed on exit. Run as root. About a minute after the
# release build, which the package suites (`cargo deb`) have already done
# when scripts/test.sh runs this: the image reuses their binary.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ "$(id -u)" -ne 0 ]; then
  echo "k8s: run as root (rootful podman, nsenter into the pod)" >&2
  exit 1
fi

here=deploy/kubernetes
manifest=$here/haproxy-agent.yaml
validate=${KUBERNETES_VALIDATE:-/opt/kubernetes-validate/bin/kubernetes-validate}
agent=gitlab-haproxy-agent
agent_inter_ms=2000
startup_timeout_s=5

id=t$$
suffix=-$id
pod=haproxy$suffix-pod-0
agent_image=localhost/gitlab-haproxy-agent:$id
haproxy_image=localhost/gitlab-haproxy-agent-test-haproxy:$id
work=$(mktemp -d "/tmp/k8s-test.XXXXXX")
rundir=$work/run
probe_pid=
consul_pid=
sampler_pid=

say() { echo "k8s: $*"; }
fail() {
  echo "k8s: FAIL: $*" >&2
  for f in probes.log consul.log; do
    [ -f "$work/$f" ] && { echo "--- $f (last 30 lines)" >&2; tail -30 "$work/$f" >&2; }
  done
  echo "--- agent log" >&2
  podman logs --tail 30 "$pod-$agent" >&2 2>&1 || true
  exit 1
}

cleanup() {
  set +e
  for pid in $sampler_pid $probe_pid $consul_pid; do
    kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  done
  podman pod rm -f "$pod" >/dev/null 2>&1
  podman volume rm -f "haproxy-config$suffix" "haproxy-run$suffix" "consul-token$suffix" \
    "gitlab-haproxy-agent-consul-token$suffix" >/dev/null 2>&1
  podman secret rm "gitlab-haproxy-agent-consul-token$suffix" >/dev/null 2>&1
  podman rmi "$agent_image" "$haproxy_image" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

# Quiet podman's notices about CNI and systemd health checks (not used).
pm() { podman "$@" 2> >(grep -v 'CNI config\|systemd connection' >&2); }

now_ms() { date +%s%3N; }

# --- 1. The manifest is valid Kubernetes, with no unknown fields.
"$validate" --strict --quiet "$manifest" || fail "kubernetes-validate --strict rejected $manifest"
say "manifest valid (kubernetes-validate --strict)"

# --- 2. Images.
out=$("$here/build-image.sh" "$agent_image" | tail -1)
say "agent image: $out"

ctx=$work/haproxy-image
mkdir -p "$ctx/root/usr/local/sbin" "$ctx/root/usr/local/etc/haproxy" "$ctx/root/var/run/haproxy"
cp /usr/sbin/haproxy "$ctx/root/usr/local/sbin/"
for lib in $(ldd /usr/sbin/haproxy | grep -o '/[^ ]*'); do
  mkdir -p "$ctx/root$(dirname "$lib")"
  cp -L "$lib" "$ctx/root$lib"
done
cat >"$ctx/Containerfile" <<'EOF'
FROM scratch
COPY root/ /
ENV PATH=/usr/local/sbin:/usr/local/bin
USER 99:99
EOF
pm build --quiet --tag "$haproxy_image" --file "$ctx/Containerfile" "$ctx" >/dev/null
say "HAProxy image: $(haproxy -v | sed -n 1p | cut -d' ' -f1-3) from the host, as $haproxy_image"

# --- 3. The pod, with Consul away.
mkdir -p "$rundir"
python3 "$here/podman_manifest.py" "$manifest" "$work" "$suffix" "$agent_image" "$haproxy_image" "$rundir"
pm kube play --network none "$work/secret.yaml" >/dev/null
pm kube play --network none --configmap "$work/configmap.yaml" "$work/deployment.yaml" >/dev/null
started_ms=$(now_ms)
infra=$(podman pod inspect "$pod" --format '{{.InfraContainerID}}')
netns_pid=$(podman inspect --format '{{.State.Pid}}' "$infra")
in_pod() { nsenter -t "$netns_pid" -n "$@"; }
say "pod $pod up; its network namespace is that of PID $netns_pid"
# The agent runs as the manifest says: not root, on a read-only root.
ctr=$(podman inspect --format '{{.HostConfig.ReadonlyRootfs}}' "$pod-$agent")
[ "$ctr" = true ] || fail "the agent's root filesystem is not read-only"
uid=$(awk '/^Uid:/ { print $2 }' "/proc/$(podman inspect --format '{{.State.Pid}}' "$pod-$agent")/status")
[ "$uid" != 0 ] || fail "the agent runs as root"
say "agent runs as uid $uid on a read-only root filesystem"

# nsenter execs (no fork for -n alone), so $! is the prober's own PID.
nsenter -t "$netns_pid" -n python3 "$here/kubelet_probes.py" "$manifest" --restarted "$agent" >"$work/probes.log" &
probe_pid=$!

http_code() { in_pod curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:9778$1" || true; }
# `show servers state` of backend web: "server admin_state" per line.
admin_states() {
  echo "show servers state web" | socat -t 2 - "UNIX-CONNECT:$rundir/haproxy-run/admin.sock" 2>/dev/null \
    | awk 'NF >= 7 && $1 !~ /^#/ { print $4, $7 }'
}
admin_of() { admin_states | awk -v s="$1" '$1 == s { print $2 }'; }
ready_is() { [ "$(http_code /-/ready)" = "$1" ]; }
admin_is() { [ "$(admin_of "$1")" = "$2" ]; }
pod_ready_times() { [ "$(grep -c 'pod ready' "$work/probes.log")" -ge "$1" ]; }
wait_for() { # seconds, description, command...
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || fail "timed out waiting for $what"
    sleep 0.1
  done
}

# Well past --startup-timeout and several readiness periods.
sleep $((startup_timeout_s + 7))
state=$(podman inspect --format '{{.State.Status}} {{.RestartCount}}' "$pod-$agent")
[ "$state" = "running 0" ] || fail "the agent did not stay up without Consul: $state"
code=$(http_code /-/ready)
[ "$code" = 503 ] || fail "/-/ready answered $code without Consul, not 503"
grep -q "$agent started" "$work/probes.log" || fail "the agent's startup probe did not pass"
fails=$(grep -c "$agent readiness fail 503" "$work/probes.log" || true)
[ "$fails" -ge 3 ] || fail "only $fails readiness probes ran while Consul was away"
grep -q "$agent ready\|pod ready" "$work/probes.log" && fail "readiness passed while Consul was away"
podman logs "$pod-$agent" 2>&1 | grep "staying up" >/dev/null || fail "the agent did not log that it keeps retrying"
say "Consul away for $(( ($(now_ms) - started_ms) / 1000 )) s: agent running, /-/ready 503, $fails readiness probes failed, none passed"

# --- 4. Consul comes up in the pod.
nsenter -t "$netns_pid" -n consul agent -dev -bind 127.0.0.1 -client 127.0.0.1 -http-port 8500 \
  -dns-port -1 -grpc-port -1 >"$work/consul.log" 2>&1 &
consul_pid=$!
consul_ms=$(now_ms)
kv_put() { in_pod curl -sf -m 5 -X PUT --data "$2" "http://127.0.0.1:8500/v1/kv/gitlab-haproxy-agent/state/$1" >/dev/null; }
wait_for 30 "Consul to accept writes" kv_put web/web-02 maint
wait_for 60 "/-/ready to answer 200" ready_is 200
ready_ms=$(now_ms)
wait_for 30 "the pod to become ready by its probes" pod_ready_times 1
pod_ready_ms=$(now_ms)
# Readiness needs successThreshold (3) passes periodSeconds (2) apart: the
# third pass, about 4 s after the first (probe runs may start late).
first_pass=$(awk -v a="$agent" '$2 == a && $3 == "readiness" && $4 == "pass" { print $1; exit }' "$work/probes.log")
ready_at=$(awk -v a="$agent" '$2 == a && $3 == "ready" { print $1; exit }' "$work/probes.log")
passes=$(awk -v a="$agent" -v r="$ready_at" '$2 == a && $3 == "readiness" && $4 == "pass" && $1 <= r' "$work/probes.log" | wc -l)
[ "$passes" -eq 3 ] || fail "the agent was marked ready at ${ready_at}s after $passes readiness passes, not successThreshold 3"
awk -v p="$first_pass" -v r="$ready_at" 'BEGIN { exit !(r - p >= 3.5) }' \
  || fail "the agent was marked ready at ${ready_at}s, under two periods after its first pass at ${first_pass}s"
hs=$(awk '$2 == "haproxy" && $3 == "started" { print $1; exit }' "$work/probes.log")
awk -v s="$hs" 'BEGIN { exit !(s >= 4) }' || fail "HAProxy's startup probe passed at ${hs}s, before one health-check round"
say "Consul up: /-/ready 200 after $(( ready_ms - consul_ms )) ms; pod ready by its probes $(( pod_ready_ms - consul_ms )) ms after Consul (readiness passes from ${first_pass}s, ready at ${ready_at}s; HAProxy started at ${hs}s)"

wait_for 10 "web-02 to be in maint in HAProxy" admin_is web-02 1
[ "$(admin_of web-01)" = 0 ] || fail "web-01 is not ready in HAProxy: $(admin_states | tr '\n' ' ')"

# --- 5. A drain reaches HAProxy within agent-inter.
t0=$(now_ms)
kv_put web/web-01 drain
wait_for 10 "web-01 to be drained in HAProxy" admin_is web-01 8
took=$(( $(now_ms) - t0 ))
[ "$took" -le $((agent_inter_ms + 500)) ] || fail "the drain took $took ms to reach HAProxy (agent-inter $agent_inter_ms ms)"
say "drain of web/web-01 in HAProxy after $took ms (agent-inter $agent_inter_ms ms)"

# --- 6. The agent container restarts; HAProxy keeps its state.
haproxy_pid=$(podman inspect --format '{{.State.Pid}}' "$pod-haproxy")
agent_pid=$(podman inspect --format '{{.State.Pid}}' "$pod-$agent")
(while :; do admin_states | tr '\n' ' '; echo; sleep 0.1; done) >"$work/states.log" &
sampler_pid=$!
sleep 1
restart_ms=$(now_ms)
pm restart -t 5 "$pod-$agent" >/dev/null
kill -USR1 "$probe_pid"
new_agent_pid=$(podman inspect --format '{{.State.Pid}}' "$pod-$agent")
[ "$new_agent_pid" != "$agent_pid" ] || fail "the agent container did not restart"
wait_for 30 "the pod to be ready again" pod_ready_times 2
sleep $((agent_inter_ms * 2 / 1000))
kill "$sampler_pid"
wait "$sampler_pid" 2>/dev/null || true
sampler_pid=
[ "$(podman inspect --format '{{.State.Pid}}' "$pod-haproxy")" = "$haproxy_pid" ] || fail "HAProxy restarted with the agent"
samples=$(grep -c web-01 "$work/states.log" || true)
[ "$samples" -ge 20 ] || fail "only $samples samples of HAProxy's state during the restart"
bad=$(grep web-01 "$work/states.log" | grep -v "web-01 8 web-02 1 web-cny-01 0" | head -3 || true)
[ -z "$bad" ] || fail "a server changed state while the agent restarted: $bad"
# The restarted container answered from the state file the first one wrote
# to the pod's emptyDir.
in_pod curl -sf -m 5 http://127.0.0.1:9778/status | python3 -c '
import json, sys
s = json.load(sys.stdin)["state_file"]
sys.exit(0 if s["loaded"] and s["path"] == "/var/lib/gitlab-haproxy-agent/served-state.json" else 1)
' || fail "the restarted agent did not start from its state file"
say "agent restarted (PID $agent_pid -> $new_agent_pid), pod ready again $(( $(now_ms) - restart_ms - agent_inter_ms * 2 )) ms after the restart; HAProxy (PID $haproxy_pid) kept web-01 drained and web-02 in maint in all $samples samples"
# --- 7. The image profiles itself, under agent-checks sent as fast as one
# client can.
# A 2 s profile can miss the load when the load generator starts late on a
# busy machine: up to three tries, each under its own load.
named=false
for _try in 1 2 3; do
  in_pod python3 -c '
import socket, time
end = time.monotonic() + 4
while time.monotonic() < end:
    s = socket.create_connection(("127.0.0.1", 9777))
    s.sendall(b"web/web-01\n")
    s.recv(64)
    s.close()
' &
  load_pid=$!
  sleep 0.5
  in_pod curl -sf -m 20 -o "$work/cpu.pb" "http://127.0.0.1:9778/debug/pprof/profile?seconds=2" \
    || fail "no CPU profile from /debug/pprof/profile in the pod"
  wait "$load_pid"
  HOME=$work go tool pprof -top "$work/cpu.pb" >"$work/top.txt" 2>&1 || fail "go tool pprof cannot read the pod's profile: $(cat "$work/top.txt")"
  if grep -q "gitlab_haproxy_agent::agent::responder" "$work/top.txt"; then
    named=true
    break
  fi
done
$named || fail "the pod's profile does not name the responder: $(head -20 "$work/top.txt")"
say "a 2 s CPU profile from the pod, read by go tool pprof, names the responder ($(grep -c gitlab_haproxy_agent "$work/top.txt") of the agent's functions)"
say "ok"
