#!/usr/bin/env bash
# Checks the observability files: Prometheus rules (promtool check rules),
# their unit tests (promtool test rules), the Grafana dashboard (valid JSON,
# fixed uid, template variables, every panel query parses), and that every
# runbook annotation points at a section of a runbook page and every metric
# used is one docs/metrics.md lists; that the example Alertmanager
# configuration routes every alert by its labels (amtool), and that a real
# Prometheus and Alertmanager deliver a page (scripts/alertmanager-e2e.sh).
# Exits non-zero on any failure. Needs promtool, amtool, alertmanager,
# python3 and ruby (scripts/install-deps.sh installs them).
set -uo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top" || exit 1

failures=0
fail() {
  echo "check-alerts: FAIL: $*" >&2
  failures=$((failures + 1))
}

for tool in promtool python3 amtool ruby; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "check-alerts: $tool not found (run scripts/install-deps.sh)" >&2
    exit 2
  fi
done

shopt -s nullglob
rule_files=()
for f in alerts/*.yml alerts/*.yaml; do
  case "$f" in alerts/alertmanager.*) ;; *) rule_files+=("$f") ;; esac
done
test_files=(alerts/tests/*.yml alerts/tests/*.yaml)
dashboards=(dashboards/*.json)
shopt -u nullglob

[ ${#rule_files[@]} -gt 0 ] || fail "no rule files in alerts/"
[ ${#test_files[@]} -gt 0 ] || fail "no unit tests in alerts/tests/"
[ ${#dashboards[@]} -gt 0 ] || fail "no dashboards in dashboards/"

if [ ${#rule_files[@]} -gt 0 ]; then
  promtool check rules "${rule_files[@]}" || fail "promtool check rules"
fi
if [ ${#test_files[@]} -gt 0 ]; then
  promtool test rules "${test_files[@]}" || fail "promtool test rules"
fi

# Every alert must appear in a unit test.
for f in "${rule_files[@]}"; do
  while read -r name; do
    grep -qE "alertname: ${name}\$" "${test_files[@]}" || fail "alert $name has no unit test"
  done < <(sed -n 's/^ *- alert: *\([A-Za-z0-9_]*\).*/\1/p' "$f")
done

