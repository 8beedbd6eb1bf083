#!/usr/bin/env bash
# A page from the shipped rules, end to end, on loopback: a real Prometheus
# scrapes two static agent targets served by a small python3 HTTP server and
# evaluates alerts/gitlab-haproxy-agent-*.yml; a real Alertmanager
# (prometheus-alertmanager 0.25) routes with alerts/alertmanager.example.yml;
# the same python3 server stands in for PagerDuty's Events API v2 and for
# Slack's incoming webhook and records every notification.
#
#   lb-01: synced, last Consul read 5000 s ago -> GitLabHAProxyAgentConsulSyncStale
#          (s2, pager=pagerduty): must reach PagerDuty with its runbook_url
#          and instance, and Slack.
#   lb-02: synced, asked about no rows -> GitLabHAProxyAgentNotAsked (s3):
#          must reach Slack and never PagerDuty.
#   lb-03: synced, HAProxy asks nothing, 3 rows in drain not asked -> both
#          GitLabHAProxyAgentDrainNotApplied and GitLabHAProxyAgentNodeNotAsked
#          fire (checked in Prometheus); one cause, one page: only
#          DrainNotApplied reaches PagerDuty (the inhibit rule).
#
# Test copies, each made by one sed below and checked to have changed:
#   rules:        every "for:" set to 5s (the shipped ones are 5 to 15 minutes);
#   Alertmanager: group_wait 30s -> 1s; pagerduty_url and the Slack webhook URL
#                 point at the loopback server; the key and URL files live in
#                 the test directory.
# Everything else is the shipped text. Every wait is bounded (60 s for the
# notifications); every process started is stopped by its PID.
set -uo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top" || exit 1

log() { echo "alertmanager-e2e: $*"; }
die() {
  echo "alertmanager-e2e: FAIL: $*" >&2
  for f in "${logs[@]}"; do
    [ -s "$f" ] && { echo "--- $f (last 20 lines)" >&2; tail -n 20 "$f" >&2; }
  done
  exit 1
}

alertmanager_bin=$(command -v prometheus-alertmanager || command -v alertmanager) ||
  { echo "alertmanager-e2e: prometheus-alertmanager not found (run scripts/install-deps.sh)" >&2; exit 2; }
for tool in prometheus python3 curl; do
  command -v "$tool" >/dev/null || { echo "alertmanager-e2e: $tool not found (run scripts/install-deps.sh)" >&2; exit 2; }
done

work=$(mktemp -d /tmp/alertmanager-e2e.XXXXXX)
pids=()
logs=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT

# Loopback ports below the kernel's ephemeral range, not in use now, each
# handed out once (as in debian/tests/nspawn.sh).
taken=" $(ss -Htuan | awk '{ n = split($5, a, ":"); print a[n] }' | sort -u | tr '\n' ' ') "
ephemeral_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range)
pick_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((10000 + RANDOM % (ephemeral_low - 10000)))
    case $taken in *" $p "*) continue ;; esac
    taken="$taken$p "
    printf -v "$1" '%s' "$p"
    return 0
  done
  return 1
}
stub_port='' prom_port='' am_port=''
for var in stub_port prom_port am_port; do
  pick_port "$var" || die "no free port"
done

# --- test copies ---------------------------------------------------------------
mkdir -p "$work/rules"
for f in alerts/gitlab-haproxy-agent-alerts.yml alerts/gitlab-haproxy-agent-recording.yml; do
  cp "$f" "$work/rules/"
done
sed -E -i 's/^( +for:) .*/\1 5s/' "$work/rules/gitlab-haproxy-agent-alerts.yml"
cmp -s alerts/gitlab-haproxy-agent-alerts.yml "$work/rules/gitlab-haproxy-agent-alerts.yml" &&
  die "sed left every for: as it was"

routing_key=0123456789abcdef0123456789abcdef
printf '%s\n' "$routing_key" >"$work/pagerduty-routing-key"
printf 'http://127.0.0.1:%s/slack\n' "$stub_port" >"$work/slack-webhook-url"
sed -E \
  -e "s|^( +pagerduty_url:) .*|\1 http://127.0.0.1:$stub_port/pagerduty|" \
  -e "s|^( +slack_api_url_file:) .*|\1 $work/slack-webhook-url|" \
  -e "s|^( +- routing_key_file:) .*|\1 $work/pagerduty-routing-key|" \
  -e 's|^( +group_wait:) 30s$|\1 1s|' \
  alerts/alertmanager.example.yml >"$work/alertmanager.yml"
