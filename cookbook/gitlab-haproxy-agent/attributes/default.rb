# frozen_string_literal: true

#
# Agent enrollment (rendered into haproxy.cfg server lines)
#

# false renders no agent option anywhere: haproxy.cfg is byte-for-byte the
# config without the agent. Setting it back to false is the rollback.
default['gitlab-haproxy-agent']['agent']['enable'] = false
# Where HAProxy sends agent checks (agent-addr, agent-port); the agent listens
# there too (GITLAB_HAPROXY_AGENT_LISTEN is derived from these two).
default['gitlab-haproxy-agent']['agent']['addr'] = '127.0.0.1'
default['gitlab-haproxy-agent']['agent']['port'] = 9777
# agent-inter: how often HAProxy asks; also the longest a KV change waits.
default['gitlab-haproxy-agent']['agent']['inter'] = '2s'
# KV prefix the agent reads (must end with '/').
default['gitlab-haproxy-agent']['agent']['prefix'] = 'gitlab-haproxy-agent/state/'
# Group name => backends (pools) whose servers belong to it, defined next to
# the pool definitions in the role, e.g. { 'canary' => %w(canary_web canary_api) }.
# Each enrolled server's agent-send lists its row key, then its groups in the
# order they are defined here; the first with a key in Consul wins.
default['gitlab-haproxy-agent']['agent']['groups'] = {}
# Zones a server may name (haproxy.backends.<b>.servers.<s>.zone): a zone
# outside the list is refused, so a typo cannot make a group no zonal drain
# writes. [] accepts any zone. A server's zone renders as the group
# zone-<zone> on its own agent-send line, after its row key and before its
# backend's groups: `state drain --zone b` writes the one key zone-b.
default['gitlab-haproxy-agent']['agent']['zones'] = []
# Backends never enrolled, such as one that writes its single server inline
# (an asset proxy to object storage).
default['gitlab-haproxy-agent']['agent']['excluded_backends'] = []
# true when the fleet writes agent weights or ramps (state set B/S 25%,
# undrain --ramp): an enrolled backend whose balance algorithm ignores runtime
# weights (static-rr, first, source, uri, url_param, hdr, rdp-cookie, hash
# without hash-type consistent) then fails the Chef run instead of a warning.
default['gitlab-haproxy-agent']['agent']['weights'] = false

# Package source and version pin: attributes/apt.rb.

#
# Agent settings written to /etc/default/gitlab-haproxy-agent (docs/options.md).
# nil leaves a setting out, so the agent's own default applies. listen and
# prefix are not set here: they come from agent.addr, agent.port and agent.prefix.
#
default['gitlab-haproxy-agent']['settings']['consul_addr'] = 'http://127.0.0.1:8500'
default['gitlab-haproxy-agent']['settings']['consul_token_file'] = nil
# TLS to Consul for https:// addresses: PEM CA file (nil: the system's roots),
# client certificate and key (for verify_incoming; both or neither), the name
# Consul's certificate is checked against (nil: each address's host), and
# false to take any certificate. nil leaves each out.
default['gitlab-haproxy-agent']['settings']['consul_ca_file'] = nil
default['gitlab-haproxy-agent']['settings']['consul_client_cert'] = nil
default['gitlab-haproxy-agent']['settings']['consul_client_key'] = nil
default['gitlab-haproxy-agent']['settings']['consul_tls_server_name'] = nil
default['gitlab-haproxy-agent']['settings']['consul_http_ssl_verify'] = nil
# Other ways into the same Consul datacenter, tried when the local Consul
# agent cannot serve reads. Empty (the variable is left out): the agent finds
# the Consul servers of its datacenter from Consul itself and keeps the list
# current. A list replaces them (e.g. ['http://10.0.0.11:8500',
# 'http://10.0.0.12:8500']); ['none'] turns fallbacks off. Same token and TLS
# settings; https only when consul_addr is https.
default['gitlab-haproxy-agent']['settings']['consul_fallback_addrs'] = []
# The HTTP port of the Consul servers found. nil: the port of consul_addr.
default['gitlab-haproxy-agent']['settings']['consul_fallback_port'] = nil
# How often the servers found are read again. nil: the agent's 30s.
default['gitlab-haproxy-agent']['settings']['consul_fallback_refresh'] = nil
# The Consul datacenter every fallback must answer /v1/agent/self with before
# the agent reads through it. nil: learned from consul_addr (left out); set it
# so a fallback can be proven while the local Consul agent is down at start.
default['gitlab-haproxy-agent']['settings']['consul_datacenter'] = nil
# Every address, so the fleet's Prometheus scrapes /metrics; the agent serves
# /status and /debug/pprof/ to 127.0.0.1 and ::1 only.
default['gitlab-haproxy-agent']['settings']['http_listen'] = '0.0.0.0:9778'
# true: /status and /debug/pprof/ also to clients other than 127.0.0.1 and ::1.
default['gitlab-haproxy-agent']['settings']['http_remote_debug'] = nil
default['gitlab-haproxy-agent']['settings']['wait'] = nil
default['gitlab-haproxy-agent']['settings']['startup_timeout'] = nil
default['gitlab-haproxy-agent']['settings']['on_startup_timeout'] = nil
default['gitlab-haproxy-agent']['settings']['check_timeout'] = nil
default['gitlab-haproxy-agent']['settings']['max_connections'] = nil
default['gitlab-haproxy-agent']['settings']['min_query_interval'] = nil
default['gitlab-haproxy-agent']['settings']['log_format'] = nil
default['gitlab-haproxy-agent']['settings']['log_buffer_lines'] = nil
# The runtime copy of the state served (tmpfs, kept across restarts of the
# agent): nil uses the unit's RuntimeDirectory=, /run/gitlab-haproxy-agent.
default['gitlab-haproxy-agent']['settings']['runtime_dir'] = nil
# HAProxy's PID file, whose master's old workers the agent counts for
# `state drain --until-idle`: nil uses the agent's default, /run/haproxy.pid.
default['gitlab-haproxy-agent']['settings']['haproxy_pid_file'] = nil
# The Prometheus that scrapes every agent, for the writer on this node
# (`gitlab-haproxy-agent state ...` reads it from /etc/default): group checks,
# write confirmation, `state status`. nil: none.
default['gitlab-haproxy-agent']['settings']['prometheus_url'] = nil

