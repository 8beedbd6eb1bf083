# frozen_string_literal: true

#
# Cookbook:: gitlab-haproxy-agent
# Recipe:: default
#
# The agent first (when enabled), so it is listening before HAProxy is
# reloaded with agent checks; then haproxy.cfg.

include_recipe 'gitlab-haproxy-agent::agent' if node['gitlab-haproxy-agent']['agent']['enable']
include_recipe 'gitlab-haproxy-agent::haproxy'
