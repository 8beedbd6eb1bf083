#!/usr/bin/env ruby
# frozen_string_literal: true

# Prints haproxy.cfg for the sample role (test/fixtures/sample_role.json) to
# stdout, rendered from templates/default/haproxy.cfg.erb with Erubis as Chef
# would. Options (each also read from the environment variable shown; options
# win) point the rendered config at loopback ports a test controls:
#
#   --server-addr 127.0.0.1:PORT    every server, inline ones and   SAMPLE_SERVER_ADDR
#                                   server-templates too
#   --server BACKEND/SERVER=127.0.0.1:PORT   one server or server-  SAMPLE_SERVERS (comma-separated)
#                                   template, repeatable
#   --bind FRONTEND=127.0.0.1:PORT  one frontend, repeatable        SAMPLE_BINDS (comma-separated)
#   --agent-port PORT                                               SAMPLE_AGENT_PORT
#   --agent-addr 127.0.0.1                                          SAMPLE_AGENT_ADDR
#   --agent-inter TIME              e.g. 200ms                      SAMPLE_AGENT_INTER
#   --stats-socket PATH             unix socket path                SAMPLE_STATS_SOCKET
#   --disable-agent                 agent.enable false              SAMPLE_AGENT_ENABLE=false
#   --role PATH                     another role JSON               SAMPLE_ROLE
#
# With --reload-guard it prints instead the systemd drop-in for HAProxy's unit
# (templates/default/haproxy-reload-guard.conf.erb) for the same attributes,
# with these too:
#   --http-listen 127.0.0.1:PORT    settings.http_listen
#   --agent-bin PATH / --haproxy-bin PATH / --override-file PATH / --started-file PATH
#                                   what the drop-in runs and reads
#
# Only 127.0.0.1 addresses are accepted. Exits 2 on a bad option and 1 when
# the cookbook refuses the attributes (the message names the attribute).

require 'optparse'
require_relative 'lib/chef_stand_in'

LOOPBACK = /\A127\.0\.0\.1:([0-9]{1,5})\z/.freeze

def fail_usage(message)
  warn "render_sample: #{message}"
  exit 2
end

def loopback!(value, what)
  m = value.to_s.match(LOOPBACK)
  fail_usage("#{what} #{value.inspect} is not 127.0.0.1:PORT") unless m && m[1].to_i.between?(1, 65_535)
  value
end

def pairs(list, what)
  list.to_h do |item|
    key, value = item.split('=', 2)
    fail_usage("#{what} #{item.inspect} is not NAME=127.0.0.1:PORT") if key.to_s.empty? || value.nil?
    [key, loopback!(value, what)]
  end
end

def env_list(name)
  ENV.fetch(name, '').split(',').map(&:strip).reject(&:empty?)
end

opts = {
  server_addr: ENV['SAMPLE_SERVER_ADDR'],
  servers: env_list('SAMPLE_SERVERS'),
  binds: env_list('SAMPLE_BINDS'),
  agent_port: ENV['SAMPLE_AGENT_PORT'],
  agent_addr: ENV['SAMPLE_AGENT_ADDR'],
  agent_inter: ENV['SAMPLE_AGENT_INTER'],
  stats_socket: ENV['SAMPLE_STATS_SOCKET'],
  enable: ENV['SAMPLE_AGENT_ENABLE'].nil? ? nil : !%w[0 false no].include?(ENV['SAMPLE_AGENT_ENABLE'].downcase),
  role: ENV['SAMPLE_ROLE'] || ChefStandIn::SAMPLE_ROLE,
  guard: {},
}
cli_servers = []
cli_binds = []
begin
  OptionParser.new do |o|
    o.banner = 'Usage: render_sample.rb [options]  (see the header of this file)'
    o.on('--server-addr ADDR') { |v| opts[:server_addr] = v }
    o.on('--server SPEC') { |v| cli_servers << v }
    o.on('--bind SPEC') { |v| cli_binds << v }
    o.on('--agent-port PORT') { |v| opts[:agent_port] = v }
    o.on('--agent-addr ADDR') { |v| opts[:agent_addr] = v }
    o.on('--agent-inter TIME') { |v| opts[:agent_inter] = v }
    o.on('--stats-socket PATH') { |v| opts[:stats_socket] = v }
    o.on('--disable-agent') { opts[:enable] = false }
    o.on('--role PATH') { |v| opts[:role] = v }
    o.on('--reload-guard') { opts[:reload_guard] = true }
    o.on('--http-listen ADDR') { |v| opts[:http_listen] = loopback!(v, '--http-listen') }
    o.on('--agent-bin PATH') { |v| opts[:guard][:agent_bin] = v }
    o.on('--haproxy-bin PATH') { |v| opts[:guard][:haproxy_bin] = v }
    o.on('--override-file PATH') { |v| opts[:guard][:override_file] = v }
    o.on('--started-file PATH') { |v| opts[:guard][:started_file] = v }
  end.parse!(ARGV)