#
# haproxy.cfg (recipe haproxy). Every list of config lines (global, defaults,
# a frontend's or a backend's options) is a hash of name => line, rendered in
# the order the names were first defined (these defaults first, then the
# role's). Roles extend a hash: Chef merges hashes key by key but unions arrays
# given at the same precedence level as these defaults (a role's
# default_attributes), so a role could neither replace nor drop a line of a
# list. A role replaces a line by its name and drops it with nil, e.g.
#   "global": { "maxconn": "maxconn 4096", "daemon": null }
# Servers are rendered from backends.<name>.servers only, never written by
# hand in an enrolled backend.
#
default['gitlab-haproxy-agent']['haproxy']['config_path'] = '/etc/haproxy/haproxy.cfg'
# Unix socket only: no admin listener over TCP is rendered.
default['gitlab-haproxy-agent']['haproxy']['stats_socket'] = '/run/haproxy/admin.sock'
default['gitlab-haproxy-agent']['haproxy']['global'] = {
  'log' => 'log /dev/log local0',
  'chroot' => 'chroot /var/lib/haproxy',
  'user' => 'user haproxy',
  'group' => 'group haproxy',
  'daemon' => 'daemon',
  'maxconn' => 'maxconn 50000',
  'stats_timeout' => 'stats timeout 30s',
}
default['gitlab-haproxy-agent']['haproxy']['defaults'] = {
  'log' => 'log global',
  'mode' => 'mode http',
  'httplog' => 'option httplog',
  'dontlognull' => 'option dontlognull',
  'redispatch' => 'option redispatch',
  'retries' => 'retries 3',
  'timeout_connect' => 'timeout connect 5s',
  'timeout_client' => 'timeout client 90s',
  'timeout_server' => 'timeout server 90s',
  'timeout_check' => 'timeout check 2s',
}
# name => { name => line }: resolvers sections (nameserver, hold, timeout
# resolve, ...) for servers with `resolvers <name>`. Enrolled servers that
# resolve at run time get `resolve-opts ignore-weight` (see docs/enrolling.md).
default['gitlab-haproxy-agent']['haproxy']['resolvers'] = {}
# name => { 'bind' => [addresses], 'options' => { name => line } }
default['gitlab-haproxy-agent']['haproxy']['frontends'] = {}
# name => { 'options' => { name => line },
#          'servers' => { name => { 'address', 'port', 'weight', 'options', 'zone', 'groups' } },
#          'server_templates' => { name => { 'count', 'address', 'port', 'weight', 'options', 'zone', 'groups' } },
#          'zonal' => true | false | nil (nil: zonal when any of its servers has a zone) }
# Every server (and server-template) of a zonal backend must have a zone.
default['gitlab-haproxy-agent']['haproxy']['backends'] = {}
