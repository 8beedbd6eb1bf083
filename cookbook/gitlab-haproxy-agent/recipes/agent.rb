# frozen_string_literal: true

#
# Cookbook:: gitlab-haproxy-agent
# Recipe:: agent
#
# Installs gitlab-haproxy-agent from the internal apt mirror, writes its
# settings to /etc/default/gitlab-haproxy-agent and keeps the service enabled
# and running, restarted when the settings or the package change. A restart is
# harmless to traffic: while the port is closed HAProxy keeps each server's
# last state.

attrs = node['gitlab-haproxy-agent']
apt_attrs = attrs['apt']

if apt_attrs['uri'].to_s.empty? || apt_attrs['key'].to_s.empty?
  raise GitlabHaproxyAgent::ConfigError,
        'gitlab-haproxy-agent.apt.uri and gitlab-haproxy-agent.apt.key must name the internal apt mirror'
end

# Computed at compile time so a bad setting fails the run before anything changes.
environment = GitlabHaproxyAgent::Settings.environment(attrs['agent'], attrs['settings'])

apt_repository 'gitlab-haproxy-agent' do
  uri apt_attrs['uri']
  key apt_attrs['key']
  distribution apt_attrs['distribution'] || node['lsb']['codename']
  components apt_attrs['components']
  action :add
end

# Written before the package so its first start already uses these settings.
template '/etc/default/gitlab-haproxy-agent' do
  source 'gitlab-haproxy-agent.default.erb'
  owner 'root'
  group 'root'
  mode '0644'
  variables(environment: environment)
end

package 'gitlab-haproxy-agent' do
  version attrs['package']['version'] if attrs['package']['version']
  action :install
end

service 'gitlab-haproxy-agent' do
  supports status: true, restart: true
  action [:enable, :start]
  subscribes :restart, 'template[/etc/default/gitlab-haproxy-agent]', :delayed
  subscribes :restart, 'package[gitlab-haproxy-agent]', :delayed
end
