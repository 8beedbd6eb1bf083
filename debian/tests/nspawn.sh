#!/usr/bin/env bash
# The Debian package under a real systemd: boots a minimal Debian bookworm in
# systemd-nspawn, installs the .deb there and checks the unit's behaviour
# against a real Consul (ACLs on, default policy deny) started on free
# loopback ports:
#   - install creates the system user and an empty token file; the unit is
#     enabled; nothing starts while policy-rc.d forbids it;
#   - with Consul down the unit stays "activating" and restarts, never
#     "active"; it becomes active only after the first Consul sync;
#   - an empty credential means no token: with default deny Consul refuses
#     the prefix, and the unit never becomes active; the token from
#     LoadCredential= is then used, and the unit becomes active only after
#     its first sync;
#   - journald gets structured fields; the token is never logged;
#   - watchdog pings keep it alive; SIGKILL -> restarted; SIGSTOP -> the
#     watchdog restarts it;
#   - a start that fails fast (the agent-check port held by another process
#     for longer than the old start limit allowed) never locks the unit out:
#     once the port is free it becomes active by itself;
#   - reinstall and upgrade keep an edited /etc/default file and restart the
#     running unit; an upgrade leaves a stopped unit stopped and a masked
#     (frozen) one stopped and masked, which the cookbook's guard skips;
#     unmask and start thaw it; remove, install (with Consul unreachable), purge, install again
#     (settings written first, as the cookbook does) all succeed;
#   - the apt mirror (scripts/apt-repo.sh, served on loopback HTTP): a
#     repository signed with another key, or unsigned, is refused by
#     apt-get update; from the signed one apt-get installs the package with
#     signed-by, a version pin holds it, and apt-get upgrade takes the newer
#     version once it is published;
#   - a key rotation (runbook "Rotating the apt signing key"): a node that
#     installed from the old key takes the key file with both keys, then
#     upgrades from the mirror signed by the new key; a node with the old
#     key alone is refused; at the end the new key alone is enough.
#
# Usage: debian/tests/nspawn.sh        (as root)
#   DEB=path     test this .deb instead of building one with `cargo deb`
#   CACHE_DIR=   where the debootstrap tree is cached as a tarball
#                (default /var/cache/gitlab-haproxy-agent-test)
#   DEBOOTSTRAP_MIRROR=url   mirror for debootstrap (default: its own)
# Needs: systemd-container, debootstrap, consul, curl, jq, iproute2, aptly,
# gnupg (gpg, gpgv), python3, ruby.

# Functions are mostly called through check/wait_for (SC2317); '$' in single
# quotes is meant for dpkg-query, awk and inner shells (SC2016).
# shellcheck disable=SC2317,SC2016
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
pkg=gitlab-haproxy-agent
unit=$pkg.service
prefix=gitlab-haproxy-agent/state/
cache_dir=${CACHE_DIR:-/var/cache/gitlab-haproxy-agent-test}
# man-db and bash-completion: the package test reads the manual page and
# completes a command as an operator would. The tarball's name changes with
# the list of packages, so that a cache from another list is not used.
include=systemd,systemd-sysv,dbus,man-db,bash-completion
cache_tar=$cache_dir/bookworm-minbase-$(printf '%s' "$include" | sha256sum | cut -c1-8).tar

# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
finish() {
	tally
	[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
	exit $?
}
log() { echo "# $*"; }
not() { ! "$@"; }

# wait_for SECONDS command...: true as soon as the command succeeds.
wait_for() {
	local end=$((SECONDS + $1))
	shift
	while :; do
		"$@" && return 0
		[ "$SECONDS" -ge "$end" ] && return 1
		sleep 0.5
	done
}

if [ "$(id -u)" -ne 0 ]; then
	echo "nspawn.sh: run as root (systemd-nspawn, nsenter)" >&2
	exit 1
fi
for tool in systemd-nspawn debootstrap nsenter consul curl jq ss dpkg-deb flock aptly gpg gpgv gpgconf python3 ruby; do
	command -v "$tool" >/dev/null || {
		fail "tool '$tool' is missing (scripts/install-deps.sh installs it)"
		finish
	}
done

work=$(mktemp -d /var/tmp/$pkg-nspawn.XXXXXX)
if [ -z "$work" ] || [ ! -d "$work" ]; then
	echo "nspawn.sh: mktemp failed" >&2
	exit 1
fi
# Every path written below is under $root, the container's tree.
root=$work/root
nspawn_pid=
consul_pid=
http_pid=
holder_pid=
ct_pid=

cleanup() {
	local pid
	for pid in $nspawn_pid $consul_pid $http_pid $holder_pid; do
		kill -TERM "$pid" 2>/dev/null || continue
		for _ in $(seq 1 40); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.25
		done
		kill -KILL "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	done
	# gpg started an agent for each throwaway keyring; stop it by its socket.
	for home in "$work/gnupg" "$work/gnupg-other"; do
		[ -d "$home" ] && GNUPGHOME=$home gpgconf --kill gpg-agent 2>/dev/null
	done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the package ----------------------------------------------------------------
deb=${DEB:-}
if [ -z "$deb" ]; then
	start=$SECONDS
	if (cd "$repo" && cargo deb --output "$work/" >"$work/cargo-deb.log" 2>&1); then
		deb=$(find "$work" -maxdepth 1 -name "${pkg}_*.deb" | sed -n 1p)
		log "cargo deb built $(basename "$deb") in $((SECONDS - start)) s"
	else
		tail -n 30 "$work/cargo-deb.log"
		fail "cargo deb"
		finish
	fi
fi
[ -f "$deb" ] || {
	fail "no .deb at '$deb'"
	finish
}
# A newer version of the same package, to test a real upgrade.
version=$(dpkg-deb -f "$deb" Version)
newer_version=$version+1
dpkg-deb -R "$deb" "$work/repack"
sed -i "s/^Version: .*/Version: $newer_version/" "$work/repack/DEBIAN/control"
dpkg-deb -b --root-owner-group "$work/repack" "$work/newer.deb" >/dev/null
rm -rf "$work/repack"

# --- the Debian tree: debootstrap once, cached as a tarball ------------------------
mkdir -p "$cache_dir"
(
	flock -w 600 9 || exit 1
	[ -s "$cache_tar" ] && exit 0
	log "debootstrap bookworm into the cache (about 30 s, once)"
	tmp=$(mktemp -d "$cache_dir/tree.XXXXXX")
	chmod 755 "$tmp" # the tree's / (mktemp makes it 0700)
	# shellcheck disable=SC2086 # the mirror is an optional extra argument
	if timeout 600 debootstrap --variant=minbase --include="$include" \
		bookworm "$tmp" ${DEBOOTSTRAP_MIRROR:-} >"$work/debootstrap.log" 2>&1 &&
		tar -C "$tmp" -cf "$cache_tar.new" . && mv "$cache_tar.new" "$cache_tar"; then
		rm -rf "$tmp"
	else
		tail -n 20 "$work/debootstrap.log"
		rm -rf "$tmp" "$cache_tar.new"
		exit 1
	fi
) 9>"$cache_dir/.lock" || {
	fail "debootstrap of the bookworm tree"
	finish
}
mkdir -p "$root"
tar -C "$root" -xf "$cache_tar" || {
	fail "unpack $cache_tar"
	finish
}
chmod 755 "$root" # services running as other users must reach /

# --- free loopback ports ----------------------------------------------------------
# Below the kernel's ephemeral range (no outgoing connection can take one
# before it is bound), not in use now, and each handed out once: pick_port
# sets the named variable in this shell so `taken` keeps every pick.
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
consul_http='' consul_dns='' consul_serf_lan='' consul_serf_wan='' consul_server=''
consul_grpc='' agent_port='' http_port='' dead_port='' apt_port=''
for var in consul_http consul_dns consul_serf_lan consul_serf_wan consul_server consul_grpc \
	agent_port http_port dead_port apt_port; do
	pick_port "$var" || { echo "no free port" >&2; exit 1; }
done
log "ports: consul http $consul_http, agent $agent_port, agent http $http_port, apt mirror $apt_port"

# --- the apt mirror: signed, signed with another key, unsigned ----------------------
# Throwaway keys; the repositories are served from $work/www on loopback.
# Each starts with the current version only; the newer one is published
# later, as a release would be.
new_key() { # new_key GNUPGHOME: prints the fingerprint of a new signing key (the last made)
	install -d -m 0700 "$1"
	GNUPGHOME=$1 gpg --batch --yes --passphrase '' --quick-gen-key \
		"gitlab-haproxy-agent test <apt@example.invalid>" ed25519 sign never 2>/dev/null &&
		GNUPGHOME=$1 gpg --batch --with-colons --list-secret-keys |
		awk -F: '$1 == "sec" { p = 1; next } $1 == "fpr" && p { f = $10; p = 0 } END { print f }'
}
publish() { # publish GNUPGHOME KEY OUT_DIR DEB_DIR [OVERLAP_KEY]: scripts/apt-repo.sh, output in the log
	GNUPGHOME=$1 APT_REPO_KEY=$2 APT_REPO_DEBS=$4 APT_REPO_OVERLAP_KEY=${5:-} \
		"$repo/scripts/apt-repo.sh" "$3" >>"$work/apt-repo.log" 2>&1 || {
		tail -n 20 "$work/apt-repo.log"
		return 1
	}
}
mkdir -p "$work/debs-1" "$work/debs-2" "$work/www"
cp "$deb" "$work/debs-1/"
cp "$work/newer.deb" "$work/debs-2/${pkg}_${newer_version}_$(dpkg-deb -f "$deb" Architecture).deb"
apt_key=$(new_key "$work/gnupg")
other_key=$(new_key "$work/gnupg-other")
if [ -n "$apt_key" ] && [ -n "$other_key" ] &&
	publish "$work/gnupg" "$apt_key" "$work/www/signed" "$work/debs-1" &&
	publish "$work/gnupg-other" "$other_key" "$work/www/other-key" "$work/debs-1" &&
	cp -a "$work/www/signed" "$work/www/unsigned" &&
	rm "$work/www/unsigned/dists/bookworm/InRelease" "$work/www/unsigned/dists/bookworm/Release.gpg"; then
	log "apt repositories built, signed by $apt_key (and $other_key)"
else
	fail "scripts/apt-repo.sh builds the test repositories"
	finish
fi
python3 -m http.server --bind 127.0.0.1 --directory "$work/www" "$apt_port" \
	</dev/null >"$work/http.log" 2>&1 &
http_pid=$!
mirror=http://127.0.0.1:$apt_port

# --- boot the container -------------------------------------------------------------
# The package must not start the unit on the first install: the test writes
# its ports into /etc/default first (as an operator or Chef would).
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
cp "$deb" "$root/root/package.deb"
cp "$work/newer.deb" "$root/root/newer.deb"
# The mirror's public key where a node keeps it (`signed-by=`; readable by _apt).
install -d -m 0755 "$root/etc/apt/keyrings"
install -m 0644 "$work/www/signed/release.asc" "$root/etc/apt/keyrings/$pkg.asc"

systemd-nspawn --register=no --keep-unit -q --console=read-only -D "$root" -b \
	</dev/null >"$work/console.log" 2>&1 &
nspawn_pid=$!
# The container's PID 1: the `systemd` child of systemd-nspawn (an
# intermediate child comes and goes first).
find_init() { ct_pid=$(pgrep -P "$nspawn_pid" -x systemd | sed -n 1p) && [ -n "$ct_pid" ]; }
if ! wait_for 30 find_init; then
	tail -n 20 "$work/console.log"
	fail "container PID 1 found"
	finish
fi

# in_ct command...: run a command inside the container (bounded in time).
in_ct() {
	timeout 120 nsenter -t "$ct_pid" -m -u -i -n -p -- \
		env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive \
		SYSTEMD_PAGER=cat "$@"
}
booted() {
	local s
	s=$(in_ct systemctl is-system-running 2>/dev/null)
	[ "$s" = running ] || [ "$s" = degraded ]
}
start=$SECONDS
if wait_for 60 booted; then
	pass "systemd booted in the container in $((SECONDS - start)) s ($(in_ct systemctl --version | sed -n 1p))"
else
	tail -n 20 "$work/console.log"
	fail "systemd booted in the container"
	finish
fi

prop() { in_ct systemctl show -p "$1" --value "$unit" 2>/dev/null; }
state() { prop ActiveState; }
is_active() { [ "$(state)" = active ]; }
main_pid() { prop MainPID; }
restarts() { prop NRestarts; }
http_code() { curl -s -o /dev/null -m 3 -w '%{http_code}' "http://127.0.0.1:$http_port$1"; }
# agent_answer LINE: the reply to one agent-send line, without its LF.
agent_answer() {
	timeout 5 bash -c '
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		printf "%s\n" "$2" >&3
		IFS= read -r -t 3 line <&3
		printf "%s" "$line"' _ "$agent_port" "$1" 2>/dev/null
}
answer_is() { [ "$(agent_answer "$1")" = "$2" ]; }
dpkg_ct() { # dpkg_ct args...: dpkg in the container, output in the log
	in_ct dpkg "$@" >"$work/dpkg.log" 2>&1 || {
		tail -n 20 "$work/dpkg.log"
		return 1
	}
}
installed() { in_ct dpkg-query -W -f='${Status} ${Version}' "$pkg" 2>/dev/null; }
installed_is() { [ "$(installed)" = "install ok installed $1" ]; }
# restarted_since PID: a new main process, and the unit active.
restarted_since() { [ "$(main_pid)" != "$1" ] && is_active; }
environ_has() { in_ct cat "/proc/$1/environ" | tr '\0' '\n' | grep "^$2=" >/dev/null; }
as_user() { in_ct setpriv --reuid="$uid" --regid="$uid" --clear-groups "$@" 2>/dev/null; }
shell_of() { in_ct getent passwd "$1" | cut -d: -f7; }
metric_present() { curl -s -m 3 "http://127.0.0.1:$http_port/metrics" | grep "^$1 " >/dev/null; }
journal_has() { in_ct journalctl -u "$unit" --no-pager | grep -- "$1" >/dev/null; }
journal_verbose_has() { in_ct journalctl -u "$unit" --no-pager -o verbose | grep -F -- "$1" >/dev/null; }
sha() { in_ct sha256sum "$1" 2>/dev/null | cut -d' ' -f1; }
dump_unit() {
	in_ct systemctl status --no-pager -n 0 "$unit" | sed -n '1,12p'
	in_ct journalctl -u "$unit" --no-pager -n 20 -o short-monotonic
}

# --- install --------------------------------------------------------------------------
check "install: dpkg -i succeeds" dpkg_ct -i /root/package.deb
check "install: package is installed ($(installed))" installed_is "$version"
uid=$(in_ct id -u "$pkg" 2>/dev/null)
check "install: system user $pkg exists (uid ${uid:-none})" test -n "$uid"
check "install: it is a system uid (< 1000)" test "${uid:-1000}" -lt 1000
check "install: its shell is nologin" test "$(shell_of "$pkg")" = /usr/sbin/nologin
check "install: empty token file, root 0600" \
	test "$(in_ct stat -c '%U %a %s' /etc/$pkg/consul-token)" = "root 600 0"
check "install: token folder root 0700" test "$(in_ct stat -c '%U %a' /etc/$pkg)" = "root 700"
check "install: unit enabled" test "$(in_ct systemctl is-enabled "$unit")" = enabled
check "install: unit not started while policy-rc.d forbids it" test "$(state)" = inactive

# The operator's edits: this test's ports, appended to the packaged file.
cat >>"$root/etc/default/$pkg" <<EOF

# Set for this machine.
GITLAB_HAPROXY_AGENT_CONSUL_ADDR=http://127.0.0.1:$consul_http
GITLAB_HAPROXY_AGENT_LISTEN=127.0.0.1:$agent_port
GITLAB_HAPROXY_AGENT_HTTP_LISTEN=127.0.0.1:$http_port
EOF
edited_sha=$(sha /etc/default/$pkg)
rm -f "$root/usr/sbin/policy-rc.d"

# --- Consul down: activating, restarting, never active ----------------------------------
in_ct systemctl start --no-block "$unit"
seen=" "
start=$SECONDS
while [ $((SECONDS - start)) -lt 20 ]; do
	s=$(state)/$(prop SubState)
	case $seen in *" $s "*) ;; *) seen="$seen$s " ;; esac
	sleep 0.5
