# frozen_string_literal: true

#
# Cookbook:: gitlab-haproxy-agent
# Recipe:: haproxy
#
# Renders haproxy.cfg from gitlab-haproxy-agent.haproxy, every server line
# through GitlabHaproxyAgent::AgentCheck, checks it with `haproxy -c` before
# it replaces the old file, and reloads HAProxy. There is no server-state file:
# after a reload every server starts ready and the agent re-applies the state
# in Consul at its first check (within agent.inter). With the agent enabled, a
# systemd drop-in makes HAProxy's reload ask the agent first
# (`gitlab-haproxy-agent check-ready`) and refuse while it is not ready and
# answering: with nobody to answer, the reload would undrain every server.

attrs = node['gitlab-haproxy-agent']

# Built at compile time so a refused attribute fails the run before anything changes.
GitlabHaproxyAgent::HaproxyConfig.build(attrs)
# Enrolled backends whose algorithm ignores runtime weights: a warning each,
# or a failed run with agent.weights true.
GitlabHaproxyAgent::Weights.check(attrs).each { |warning| Chef::Log.warn(warning) }
guard = GitlabHaproxyAgent::ReloadGuard.variables(attrs)

package 'haproxy'

execute 'systemd daemon-reload for the haproxy drop-in' do
  command 'systemctl daemon-reload'
  action :nothing
end

# Before haproxy.cfg, so that the reload it notifies is already guarded (or,
# when the agent is rolled back, no longer guarded).
if guard
  directory GitlabHaproxyAgent::ReloadGuard::DIR do
    owner 'root'
    group 'root'
    mode '0755'
  end

  template GitlabHaproxyAgent::ReloadGuard::PATH do
    source 'haproxy-reload-guard.conf.erb'
    owner 'root'
    group 'root'
    mode '0644'
    variables(guard)
    notifies :run, 'execute[systemd daemon-reload for the haproxy drop-in]', :immediately
  end
else
  file GitlabHaproxyAgent::ReloadGuard::PATH do
    action :delete
    notifies :run, 'execute[systemd daemon-reload for the haproxy drop-in]', :immediately
  end
end

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