# Every runbook annotation must name a heading of a runbook page,
# runbook/PAGE.md#anchor (GitLab and GitHub anchors: lower case, punctuation
# dropped, spaces to hyphens).
for f in "${rule_files[@]}"; do
  while read -r link; do
    page=${link%%#*}
    case "$page" in
      runbook/*.md) ;;
      *) fail "$f: runbook annotation $link does not point into runbook/"; continue ;;
    esac
    [ -f "$page" ] || { fail "$f: runbook annotation $link: no page $page"; continue; }
    anchors=$(sed -n 's/^#\{1,6\} \{1,\}//p' "$page" |
      tr '[:upper:]' '[:lower:]' | sed -e 's/[^a-z0-9 _-]//g' -e 's/ /-/g')
    grep -qxF "${link#*#}" <<<"$anchors" || fail "$f: runbook anchor #${link#*#} has no section in $page"
  done < <(sed -n 's/^ *runbook: *//p' "$f")
done

for d in "${dashboards[@]}"; do
  python3 -m json.tool "$d" >/dev/null || { fail "$d is not valid JSON"; continue; }
  # Structure, then every panel query wrapped in a rule file so promtool parses it.
  exprs=$(mktemp)
  python3 - "$d" "$exprs" <<'PY' || fail "$d: dashboard model"
import json, sys
path, out = sys.argv[1], sys.argv[2]
d = json.load(open(path))
errors = []
if d.get("uid") != "gitlab-haproxy-agent":
    errors.append("uid must be gitlab-haproxy-agent")
variables = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
ds = variables.get("datasource")
if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
    errors.append("needs a datasource variable of type datasource, query prometheus")
for name in ("environment", "fqdn"):
    v = variables.get(name)
    if not v or v.get("type") != "query" or "label_values(" not in str(v.get("query")):
        errors.append(f"needs a {name} query variable using label_values")
exprs, ids = [], set()
def walk(panels):
    for p in panels:
        if p.get("id") in ids:
            errors.append(f"duplicate panel id {p.get('id')}")
        ids.add(p.get("id"))
        walk(p.get("panels", []))
        for t in p.get("targets", []):
            e = t.get("expr")
            if not e:
                errors.append(f"panel {p.get('title')!r} has a target without expr")
                continue
            e = (e.replace("$__rate_interval", "5m").replace("$__interval", "1m")
                  .replace("$__range", "1h").replace("$environment", "gprd").replace("$fqdn", ".*"))
            exprs.append(e)
walk(d.get("panels", []))
if not exprs:
    errors.append("no panel queries")
rules = {"groups": [{"name": "dashboard", "rules": [
    {"record": f"dashboard:expr_{i}", "expr": e} for i, e in enumerate(exprs)]}]}
json.dump(rules, open(out, "w"), indent=1)
for e in errors:
    print(f"{path}: {e}", file=sys.stderr)
sys.exit(1 if errors else 0)
PY
  promtool check rules "$exprs" >/dev/null || {
    promtool check rules "$exprs" >&2
    fail "$d: a panel query does not parse"
  }
  rm -f "$exprs"
done

# Metric names used by rules and dashboards must be ones the agent exports.
if [ -f docs/metrics.md ]; then
  while read -r metric; do
    base=$metric
    for suffix in _bucket _count _sum; do
      base=${base%"$suffix"}
    done
    grep -qF "\`$base\`" docs/metrics.md || fail "metric $metric is not listed in docs/metrics.md"
  done < <(cat "${rule_files[@]}" "${dashboards[@]}" |
    grep -oE '(^|[^:a-z_])(gitlab_haproxy_agent_[a-z_]+|process_[a-z_]+)' |
    sed -E 's/^[^a-z]//' | sort -u)
fi

# Alertmanager: the example configuration loads, and every alert of the rule
# files, with the labels its rule sets, is routed to the pager receiver if and
# only if it carries pager="pagerduty" (ruby's YAML parser reads the labels;
# Ruby is installed for the cookbook tests). Then a real Prometheus and
# Alertmanager deliver a page end to end.
am_config=alerts/alertmanager.example.yml
pager_receiver=gitlab-haproxy-agent-pagerduty
if amtool check-config "$am_config" >/dev/null; then
  routed=0
  for f in "${rule_files[@]}"; do
    while read -r name labels; do
      # shellcheck disable=SC2086 # one word per label=value pair
      got=$(amtool config routes test --config.file="$am_config" "alertname=$name" $labels 2>/dev/null) ||
        { fail "amtool config routes test failed for $name"; continue; }
      case " $labels " in
        *" pager=pagerduty "*) want=pages ;;
        *" pager="*) fail "$name: unknown pager label in: $labels"; continue ;;
        *) want=quiet ;;
      esac
      case ",$got," in
        *",$pager_receiver,"*) is=pages ;;
        *) is=quiet ;;
      esac
      [ "$want" = "$is" ] || fail "$name ($labels) reaches receivers '$got': expected it to be $want"
      case " $labels " in
        *" severity=s4 "*) slack=gitlab-haproxy-agent-slack-low ;;
        *" severity=s"[123]" "*) slack=gitlab-haproxy-agent-slack ;;
        *) fail "$name: no severity s1 to s4 in: $labels"; continue ;;
      esac
      case ",$got," in
        *",$slack,"*) ;;
        *) fail "$name ($labels) reaches receivers '$got': expected $slack among them" ;;
      esac
      routed=$((routed + 1))
    done < <(ruby -ryaml -e '
      (YAML.load_file(ARGV[0])["groups"] || []).each do |g|
        g["rules"].each do |r|
          next unless r["alert"]
          puts ([r["alert"]] + (r["labels"] || {}).map { |k, v| "#{k}=#{v}" }).join(" ")
        end
      end' "$f")
  done
  [ "$routed" -gt 0 ] || fail "no alert was routed through $am_config"
  echo "check-alerts: $routed alerts routed through $am_config"
else
  amtool check-config "$am_config" >&2
  fail "amtool check-config $am_config"
fi
scripts/alertmanager-e2e.sh || fail "Prometheus and Alertmanager did not deliver the page"

if [ "$failures" -gt 0 ]; then
  echo "check-alerts: $failures check(s) failed" >&2
  exit 1
fi
echo "check-alerts: OK"