done
log "states seen with Consul down:$seen"
check "Consul down: never active in 20 s" not grep -q ' active/' <<<"$seen"
check "Consul down: activating" grep -q ' activating/' <<<"$seen"
check "Consul down: restarted by systemd (NRestarts=$(restarts))" test "$(restarts)" -ge 1
check "Consul down: /-/ready is not 200" test "$(http_code /-/ready)" != 200

# --- Consul with ACLs: default deny, a read token on the prefix ------------------------
uuid() { cat /proc/sys/kernel/random/uuid; }
master=$(uuid)
token=$(uuid)
cat >"$work/acl.json" <<EOF
{"acl": {"enabled": true, "default_policy": "deny", "down_policy": "extend-cache",
         "tokens": {"master": "$master", "agent": "$master"}}}
EOF
consul agent -dev -bind 127.0.0.1 -client 127.0.0.1 -http-port "$consul_http" \
	-dns-port "$consul_dns" -serf-lan-port "$consul_serf_lan" -serf-wan-port "$consul_serf_wan" \
	-server-port "$consul_server" -grpc-port "$consul_grpc" -config-file "$work/acl.json" \
	</dev/null >"$work/consul.log" 2>&1 &
consul_pid=$!
capi() { # capi METHOD PATH [BODY]: Consul API call with the master token
	curl -sf -m 5 -X "$1" -H "X-Consul-Token: $master" "http://127.0.0.1:$consul_http$2" ${3:+--data "$3"}
}
has_leader() { [[ "$(curl -s -m 2 "http://127.0.0.1:$consul_http/v1/status/leader")" == *:* ]]; }
make_policy() {
	capi PUT /v1/acl/policy "{\"Name\": \"$pkg-read\",
		\"Rules\": \"key_prefix \\\"$prefix\\\" { policy = \\\"read\\\" }\"}" >/dev/null
}
if wait_for 30 has_leader && wait_for 30 make_policy &&
	capi PUT /v1/acl/token "{\"SecretID\": \"$token\", \"Policies\": [{\"Name\": \"$pkg-read\"}]}" >/dev/null &&
	[ "$(capi PUT "/v1/kv/${prefix}web/web-01" drain)" = true ]; then
	pass "Consul up with ACLs (default deny), read token on $prefix, ${prefix}web/web-01=drain"
else
	tail -n 20 "$work/consul.log"
	fail "Consul with ACLs"
fi
# What the agent reads with no token: the denied keys are filtered out, so the
# prefix answers 404 like an empty one; a plain read of a key below the
# prefix is refused (403), which is how the agent tells the two apart.
check "Consul hides the prefix without a token (404)" \
	test "$(curl -s -o /dev/null -w '%{http_code}' -m 3 "http://127.0.0.1:$consul_http/v1/kv/$prefix?recurse")" = 404
check "Consul refuses a plain read of a key below the prefix without a token (403)" \
	test "$(curl -s -o /dev/null -w '%{http_code}' -m 3 "http://127.0.0.1:$consul_http/v1/kv/${prefix}~read-check")" = 403

# --- empty credential = no token: refused, never synced, never active -------------------
status_says_403() { [[ "$(prop StatusText)" == *403* ]]; }
check "no token: Consul's 403 shows in the unit status" wait_for 30 status_says_403
seen=" "
start=$SECONDS
while [ $((SECONDS - start)) -lt 15 ]; do
	s=$(state)/$(prop SubState)
	case $seen in *" $s "*) ;; *) seen="$seen$s " ;; esac
	sleep 0.5
done
log "states seen with no token:$seen"
check "no token: never active in 15 s (the denied prefix is not taken for an empty one)" \
	not grep -q ' active/' <<<"$seen"
check "no token: /-/ready is not 200" test "$(http_code /-/ready)" != 200
check "no token: no answer to HAProxy (not ready 100%)" not answer_is web/web-01 "ready 100%"

# --- the token through LoadCredential=: first sync, then active ------------------------------
printf '%s\n' "$token" >"$root/etc/$pkg/consul-token"
in_ct systemctl restart --no-block "$unit"
start=$SECONDS
if wait_for 60 is_active; then
	pass "with the token: unit active $((SECONDS - start)) s later"
	check "active means synced: /-/ready is 200" test "$(http_code /-/ready)" = 200
else
	fail "with the token: unit active within 60 s (is READY=1 sent after the first sync?)"
	dump_unit
fi
check "token used: web/web-01 answers 'drain 100%'" wait_for 10 answer_is web/web-01 "drain 100%"
pid=$(main_pid)
check "process runs as $pkg" \
	test "$(in_ct awk '/^Uid:/ { print $2 }' "/proc/$pid/status")" = "$uid"
check "process has \$CREDENTIALS_DIRECTORY" environ_has "$pid" CREDENTIALS_DIRECTORY
check "user $pkg cannot read the token file itself" not as_user cat "/etc/$pkg/consul-token"
check "metrics served under the hardened unit (process_start_time_seconds)" \
	metric_present process_start_time_seconds

# --- journald -------------------------------------------------------------------------
# The first answer is logged as one summary line; a change after it gets a
# line of its own, with the key's fields.
capi PUT "/v1/kv/${prefix}web/web-02" maint >/dev/null
check "a change after the first answer: web/web-02 answers 'maint 100%'" wait_for 10 answer_is web/web-02 "maint 100%"
in_ct journalctl -u "$unit" -o json --no-pager >"$work/journal.json" 2>/dev/null
own=$(jq -c --arg u "$unit" 'select(._SYSTEMD_UNIT == $u and ._PID != "1")' "$work/journal.json")
structured=$(jq -c 'select(._TRANSPORT == "journal")
	| [keys[] | select(startswith("_") | not)
	  | select(IN("MESSAGE", "PRIORITY", "SYSLOG_IDENTIFIER", "SYSLOG_FACILITY", "SYSLOG_PID", "SYSLOG_TIMESTAMP") | not)]
	| select(length > 0)' <<<"$own" | sed -n 1p)
log "agent journal entries: $(grep -c . <<<"$own"), transports: $(jq -r '._TRANSPORT' <<<"$own" | sort | uniq -c | tr -s ' \n' ' ')"
if [ -n "$structured" ]; then
	pass "journalctl -o json: structured fields from the agent $structured"
else
	fail "journalctl -o json: no entry from the agent with fields of its own (native journald logging?)"
	jq -c '{MESSAGE, _TRANSPORT}' <<<"$own" | sed -n '1,3p'
fi
applied=$(jq -c 'select(.KEY != null and .VALUE != null and .CONSUL_INDEX != null)
	| {MESSAGE, KEY, VALUE, CONSUL_INDEX}' <<<"$own" | sed -n 1p)
if [ -n "$applied" ]; then
	pass "journal: a state change carries KEY, VALUE and CONSUL_INDEX $applied"
else
	fail "journal: no state change with KEY, VALUE and CONSUL_INDEX fields"
fi
check "the token is never logged" not grep -q "$token" "$work/journal.json"

# --- watchdog pings keep it alive -----------------------------------------------------------
watchdog_usec=$(prop WatchdogUSec)
pid=$(main_pid)
n=$(restarts)
ping1=$(prop WatchdogTimestampMonotonic)
sleep 25
ping2=$(prop WatchdogTimestampMonotonic)
log "WatchdogUSec=$watchdog_usec, last ping at ${ping1}us then ${ping2}us (monotonic)"
check "watchdog: pings received (WatchdogTimestamp advances)" test "${ping2:-0}" -gt "${ping1:-0}"
check "watchdog: same process, no restart over 25 s" \
	test "$(main_pid)/$(restarts)/$(state)" = "$pid/$n/active"

# --- SIGKILL -> restarted ---------------------------------------------------------------------
pid=$(main_pid)
n=$(restarts)
in_ct systemctl kill -s KILL "$unit"
restarted() { [ "$(restarts)" -gt "$n" ] && is_active && [ "$(main_pid)" != "$pid" ]; }
start=$SECONDS
if wait_for 60 restarted; then
	pass "systemctl kill -s KILL: restarted and active in $((SECONDS - start)) s"
else
	fail "systemctl kill -s KILL: restarted and active within 60 s"
	dump_unit
fi

# --- SIGSTOP -> the watchdog restarts it --------------------------------------------------------
pid=$(main_pid)
n=$(restarts)
start=$SECONDS
# Only a real main PID: `kill -STOP 0` would stop this test's own group.
if [ "${pid:-0}" -le 1 ]; then
	fail "SIGSTOP: the unit has no main process to stop (MainPID=${pid:-none})"
	dump_unit
elif in_ct sh -c 'kill -STOP "$1"' _ "$pid" && wait_for 90 restarted; then
	pass "SIGSTOP: watchdog restarted it, active in $((SECONDS - start)) s"
else
	fail "SIGSTOP: watchdog restart within 90 s"
	dump_unit
fi
check "SIGSTOP: systemd logged the watchdog timeout" journal_has 'Watchdog timeout'

# --- a start that fails fast: no start-limit lockout ----------------------------------------------
# Another process holds the agent-check port, so every start fails at once
# and systemd retries every RestartSec (5 s). Under a start limit of 10
# starts in 60 s the unit gave up at the 11th start, about a minute in
# ("Start request repeated too quickly"), and stayed failed once the port
# was free. The port is held until systemd has retried 11 times in a row
# (about 60 s; at most 90 s), then freed: the unit must become active by
# itself.
retries=11
port_held() { [ -n "$(ss -Hltn "sport = :$agent_port")" ]; }
# reset-failed also restarts systemd's start-rate window (a fixed window from
# the first start in it), so a start limit would count from the start below.
in_ct systemctl stop "$unit"
in_ct systemctl reset-failed "$unit"
timeout 120 python3 -c 'import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT, as the agent binds
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
time.sleep(float(sys.argv[2]))' "$agent_port" 110 </dev/null >"$work/holder.log" 2>&1 &
holder_pid=$!
if wait_for 5 port_held; then
	# A manual start resets NRestarts: it counts the retries below.
	in_ct systemctl start --no-block "$unit"
	seen=" "
	start=$SECONDS
	while [ $((SECONDS - start)) -lt 90 ] && [ "$(restarts)" -lt "$retries" ]; do
		s=$(state)/$(prop SubState)
		case $seen in *" $s "*) ;; *) seen="$seen$s " ;; esac
		[ "${s%%/*}" = failed ] && break
		sleep 0.5
	done
	held=$((SECONDS - start))
	log "states seen with the port held for $held s:$seen (NRestarts=$(restarts)," \
		"Result=$(prop Result))"
	check "port held: never active" not grep -q ' active/' <<<"$seen"
	check "port held: the start fails at once (ERROR=cannot bind the agent-check listener)" \
		journal_verbose_has 'ERROR=cannot bind the agent-check listener'
	check "port held: systemd kept retrying ($(restarts) restarts in $held s, $retries wanted)" \
		test "$(restarts)" -ge "$retries"
	check "port held: no start-limit lockout (never failed; Result=$(prop Result))" \
		not grep -q ' failed/' <<<"$seen"
	kill -TERM "$holder_pid" 2>/dev/null
	wait "$holder_pid" 2>/dev/null
	holder_pid=
	start=$SECONDS
	if wait_for 20 is_active; then
		pass "port freed: active by itself $((SECONDS - start)) s later (no systemctl)"
	else
		fail "port freed: active by itself within 20 s (no systemctl)"
		dump_unit
		# What follows needs a running unit.
		in_ct systemctl reset-failed "$unit"
		in_ct systemctl start --no-block "$unit"
		wait_for 30 is_active
	fi
	check "no 'Start request repeated too quickly' in the journal" \
		not journal_has 'Start request repeated too quickly'
	check "port freed: answering 'drain 100%'" wait_for 10 answer_is web/web-01 "drain 100%"
else
	fail "a listener holds 127.0.0.1:$agent_port"
	cat "$work/holder.log"
	in_ct systemctl start --no-block "$unit"
	wait_for 30 is_active
fi

# --- reinstall and upgrade keep /etc/default and restart ------------------------------------------
for step in "reinstall:/root/package.deb:$version" "upgrade:/root/newer.deb:$newer_version"; do
	IFS=: read -r what file want <<<"$step"
	pid=$(main_pid)
	check "$what: dpkg -i succeeds" dpkg_ct -i "$file"
	check "$what: version $want installed" installed_is "$want"
	check "$what: edited /etc/default/$pkg kept" test "$(sha /etc/default/$pkg)" = "$edited_sha"
	check "$what: no .dpkg-dist/.dpkg-new left" \
		not compgen -G "$root/etc/default/$pkg.dpkg-*"
	check "$what: token file kept" test "$(cat "$root/etc/$pkg/consul-token")" = "$token"
	check "$what: unit restarted and active" wait_for 60 restarted_since "$pid"
	check "$what: still answering 'drain 100%'" wait_for 10 answer_is web/web-01 "drain 100%"
done

# --- a stopped or frozen agent stays stopped ----------------------------------------------------
# Upgrades use try-restart; the runbook's freeze is `systemctl mask --now`,
# its thaw `systemctl unmask` + `systemctl start`; the cookbook's guard
# (GitlabHaproxyAgent::Service::MASKED) skips a masked unit.
masked_guard=$(ruby -e 'require ARGV[0]; print GitlabHaproxyAgent::Service::MASKED' \
	"$repo/cookbook/gitlab-haproxy-agent/libraries/service.rb")
cookbook_skips() { in_ct sh -c "$masked_guard"; }
inactive_no_pid() { [ "$(state)" = inactive ] && [ "$(main_pid)" = 0 ]; }
in_ct systemctl stop "$unit"
check "stopped: inactive" inactive_no_pid
check "stopped, upgrade: dpkg -i succeeds" dpkg_ct -i /root/newer.deb
sleep 2
check "stopped, upgrade: still inactive, no process ($(state), MainPID $(main_pid))" inactive_no_pid
check "stopped: the cookbook would start it (not masked)" not cookbook_skips
in_ct systemctl start --no-block "$unit"
check "started again: active" wait_for 60 is_active
check "freeze: systemctl mask --now succeeds" in_ct systemctl mask --now "$unit"
check "freeze: inactive" inactive_no_pid
check "frozen: the cookbook's guard skips the unit" cookbook_skips
check "frozen, upgrade: dpkg -i succeeds" dpkg_ct -i /root/newer.deb
sleep 2
check "frozen, upgrade: still inactive ($(state), MainPID $(main_pid))" inactive_no_pid
check "frozen, upgrade: still masked ($(prop UnitFileState))" test "$(prop UnitFileState)" = masked
check "frozen: systemctl start is refused" not in_ct systemctl start "$unit"
check "thaw: systemctl unmask succeeds" in_ct systemctl unmask "$unit"
check "thaw: enabled again ($(in_ct systemctl is-enabled "$unit"))" \
	test "$(in_ct systemctl is-enabled "$unit")" = enabled
in_ct systemctl start --no-block "$unit"
check "thaw: active after systemctl start" wait_for 60 is_active
check "thaw: answering 'drain 100%'" wait_for 10 answer_is web/web-01 "drain 100%"
pid=$(main_pid)
check "running, upgrade: dpkg -i succeeds" dpkg_ct -i /root/newer.deb
check "running, upgrade: restarted (try-restart) and active" wait_for 60 restarted_since "$pid"

# --- remove, install, purge, install again ---------------------------------------------------------
check "remove: dpkg -r succeeds" dpkg_ct -r "$pkg"
check "remove: unit stopped" not is_active
check "remove: binary gone" test ! -e "$root/usr/bin/$pkg"
check "remove: /etc/default/$pkg kept" test "$(sha /etc/default/$pkg)" = "$edited_sha"
# Installing while Consul is unreachable (a machine being built) must neither
# fail nor hang: the kept settings, pointed at a port where nothing listens.
sed -i "s|^GITLAB_HAPROXY_AGENT_CONSUL_ADDR=.*|GITLAB_HAPROXY_AGENT_CONSUL_ADDR=http://127.0.0.1:$dead_port|" \
	"$root/etc/default/$pkg"
start=$SECONDS
check "install after remove, Consul unreachable: dpkg -i succeeds" dpkg_ct -i /root/newer.deb
took=$((SECONDS - start))
check "install after remove, Consul unreachable: dpkg -i took ${took} s (< 60 s)" test "$took" -lt 60
check "install after remove, Consul unreachable: unit not active" not is_active
sed -i "s|^GITLAB_HAPROXY_AGENT_CONSUL_ADDR=.*|GITLAB_HAPROXY_AGENT_CONSUL_ADDR=http://127.0.0.1:$consul_http|" \
	"$root/etc/default/$pkg"
check "install after remove: settings restored" test "$(sha /etc/default/$pkg)" = "$edited_sha"
in_ct systemctl restart --no-block "$unit"
check "install after remove: active once Consul is reachable" wait_for 60 is_active
check "install after remove: answering 'drain 100%'" wait_for 10 answer_is web/web-01 "drain 100%"
check "the served state is written under the hardened unit (/var/lib/$pkg/served-state.json)" \
	test -s "$root/var/lib/$pkg/served-state.json"
check "purge: dpkg -P succeeds" dpkg_ct -P "$pkg"
check "purge: package gone" test -z "$(in_ct dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)"
check "purge: /etc/default/$pkg removed" test ! -e "$root/etc/default/$pkg"
check "purge: /etc/$pkg removed" test ! -e "$root/etc/$pkg"
check "purge: the served state (/var/lib/$pkg) removed" test ! -e "$root/var/lib/$pkg"
check "purge: unit file gone" test ! -e "$root/usr/lib/systemd/system/$unit"
check "purge: no enablement symlink left" \
	test -z "$(find "$root/etc/systemd/system" -name "$unit")"
# --- the apt mirror ---------------------------------------------------------------------------------
# The source line the cookbook's apt_repository renders; only this source is
# read by apt-get update (the container has no other mirror to reach).
sources=/etc/apt/sources.list.d/$pkg.list
use_repo() { # use_repo NAME: the node's source points at $mirror/NAME
	printf 'deb [signed-by=/etc/apt/keyrings/%s.asc] %s/%s bookworm main\n' "$pkg" "$mirror" "$1" \
		>"$root$sources"
}
apt_update() { # output in $work/apt-update.log
	# The lists fetched before are dropped: the mirror's files may change
	# within the second of the last fetch, and python's http.server answers
	# If-Modified-Since by whole seconds (304, the old index kept).
	rm -f "$root"/var/lib/apt/lists/127.0.0.1*
	in_ct apt-get update -o Dir::Etc::SourceList="$sources" -o Dir::Etc::SourceParts=/dev/null \
		-o APT::Get::List-Cleanup=0 >"$work/apt-update.log" 2>&1
}
update_log_has() { grep -F -- "$1" "$work/apt-update.log" >/dev/null; }
update_errors() { grep -E '^(E|W): ' "$work/apt-update.log" | tr '\n' ' '; }
candidate() { in_ct apt-cache policy "$pkg" 2>/dev/null | awk '$1 == "Candidate:" { print $2 }'; }
no_candidate() { local c; c=$(candidate); [ -z "$c" ] || [ "$c" = "(none)" ]; }
apt_get() { # apt_get ARGS...: keeps a conffile already on disk, as Chef's apt_package does
	in_ct apt-get -y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
		"$@" >"$work/apt.log" 2>&1 || {
		tail -n 20 "$work/apt.log"
		return 1
	}
}
check "mirror: served on $mirror" \
	test "$(curl -s -o /dev/null -m 3 -w '%{http_code}' "$mirror/signed/dists/bookworm/InRelease")" = 200
use_repo other-key
if apt_update; then
	fail "mirror signed with another key: apt-get update refuses it"
	cat "$work/apt-update.log"
else
	log "apt-get update: $(update_errors)"
	check "mirror signed with another key: apt-get update fails with NO_PUBKEY ${other_key: -16}" \
		update_log_has "NO_PUBKEY ${other_key: -16}"
	check "mirror signed with another key: 'is not signed'" update_log_has "is not signed"
	check "mirror signed with another key: nothing to install" no_candidate
fi
use_repo unsigned
if apt_update; then
	fail "unsigned mirror: apt-get update refuses it"
	cat "$work/apt-update.log"
else
	log "apt-get update: $(update_errors)"
	check "unsigned mirror: apt-get update fails ('is not signed')" update_log_has "is not signed"
	check "unsigned mirror: nothing to install" no_candidate
fi
use_repo signed
check "signed mirror: apt-get update succeeds" apt_update || cat "$work/apt-update.log"
check "signed mirror: candidate $version" test "$(candidate)" = "$version"

# Install again the way the cookbook does it: settings and token written
# first, then the package installed by apt-get from the mirror, told to keep
# a conffile already on disk; the first start uses them.
cat >"$root/etc/default/$pkg" <<EOF
# Written before the package, by configuration management.
GITLAB_HAPROXY_AGENT_CONSUL_ADDR=http://127.0.0.1:$consul_http
GITLAB_HAPROXY_AGENT_LISTEN=127.0.0.1:$agent_port
GITLAB_HAPROXY_AGENT_HTTP_LISTEN=127.0.0.1:$http_port
EOF
install -d -m 0700 "$root/etc/$pkg"
install -m 0600 /dev/null "$root/etc/$pkg/consul-token"
printf '%s\n' "$token" >"$root/etc/$pkg/consul-token"
preset_sha=$(sha /etc/default/$pkg)
check "install after purge, settings written first: apt-get install $pkg from the mirror" \
	apt_get install "$pkg"
check "install after purge: version $version installed" installed_is "$version"
# The manual page and the bash completion where man and bash-completion
# look for them (bash-completion loads a command's file on first use).
man_path=$(in_ct man -w "$pkg" 2>/dev/null)
check "man -w $pkg finds its page (${man_path:-none})" \
	test "$man_path" = "/usr/share/man/man1/$pkg.1.gz"
drain_page_renders() { in_ct man -P cat "$pkg-state-drain" 2>/dev/null | grep -q -- --until-idle; }
check "man $pkg-state-drain renders the drain command's page" drain_page_renders
completion=$(in_ct bash -c '
	source /usr/share/bash-completion/bash_completion
	_completion_loader gitlab-haproxy-agent
	COMP_WORDS=(gitlab-haproxy-agent state dr); COMP_CWORD=2
	fn=$(complete -p gitlab-haproxy-agent | sed -n "s/.* -F \([^ ]*\) .*/\1/p")
	"$fn" gitlab-haproxy-agent dr state
	echo "${COMPREPLY[*]}"' 2>&1)
check "bash completes '$pkg state dr' to 'drain' (${completion:-nothing})" test "$completion" = drain
check "install after purge: user reused (uid $uid)" test "$(in_ct id -u "$pkg")" = "$uid"
check "install after purge: the settings written first are kept" \
	test "$(sha /etc/default/$pkg)" = "$preset_sha"
check "install after purge: the token written first is kept" \
	test "$(cat "$root/etc/$pkg/consul-token")" = "$token"
check "install after purge: active on its first start" wait_for 60 is_active
check "install after purge: answering 'drain 100%'" wait_for 10 answer_is web/web-01 "drain 100%"

# A key rotation, as the runbook's "Rotating the apt signing key" does it:
# the new key joins the same keyring under the same user ID; the mirror,
# still signed by the old key, publishes both public keys; the node takes
# the key file (as Chef would); then the release is signed by the new key.
keyring=/etc/apt/keyrings/$pkg.asc
key_count() { gpg --batch --with-colons --show-keys "$root$keyring" 2>/dev/null | grep -c '^pub:'; }
signed_by() { # signed_by FPR: the mirror's InRelease verifies with FPR's public key alone
	GNUPGHOME=$work/gnupg gpg --batch --export "$1" >"$work/one-key.gpg" &&
		gpgv --status-fd 1 --keyring "$work/one-key.gpg" "$work/www/signed/dists/bookworm/InRelease" \
			2>/dev/null | grep "VALIDSIG $1 " >/dev/null
}
next_key=$(new_key "$work/gnupg")
check "rotation: a new key $next_key beside the old one, same user ID" \
	test -n "$next_key" -a "$next_key" != "$apt_key"
check "rotation: the mirror, signed by the old key, publishes both public keys" \
	publish "$work/gnupg" "$apt_key" "$work/www/signed" "$work/debs-1" "$next_key"
install -m 0644 "$work/www/signed/release.asc" "$root$keyring"
check "rotation: the node's key file holds both keys ($(key_count))" test "$(key_count)" -eq 2
check "rotation: apt-get update succeeds with both keys" apt_update || cat "$work/apt-update.log"

# A release: the newer version joins the mirror, the current one stays,
# signed by the new key (the old one stays in release.asc for the overlap).
check "publish: scripts/apt-repo.sh adds $newer_version to the mirror, signed by the new key" \
	publish "$work/gnupg" "$next_key" "$work/www/signed" "$work/debs-2" "$apt_key"
check "publish: it says 'signed by $next_key'" \
	grep -q "signed by $next_key" "$work/apt-repo.log"
check "publish: InRelease verifies with the new key alone" signed_by "$next_key"
check "publish: not with the old key" not signed_by "$apt_key"
# A node that never took the new key cannot read the mirror any more: the
# overlap is what keeps the fleet updating.
GNUPGHOME=$work/gnupg gpg --batch --armor --export "$apt_key" >"$work/old-only.asc"
install -m 0644 "$work/old-only.asc" "$root$keyring"
if apt_update; then
	fail "rotation: a node with the old key only refuses the new signature"
else
	check "rotation: a node with the old key only refuses the new signature (NO_PUBKEY ${next_key: -16})" \
		update_log_has "NO_PUBKEY ${next_key: -16}"
fi
install -m 0644 "$work/www/signed/release.asc" "$root$keyring"
# A rebuilt .deb under a version already published is refused, nothing changed.
dpkg-deb -R "$deb" "$work/rebuilt"
printf '\n' >>"$work/rebuilt/usr/share/doc/$pkg/copyright"
mkdir -p "$work/debs-3"
dpkg-deb -b --root-owner-group "$work/rebuilt" "$work/debs-3/$(basename "$deb")" >/dev/null
rm -rf "$work/rebuilt"
in_release=$(sha256sum <"$work/www/signed/dists/bookworm/InRelease")
GNUPGHOME=$work/gnupg APT_REPO_KEY=$apt_key APT_REPO_DEBS=$work/debs-3 \
	"$repo/scripts/apt-repo.sh" "$work/www/signed" >"$work/apt-repo-conflict.log" 2>&1
rc=$?
check "publish: another .deb as $version is refused (exit $rc, 'conflict in package')" \
	test "$rc" -ne 0 -a -n "$(grep 'conflict in package' "$work/apt-repo-conflict.log")"
check "publish: the refused .deb left the mirror unchanged" \
	test "$(sha256sum <"$work/www/signed/dists/bookworm/InRelease")" = "$in_release"
check "publish: apt-get update succeeds" apt_update || cat "$work/apt-update.log"
versions=$(in_ct apt-cache madison "$pkg" | awk -F'|' '{ gsub(/ /, "", $2); print $2 }' | sort | tr '\n' ' ')
check "publish: the mirror offers both versions ($versions)" \
	test "$versions" = "$(printf '%s\n' "$version" "$newer_version" | sort | tr '\n' ' ')"
# The cookbook's version pin (apt_preference): apt-get upgrade keeps it.
printf 'Package: %s\nPin: version %s\nPin-Priority: 1001\n' "$pkg" "$version" \
	>"$root/etc/apt/preferences.d/$pkg.pref"
check "pinned to $version: apt-get upgrade succeeds" apt_get upgrade
check "pinned to $version: still $version" installed_is "$version"
rm "$root/etc/apt/preferences.d/$pkg.pref"
pid=$(main_pid)
check "upgrade: apt-get upgrade succeeds" apt_get upgrade
check "upgrade: version $newer_version installed" installed_is "$newer_version"
check "upgrade: the settings written first are kept" test "$(sha /etc/default/$pkg)" = "$preset_sha"
check "upgrade: unit restarted and active" wait_for 60 restarted_since "$pid"
check "upgrade: answering 'drain 100%'" wait_for 10 answer_is web/web-01 "drain 100%"

# The end of the overlap: release.asc holds the new key only, and the node
# reads the mirror with it alone.
check "rotation done: the mirror publishes the new key only" \
	publish "$work/gnupg" "$next_key" "$work/www/signed" "$work/debs-2"
install -m 0644 "$work/www/signed/release.asc" "$root$keyring"
check "rotation done: the node's key file holds one key" test "$(key_count)" -eq 1
check "rotation done: apt-get update succeeds" apt_update || cat "$work/apt-update.log"
check "rotation done: candidate $newer_version" test "$(candidate)" = "$newer_version"

finish
