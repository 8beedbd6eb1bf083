# frozen_string_literal: true

require_relative 'agent_check'

# Environment for /etc/default/gitlab-haproxy-agent (read by the systemd unit
# as EnvironmentFile=). Plain Ruby (no Chef API).
#
# The listen address and the KV prefix come from the agent attributes, so the
# port HAProxy asks (agent-port) and the port the agent binds cannot disagree.
module GitlabHaproxyAgent
  module Settings
    # Attribute key under gitlab-haproxy-agent.settings => variable name.
    VARIABLES = {
      'consul_addr' => 'GITLAB_HAPROXY_AGENT_CONSUL_ADDR',
      'consul_fallback_addrs' => 'GITLAB_HAPROXY_AGENT_CONSUL_FALLBACK_ADDRS',
      'consul_fallback_port' => 'GITLAB_HAPROXY_AGENT_CONSUL_FALLBACK_PORT',
      'consul_fallback_refresh' => 'GITLAB_HAPROXY_AGENT_CONSUL_FALLBACK_REFRESH',
      'consul_datacenter' => 'GITLAB_HAPROXY_AGENT_CONSUL_DATACENTER',
      'consul_token_file' => 'GITLAB_HAPROXY_AGENT_CONSUL_TOKEN_FILE',
      'consul_ca_file' => 'GITLAB_HAPROXY_AGENT_CONSUL_CA_FILE',
      'consul_client_cert' => 'GITLAB_HAPROXY_AGENT_CONSUL_CLIENT_CERT',
      'consul_client_key' => 'GITLAB_HAPROXY_AGENT_CONSUL_CLIENT_KEY',
      'consul_tls_server_name' => 'GITLAB_HAPROXY_AGENT_CONSUL_TLS_SERVER_NAME',
      'consul_http_ssl_verify' => 'GITLAB_HAPROXY_AGENT_CONSUL_HTTP_SSL_VERIFY',
      'http_listen' => 'GITLAB_HAPROXY_AGENT_HTTP_LISTEN',
      'http_remote_debug' => 'GITLAB_HAPROXY_AGENT_HTTP_REMOTE_DEBUG',
      'wait' => 'GITLAB_HAPROXY_AGENT_WAIT',
      'startup_timeout' => 'GITLAB_HAPROXY_AGENT_STARTUP_TIMEOUT',
      'on_startup_timeout' => 'GITLAB_HAPROXY_AGENT_ON_STARTUP_TIMEOUT',
      'check_timeout' => 'GITLAB_HAPROXY_AGENT_CHECK_TIMEOUT',
      'max_connections' => 'GITLAB_HAPROXY_AGENT_MAX_CONNECTIONS',
      'min_query_interval' => 'GITLAB_HAPROXY_AGENT_MIN_QUERY_INTERVAL',
      'consistency' => 'GITLAB_HAPROXY_AGENT_CONSISTENCY',
      'max_stale' => 'GITLAB_HAPROXY_AGENT_MAX_STALE',
      'index_check' => 'GITLAB_HAPROXY_AGENT_INDEX_CHECK',
      'state_dir' => 'GITLAB_HAPROXY_AGENT_STATE_DIR',
      'runtime_dir' => 'GITLAB_HAPROXY_AGENT_RUNTIME_DIR',
      'haproxy_pid_file' => 'GITLAB_HAPROXY_AGENT_HAPROXY_PID_FILE',
      'log_format' => 'GITLAB_HAPROXY_AGENT_LOG_FORMAT',
      'log_buffer_lines' => 'GITLAB_HAPROXY_AGENT_LOG_BUFFER_LINES',
      'prometheus_url' => 'GITLAB_HAPROXY_AGENT_PROMETHEUS_URL',
    }.freeze
    # Values are written unquoted: both systemd and a POSIX shell read them
    # the same only without these.
    UNSAFE = /[\s"'`$\\#;&|<>()]/.freeze

    module_function

    # [[NAME, value], ...] in a fixed order; settings left nil are omitted so
    # the agent's own default applies.
    def environment(agent, settings)
      agent ||= {}
      settings ||= {}
      unknown = settings.keys.map(&:to_s) - VARIABLES.keys - %w[listen prefix]
      unless unknown.empty?
        raise ConfigError, "#{ATTR}.settings: unknown setting(s) #{unknown.sort.join(', ')}; known: " \
                           "#{VARIABLES.keys.join(', ')} (listen comes from agent.addr and agent.port, " \
                           'prefix from agent.prefix)'
      end

      listen = listen_address(agent)
      if settings['listen'] && settings['listen'].to_s != listen
        raise ConfigError, "#{ATTR}.settings.listen #{settings['listen'].to_s.inspect} differs from " \
                           "agent.addr:agent.port (#{listen}), where HAProxy sends its agent checks"
      end
      if settings['prefix'] && settings['prefix'].to_s != agent['prefix'].to_s
        raise ConfigError, "#{ATTR}.settings.prefix: set the KV prefix with #{ATTR}.agent.prefix"
      end

      env = [
        ['GITLAB_HAPROXY_AGENT_LISTEN', listen],
        ['GITLAB_HAPROXY_AGENT_PREFIX', prefix(agent['prefix'])],
      ]
      VARIABLES.each do |key, name|
        value = settings[key]
        next if value.nil?

        if key == 'consul_fallback_addrs'
          text = fallback_addrs!(value, settings['consul_addr'], "#{ATTR}.settings.#{key}")
          env << [name, text] if text
          next
        end
        text = value!(value, "#{ATTR}.settings.#{key}")
        socket_address!(text, "#{ATTR}.settings.#{key}") if key == 'http_listen'
        datacenter!(text, "#{ATTR}.settings.#{key}") if key == 'consul_datacenter'
        env << [name, text]
      end
      env
    end

    def listen_address(agent)
      addr = AgentCheck.option_value!(agent['addr'], 'addr')
      port = AgentCheck.option_value!(agent['port'], 'port')
      AgentCheck.check_addr!(addr)
      AgentCheck.check_port!(port)
      addr.include?(':') ? "[#{addr}]:#{port}" : "#{addr}:#{port}"
    end

    # IP:PORT or [IPv6]:PORT, as the agent parses a listen address (a host
    # name such as localhost:9778 makes it exit 64 at every start).
    def socket_address!(text, attr)
      m = text.match(/\A(?:\[([^\]]+)\]|([^:\[\]]+)):([0-9]+)\z/)
      ip = m && (m[1] || m[2])
      v6 = m && !m[1].nil?
      if m && AgentCheck.ip_literal?(ip) && v6 == ip.include?(':') && m[3].to_i.between?(1, 65_535)
        return text
      end

      raise ConfigError, "#{attr} #{text.inspect} is not IP:PORT or [IPv6]:PORT with a port 1-65535: the agent " \
                         'refuses a host name or a bad port at every start'
    end

    # settings.consul_datacenter: a Consul datacenter name as the agent takes
    # --consul-datacenter (letters, digits, - and _, at most 64); it exits 64
    # at every start on anything else.
    def datacenter!(text, attr)
      return text if text.match?(/\A[A-Za-z0-9_-]{1,64}\z/)

      raise ConfigError, "#{attr} #{text.inspect} is not a Consul datacenter name (letters, digits, - and _): " \
                         'the agent refuses it at every start'
    end

    # settings.consul_fallback_addrs: a list of Consul addresses as the agent
    # takes --consul-fallback-addr (http(s)://host:port or host:port), written
    # comma-joined; nil for an empty list (the variable is left out, and the
    # agent finds the Consul servers itself); ['none'] turns fallbacks off.
    # The agent exits 64 at every start on another scheme (http with an https
    # consul_addr), a path, an address given twice or the same as
    # --consul-addr, or none beside an address: refused here first.
    def fallback_addrs!(value, consul_addr, attr)
      unless value.is_a?(Array)
        raise ConfigError, "#{attr} must be a list of Consul addresses such as ['http://10.0.0.11:8500'], " \
                           "or ['none'], got #{value.inspect}"
      end
      if value.map { |v| v.to_s.strip.downcase }.include?('none')
        return 'none' if value.length == 1

        raise ConfigError, "#{attr}: 'none' turns fallbacks off and must be alone, got #{value.inspect}"
      end

      primary = consul_addr.nil? ? 'http://127.0.0.1:8500' : consul_address(consul_addr.to_s)
      scheme = primary&.start_with?('https://') ? 'https' : 'http'
      seen = []
      value.each_with_index do |item, i|
        text = value!(item, "#{attr}[#{i}]")
        if text.include?(',')
          raise ConfigError, "#{attr}[#{i}] #{text.inspect}: one address per list item (no commas)"
        end

        addr = consul_address(text, scheme)
        unless addr
          raise ConfigError, "#{attr}[#{i}] #{text.inspect} is not http(s)://HOST:PORT or HOST:PORT (no path): " \
                             'the agent refuses it at every start'
        end
        if scheme == 'https' && !addr.start_with?('https://')
          raise ConfigError, "#{attr}[#{i}] #{text.inspect} is plain http while settings.consul_addr is https: " \
                             'the agent refuses it at every start'
        end
        if addr == primary || seen.include?(addr)
          raise ConfigError, "#{attr}[#{i}] #{text.inspect} is given twice or is settings.consul_addr: the " \
                             'agent refuses it at every start'
        end

        seen << addr
      end
      seen.empty? ? nil : value.map(&:to_s).join(',')
    end

    # http(s)://host[:port] with nothing after it, as the agent normalizes a
    # Consul address (`scheme` added, trailing slash dropped); nil when it is
    # not one.
    def consul_address(text, scheme = 'http')
      with_scheme = text.include?('://') ? text : "#{scheme}://#{text}"
      m = with_scheme.match(%r{\Ahttps?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::([0-9]+))?/?\z})
      return nil unless m && (m[2].nil? || m[2].to_i.between?(1, 65_535))

      with_scheme.chomp('/')
    end

    def prefix(value)
      text = value!(value, "#{ATTR}.agent.prefix")
      unless text.end_with?('/')
        raise ConfigError, "#{ATTR}.agent.prefix #{text.inspect} must end with '/': Consul matches a " \
                           'recursive read by raw text, so state/ would also read state-old/'
      end
      if text.start_with?('/')
        raise ConfigError, "#{ATTR}.agent.prefix #{text.inspect} must not start with '/'"
      end
      text
    end

    def value!(value, attr)
      text = value.to_s
      raise ConfigError, "#{attr} is empty" if text.strip.empty?
      raise ConfigError, "#{attr} #{text.inspect} has spaces, quotes or shell characters" if text.match?(UNSAFE)

      text
    end
  end
end
