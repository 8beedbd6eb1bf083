# frozen_string_literal: true

require_relative 'haproxy_config'
require_relative 'settings'

# The systemd drop-in for HAProxy's unit that makes a reload ask the local
# agent first (`gitlab-haproxy-agent check-ready`). Plain Ruby (no Chef API).
module GitlabHaproxyAgent
  module ReloadGuard
    DIR = '/etc/systemd/system/haproxy.service.d'
    PATH = "#{DIR}/gitlab-haproxy-agent.conf"
    # Under /run: gone at reboot. The binary's default, written out so the
    # drop-in shows it.
    OVERRIDE_FILE = '/run/gitlab-haproxy-agent-allow-haproxy-reload'
    DEFAULT_HTTP_LISTEN = '0.0.0.0:9778'
    # Under /run: HAProxy started since boot, so a start now is a restart
    # (or a start after a stop) and is checked like a reload.
    STARTED_FILE = '/run/gitlab-haproxy-agent-haproxy-started'

    module_function

    # The template's variables, or nil when the agent is not enabled (no
    # drop-in: nothing would answer the check).
    def variables(attrs, agent_bin: '/usr/bin/gitlab-haproxy-agent', haproxy_bin: '/usr/sbin/haproxy',
                  override_file: OVERRIDE_FILE, started_file: STARTED_FILE)
      agent = attrs['agent'] || {}
      return nil unless HaproxyConfig.enabled?(agent['enable'])

      env = Settings.environment(agent, attrs['settings']).to_h
      {
        agent_bin: agent_bin,
        haproxy_bin: haproxy_bin,
        agent_addr: env.fetch('GITLAB_HAPROXY_AGENT_LISTEN'),
        http_addr: local_addr(env.fetch('GITLAB_HAPROXY_AGENT_HTTP_LISTEN', DEFAULT_HTTP_LISTEN)),
        override_file: override_file,
        started_file: started_file,
      }
    end

    # Where the check asks an agent listening on `listen`: on loopback when
    # it listens on every address (0.0.0.0, [::]), so the drop-in shows an
    # address that answers (check-ready does the same).
    def local_addr(listen)
      listen.sub(/\A0\.0\.0\.0:/, '127.0.0.1:').sub(/\A\[::\]:/, '[::1]:')
    end
  end
end