for want in "/pagerduty" "$work/slack-webhook-url" "$work/pagerduty-routing-key" "group_wait: 1s"; do
  grep -qF "$want" "$work/alertmanager.yml" || die "the Alertmanager test copy lacks $want (did the example change?)"
done

cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $work/rules/gitlab-haproxy-agent-recording.yml
  - $work/rules/gitlab-haproxy-agent-alerts.yml
alerting:
  alertmanagers:
    - static_configs:
        - targets: ['127.0.0.1:$am_port']
scrape_configs:
  - job_name: gitlab-haproxy-agent
    static_configs:
      - targets: ['127.0.0.1:$stub_port']
        labels:
          __metrics_path__: /agent/lb-01
          instance: lb-01.gprd.example:9778
          environment: gprd
          fqdn: lb-01.gprd.example
      - targets: ['127.0.0.1:$stub_port']
        labels:
          __metrics_path__: /agent/lb-02
          instance: lb-02.gprd.example:9778
          environment: gprd
          fqdn: lb-02.gprd.example
      - targets: ['127.0.0.1:$stub_port']
        labels:
          __metrics_path__: /agent/lb-03
          instance: lb-03.gprd.example:9778
          environment: gprd
          fqdn: lb-03.gprd.example
EOF

# --- the loopback server: agent targets, PagerDuty, Slack ------------------------
cat >"$work/stub.py" <<'PY'
import http.server, json, sys, time

port, out = int(sys.argv[1]), sys.argv[2]
started = time.time()

def agent(node):
    now = time.time()
    common = {
        "gitlab_haproxy_agent_synced": 1,
        "process_start_time_seconds": started,
    }
    if node == "lb-01":  # Consul not read for 5000 s: a stale copy
        return {**common, "gitlab_haproxy_agent_last_sync_timestamp_seconds": now - 5000,
                "gitlab_haproxy_agent_last_sync_age_seconds": 5000,
                "gitlab_haproxy_agent_rows_seen": 12,
                "gitlab_haproxy_agent_last_check_timestamp_seconds": now}
    if node == "lb-02":  # current, but HAProxy asks about no row
        return {**common, "gitlab_haproxy_agent_last_sync_timestamp_seconds": now - 5,
                "gitlab_haproxy_agent_last_sync_age_seconds": 5,
                "gitlab_haproxy_agent_rows_seen": 0}
    if node == "lb-03":  # HAProxy stopped asking; it had 3 servers in drain
        return {**common, "gitlab_haproxy_agent_last_sync_timestamp_seconds": now - 5,
                "gitlab_haproxy_agent_last_sync_age_seconds": 5,
                "gitlab_haproxy_agent_rows_seen": 0,
                'gitlab_haproxy_agent_rows_answered{state="drain"}': 3,
                "gitlab_haproxy_agent_out_rows_not_asked": 3}
    return None

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        metrics = agent(self.path.rsplit("/", 1)[-1]) if self.path.startswith("/agent/") else None
        if metrics is None:
            self.send_error(404)
            return
        body = "".join(f"{k} {v}\n" for k, v in metrics.items()).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(out, "a") as f:
            f.write(json.dumps({"path": self.path, "body": json.loads(body)}) + "\n")
        # PagerDuty answers 202 with a JSON status; Slack answers 200 "ok".
        reply = b'{"status":"success","message":"Event processed"}' if self.path == "/pagerduty" else b"ok"
        self.send_response(202 if self.path == "/pagerduty" else 200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
PY
notifications=$work/notifications.jsonl
: >"$notifications"
logs=("$work/stub.log" "$work/prometheus.log" "$work/alertmanager.log" "$work/notifications.jsonl")

python3 "$work/stub.py" "$stub_port" "$notifications" >"$work/stub.log" 2>&1 &
pids+=($!)
"$alertmanager_bin" --config.file="$work/alertmanager.yml" --storage.path="$work/am-data" \
  --web.listen-address="127.0.0.1:$am_port" --cluster.listen-address= \
  --log.level=warn >"$work/alertmanager.log" 2>&1 &
pids+=($!)
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/prom-data" \
  --web.listen-address="127.0.0.1:$prom_port" --log.level=warn >"$work/prometheus.log" 2>&1 &
pids+=($!)

ready() { curl -fs -m 2 -o /dev/null "http://127.0.0.1:$1/-/ready"; }
for _ in $(seq 1 60); do
  ready "$prom_port" && ready "$am_port" && break
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || die "a process exited at start-up"; done
  sleep 0.5
done
ready "$prom_port" || die "Prometheus not ready on 127.0.0.1:$prom_port within 30 s"
ready "$am_port" || die "Alertmanager not ready on 127.0.0.1:$am_port within 30 s"
log "Prometheus on 127.0.0.1:$prom_port, Alertmanager on 127.0.0.1:$am_port, targets and receivers on 127.0.0.1:$stub_port"

# --- wait for both notifications, then judge them --------------------------------
check=$(
  cat <<'PY'
import json, sys, urllib.parse, urllib.request
want_runbook = ("https://gitlab.com/gitlab-com/gl-infra/gitlab-haproxy-agent/-/blob/main/"
                "runbook/consul.md#consul-sync-stale")
key, final = sys.argv[2], sys.argv[3] == "final"
events = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
pd = [e["body"] for e in events if e["path"] == "/pagerduty"]
slack = [json.dumps(e["body"]) for e in events if e["path"] == "/slack"]
errors = []
pages = [b for b in pd if b.get("event_action") == "trigger"
         and "GitLabHAProxyAgentConsulSyncStale" in b.get("payload", {}).get("summary", "")]
if not pages:
    errors.append("no PagerDuty trigger for GitLabHAProxyAgentConsulSyncStale")
for b in pages:
    details = b["payload"].get("custom_details", {})
    if b.get("routing_key") != key:
        errors.append(f"page has routing_key {b.get('routing_key')!r}")
    if details.get("runbook_url") != want_runbook:
        errors.append(f"page has runbook_url {details.get('runbook_url')!r}, want {want_runbook}")
    if want_runbook not in [l.get("href") for l in b.get("links", [])]:
        errors.append(f"page links {b.get('links')!r} lack the runbook")
    if "lb-01.gprd.example:9778" not in details.get("instances", "").split():
        errors.append(f"page instances {details.get('instances')!r} lack lb-01.gprd.example:9778")
    if "lb-02" in json.dumps(b) or "lb-03" in json.dumps(b):
        errors.append("page names lb-02, which has no paging alert")
for b in pd:
    if "GitLabHAProxyAgentNotAsked" in json.dumps(b):
        errors.append("GitLabHAProxyAgentNotAsked (s3, no pager label) reached PagerDuty")
    if "GitLabHAProxyAgentNodeNotAsked" in json.dumps(b):
        errors.append("GitLabHAProxyAgentNodeNotAsked paged although DrainNotApplied fires "
                      "for the same instance (inhibit rule)")
if not any(b.get("event_action") == "trigger"
           and "GitLabHAProxyAgentDrainNotApplied" in b.get("payload", {}).get("summary", "")
           for b in pd):
    errors.append("no PagerDuty trigger for GitLabHAProxyAgentDrainNotApplied (lb-03)")
# The inhibition is not vacuous: NodeNotAsked does fire for lb-03.
query = urllib.parse.quote('ALERTS{alertname="GitLabHAProxyAgentNodeNotAsked",alertstate="firing"}')
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[4]}/api/v1/query?query={query}",
                                timeout=5) as r:
        firing = json.load(r)["data"]["result"]
