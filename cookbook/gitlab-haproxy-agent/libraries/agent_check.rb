# frozen_string_literal: true

# Server-line options that enroll one HAProxy server with gitlab-haproxy-agent.
#
# Plain Ruby (no Chef API) so it is tested with minitest alone. Every refusal
# raises GitlabHaproxyAgent::ConfigError naming the node attribute to fix: a
# wrong line here drains the wrong servers, or none.
require 'ipaddr'

module GitlabHaproxyAgent
  # Top-level attribute key of this cookbook; error messages name attributes
  # as dotted paths under it (gitlab-haproxy-agent.agent.port).
  ATTR = 'gitlab-haproxy-agent'

  # Raised for any attribute that would render a wrong or unsafe config.
  class ConfigError < ArgumentError; end

  module AgentCheck
    # Backend and server names: what HAProxy accepts in proxy and server names
    # (letters, digits, '.', '_', '-', ':') and nothing the agent-send quoting
    # or the KV key <prefix><backend>/<server> would change.
    NAME_CHARS = /\A[A-Za-z0-9._:-]+\z/.freeze
    # Group names become the KV key <prefix><group>: the same characters,
    # and no '/' (that would read as a row key).
    GROUP_CHARS = NAME_CHARS
    # Limits of the agent's agent-send parser: one identity (a KV key below
    # the prefix) is at most 255 bytes, a line at most 16 identities and
    # 1024 bytes with its LF.
    MAX_IDENTITY = 255
    MAX_IDENTITIES = 16
    MAX_LINE = 1024
    # A server's zone becomes the group zone-<zone> on its agent-send line
    # (`state drain --zone b` writes the key zone-b).
    ZONE_GROUP_PREFIX = 'zone-'

    # HAProxy time: a positive integer with an optional unit.
    TIME = /\A[1-9][0-9]*(us|ms|s|m|h|d)?\z/.freeze
    # An IPv4 or IPv6 literal, no host name: the agent binds agent.addr (a
    # socket address, GITLAB_HAPROXY_AGENT_LISTEN) and refuses a host name
    # such as localhost at every start (exit 64, usage).
    IP_CHARS = /\A[0-9A-Fa-f.:]+\z/.freeze

    module_function

    # Returns the agent options for one server line, for example
    #   agent-check agent-addr 127.0.0.1 agent-port 9777 agent-inter 2s
    #   agent-send "canary_web/web-cny-01 zone-b canary\n"
    # (on one line). The agent-send line lists the row key first, then the
    # groups in order: the agent answers with the first of them that has a key.
    #
    # weight is the server's configured weight when known: agent weights are a
    # share of it, so an enrolled server with weight 0 is refused.
    #
    # template: true for a server-template line. HAProxy gives all of a
    # template's servers (<name>1..<name>N) the same agent-send string, so
    # none of them can send its own row key: the line carries the groups
    # only, and a template without a group is refused (nothing could drain
    # its servers).
    def server_options(backend:, server:, groups: [], addr:, port:, inter:, weight: nil, weight_attr: nil,
                       template: false)
      servers_attr = "#{ATTR}.haproxy.backends.#{backend}.#{template ? 'server_templates' : 'servers'}"
      check_name!(backend, 'backend name', "#{ATTR}.haproxy.backends")
      check_name!(server, template ? 'server-template name' : 'server name', servers_attr)
      groups = Array(groups)
      groups.each { |g| check_group!(g, "#{ATTR}.agent.groups") }
      if groups.uniq.length != groups.length
        raise ConfigError, "#{ATTR}.agent.groups: #{backend}/#{server} is listed twice in the same group"
      end

      addr = option_value!(addr, 'addr')
      port = option_value!(port, 'port')
      inter = option_value!(inter, 'inter')
      check_addr!(addr)
      check_port!(port)
      check_inter!(inter)
      unless weight.nil?
        check_weight!(weight, weight_attr || "#{servers_attr}.#{server}.weight")
      end
      return agent_options(addr, port, inter, template_identities(backend, server, groups)) if template

      row_key = "#{backend}/#{server}"
      if row_key.bytesize > MAX_IDENTITY
        raise ConfigError, "#{ATTR}.haproxy.backends.#{backend}.servers: row key #{row_key.inspect} is longer " \
                           "than #{MAX_IDENTITY} bytes, the longest KV key the agent accepts"
      end
      if groups.length + 1 > MAX_IDENTITIES
        raise ConfigError, "#{ATTR}.agent.groups: #{row_key} is in #{groups.length} groups; the agent reads at " \
                           "most #{MAX_IDENTITIES - 1} groups after the row key"
      end
      agent_options(addr, port, inter, [row_key, *groups])
    end

    def template_identities(backend, template, groups)
      if groups.empty?
        raise ConfigError, "#{ATTR}.haproxy.backends.#{backend}.server_templates.#{template}: a " \
                           "server-template's servers share one agent-send line, so no row key can name one " \
                           'of them and only a group can drain them; give it a zone or groups, or put its ' \
                           "backend in a group of #{ATTR}.agent.groups"
      end
      if groups.length > MAX_IDENTITIES
        raise ConfigError, "#{ATTR}.agent.groups: server-template #{backend}/#{template} is in #{groups.length} " \
                           "groups; the agent reads at most #{MAX_IDENTITIES}"
      end
      groups
    end

    def agent_options(addr, port, inter, identities)
      send_line = identities.join(' ')
      if send_line.bytesize + 1 > MAX_LINE
        raise ConfigError, "#{ATTR}.agent.groups: the agent-send line #{identities.first} ... is longer than " \
                           "#{MAX_LINE} bytes, the longest the agent reads"
      end
      "agent-check agent-addr #{addr} agent-port #{port} agent-inter #{inter} " \
        "agent-send \"#{send_line}\\n\""
    end

    # Group memberships per backend from agent.groups ({ group => [backend,
    # ...] }), in the order the groups are defined. Refuses groups that name a
    # backend that does not exist or is excluded: such a typo would leave the
    # servers out of the group and a drain of the group would miss them.
    def memberships(groups_attr, backend_names, excluded)
      groups_attr ||= {}
      unless groups_attr.is_a?(Hash)
        raise ConfigError, "#{ATTR}.agent.groups must be a hash of group name => list of backends"
      end

      result = Hash.new { |h, k| h[k] = [] }
      groups_attr.each do |group, members|
        group = group.to_s
        check_group!(group, "#{ATTR}.agent.groups")
        attr = "#{ATTR}.agent.groups.#{group}"
        unless members.is_a?(Array)
          raise ConfigError, "#{attr} must be a list of backend names, got #{members.inspect}"
        end

        members.each do |backend|
          backend = backend.to_s
          unless backend_names.include?(backend)
            raise ConfigError, "#{attr} lists backend #{backend.inspect}, which is not in #{ATTR}.haproxy.backends"
          end
          if excluded.include?(backend)
            raise ConfigError, "#{attr} lists backend #{backend.inspect}, which is in #{ATTR}.agent.excluded_backends " \
                               'and is never enrolled'
          end
          if result[backend].include?(group)
            raise ConfigError, "#{attr} lists backend #{backend.inspect} twice"
          end

          result[backend] << group
        end
      end
      result
    end

    def check_name!(name, what, attr)
      check_identity!(name, what, attr, NAME_CHARS, "letters, digits, '.', '_', '-', ':'")
    end

    def check_group!(name, attr)
      check_identity!(name, 'group name', attr, GROUP_CHARS, "letters, digits, '.', '_', '-', ':'")
      return if name.to_s.bytesize <= MAX_IDENTITY

      raise ConfigError, "#{attr}: group name #{name.to_s[0, 40].inspect}... is longer than #{MAX_IDENTITY} bytes"
    end

    def check_identity!(name, what, attr, allowed, allowed_text)
      text = name.nil? ? '' : name.to_s
      where = "#{attr}: #{what} #{text.inspect}"
      raise ConfigError, "#{where} is empty" if text.empty?
      if text.include?('$')
        raise ConfigError, "#{where} contains '$': HAProxy expands $NAME inside the quoted agent-send"
      end
      raise ConfigError, "#{where} contains '#': HAProxy reads '#' as the start of a comment" if text.include?('#')
      if text.match?(/["'`]/)
        raise ConfigError, "#{where} contains a quote: it would end the quoted agent-send string"
      end
      if text.match?(/\s/)
        raise ConfigError, "#{where} contains whitespace: the agent splits the agent-send line on spaces"
      end
      if text.include?('/')
        raise ConfigError, "#{where} contains '/': the KV key would not match <prefix><backend>/<server>"
      end
      raise ConfigError, "#{where} contains '\\': HAProxy unescapes it inside quotes" if text.include?('\\')
      if %w[. ..].include?(text)
        raise ConfigError, "#{where} is a path component ('.' or '..') that HTTP clients rewrite in KV URLs"
      end
      return if text.match?(allowed)

      raise ConfigError, "#{where} has characters outside #{allowed_text}"
    end

    def option_value!(value, name)
      text = value.nil? ? '' : value.to_s.strip
      raise ConfigError, "#{ATTR}.agent.#{name} is empty" if text.empty?

      text
    end

    def check_addr!(addr)
      return if ip_literal?(addr)

      raise ConfigError, "#{ATTR}.agent.addr #{addr.inspect} is not an IP address: the agent listens on " \
                         "agent.addr:agent.port and refuses a host name at every start (HAProxy's agent-addr " \
                         'is the same address); write 127.0.0.1 or ::1'
    end

    # IPv4 dotted quad (no leading zeros) or IPv6, without prefix length or
    # zone: what the agent's socket-address parser (Rust std::net) accepts.
    def ip_literal?(text)
      return false unless text.match?(IP_CHARS)

      ip = IPAddr.new(text)
      return true if ip.ipv6?

      text.split('.').map { |o| o.to_i.to_s } == text.split('.', -1)
    rescue IPAddr::Error
      false
    end

    def check_port!(port)
      return if port.match?(/\A[0-9]+\z/) && port.to_i.between?(1, 65_535)

      raise ConfigError, "#{ATTR}.agent.port #{port.inspect} is not a port number (1-65535)"
    end

    def check_inter!(inter)
      return if inter.match?(TIME)

      raise ConfigError, "#{ATTR}.agent.inter #{inter.inspect} is not an HAProxy time such as 2s or 500ms"
    end

    def check_weight!(weight, attr)
      text = weight.to_s.strip
      unless text.match?(/\A[0-9]+\z/)
        raise ConfigError, "#{attr} #{weight.inspect} is not an integer weight"
      end
      return unless text.to_i.zero?

      raise ConfigError, "#{attr} is 0 on an enrolled server: agent weights are a share of the configured " \
                         "weight, so no answer could give it traffic; set a weight or list the backend in " \
                         "#{ATTR}.agent.excluded_backends"
    end
  end
end
