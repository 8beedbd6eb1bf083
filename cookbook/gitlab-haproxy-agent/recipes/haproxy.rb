# frozen_string_literal: true

#
# Cookbook:: gitlab-haproxy-agent
# Recipe:: haproxy
#
# Renders haproxy.cfg from gitlab-haproxy-agent.haproxy, every server line
# through GitlabHaproxyAgent::AgentCheck, checks it with `haproxy -c` before
# it replaces the old file, and reloads HAProxy. There is no server-state file:
# after a reload every server starts ready and the agent re-applies the state
# in Consul at its first check (within agent.inter).

attrs = node['gitlab-haproxy-agent']

# Built at compile time so a refused attribute fails the run before anything changes.
GitlabHaproxyAgent::HaproxyConfig.build(attrs)

package 'haproxy'

template attrs['haproxy']['config_path'] do
  source 'haproxy.cfg.erb'
  owner 'root'
  group 'root'
  mode '0644'
  verify '/usr/sbin/haproxy -c -q -f %{path}'
  notifies :reload, 'service[haproxy]', :delayed
end

service 'haproxy' do
  supports status: true, restart: true, reload: true
  action [:enable, :start]
end