rescue OptionParser::ParseError => e
  fail_usage(e.message)
end
fail_usage("unexpected arguments: #{ARGV.join(' ')}") unless ARGV.empty?

servers = pairs(opts[:servers] + cli_servers, '--server')
binds = pairs(opts[:binds] + cli_binds, '--bind')
loopback!(opts[:server_addr], '--server-addr') if opts[:server_addr]
if opts[:agent_addr] && opts[:agent_addr] != '127.0.0.1'
  fail_usage("--agent-addr #{opts[:agent_addr].inspect} is not 127.0.0.1")
end

base = ChefStandIn.node(role: opts[:role]).to_h
haproxy = base.dig('gitlab-haproxy-agent', 'haproxy')
agent = base.dig('gitlab-haproxy-agent', 'agent')

unknown_binds = binds.keys - haproxy['frontends'].keys
fail_usage("--bind: no frontend #{unknown_binds.join(', ')} in the role") unless unknown_binds.empty?
binds.each { |name, addr| haproxy['frontends'][name]['bind'] = [addr] }

known_servers = []
haproxy['backends'].each do |backend, attrs|
  # Servers and server-templates (BACKEND/TEMPLATE names the template).
  ((attrs['servers'] || {}).to_a + (attrs['server_templates'] || {}).to_a).each do |name, server|
    known_servers << "#{backend}/#{name}"
    addr = servers["#{backend}/#{name}"] || opts[:server_addr]
    next unless addr

    host, port = addr.split(':')
    server['address'] = host
    server['port'] = port.to_i
  end
  # Inline server lines of excluded backends (server NAME ADDR ...).
  attrs['options'] = (attrs['options'] || {}).transform_values do |line|
    m = line.to_s.match(/\A(\s*server\s+(\S+)\s+)(\S+)(.*)\z/)
    next line unless m

    known_servers << "#{backend}/#{m[2]}"
    addr = servers["#{backend}/#{m[2]}"] || opts[:server_addr]
    addr ? "#{m[1]}#{addr}#{m[4]}" : line
  end
end
unknown_servers = servers.keys - known_servers
fail_usage("--server: no server #{unknown_servers.join(', ')} in the role") unless unknown_servers.empty?

agent['port'] = opts[:agent_port] if opts[:agent_port]
agent['addr'] = opts[:agent_addr] if opts[:agent_addr]
agent['inter'] = opts[:agent_inter] if opts[:agent_inter]
agent['enable'] = opts[:enable] unless opts[:enable].nil?
haproxy['stats_socket'] = opts[:stats_socket] if opts[:stats_socket]
base['gitlab-haproxy-agent']['settings']['http_listen'] = opts[:http_listen] if opts[:http_listen]

begin
  if opts[:reload_guard]
    vars = GitlabHaproxyAgent::ReloadGuard.variables(base['gitlab-haproxy-agent'], **opts[:guard])
    fail_usage('--reload-guard: the agent is not enabled, so there is no drop-in') unless vars
    $stdout.write(ChefStandIn.render('haproxy-reload-guard.conf.erb', ChefStandIn::Node.new(base), vars))
    exit 0
  end
  $stdout.write(ChefStandIn.render('haproxy.cfg.erb', ChefStandIn::Node.new(base)))
rescue GitlabHaproxyAgent::ConfigError => e
  warn "render_sample: #{e.message}"
  exit 1
end