except Exception as e:
    firing = []
if not any(s["metric"].get("instance") == "lb-03.gprd.example:9778" for s in firing):
    errors.append("GitLabHAProxyAgentNodeNotAsked is not firing for lb-03 in Prometheus")
for name in ("GitLabHAProxyAgentConsulSyncStale", "GitLabHAProxyAgentNotAsked"):
    if not any(name in s for s in slack):
        errors.append(f"no Slack message for {name}")
if not final:
    sys.exit(3 if errors else 0)
for e in errors:
    print(e, file=sys.stderr)
if not errors:
    p = pages[0]
    print(f"page: {p['payload']['summary']!r} severity {p['payload']['severity']},"
          f" instances {p['payload']['custom_details']['instances'].strip()},"
          f" runbook_url {p['payload']['custom_details']['runbook_url']}")
    print(f"{len(pd)} PagerDuty event(s), {len(slack)} Slack message(s)")
sys.exit(1 if errors else 0)
PY
)
deadline=$((SECONDS + 60))
until python3 -c "$check" "$notifications" "$routing_key" poll "$prom_port" 2>/dev/null; do
  [ "$SECONDS" -lt "$deadline" ] || break
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || die "a process exited"; done
  sleep 1
done
# Let a wrongly routed notification that is still on its way arrive too.
sleep 2
python3 -c "$check" "$notifications" "$routing_key" final "$prom_port" | sed 's/^/alertmanager-e2e: /' ||
  die "notifications (in $notifications) are wrong"
log "OK"
