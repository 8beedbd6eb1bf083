# frozen_string_literal: true

require_relative 'agent_check'

# The haproxy.cfg model the template prints: sections as lists of lines, and
# every server line built here, its agent options from AgentCheck only.
#
# Plain Ruby (no Chef API). build() takes node['gitlab-haproxy-agent'] (or any
# Hash with the same shape) and raises GitlabHaproxyAgent::ConfigError naming
# the attribute when the config would enroll servers by hand, keep state in a
# server-state file, or open an admin listener over TCP.
module GitlabHaproxyAgent
  module HaproxyConfig
    Config = Struct.new(:global, :defaults, :resolvers, :frontends, :backends, keyword_init: true)
    Section = Struct.new(:name, :lines, :servers, keyword_init: true)
    # base: the server line without agent options; agent: the options or nil.
    Server = Struct.new(:name, :base, :agent, keyword_init: true) do
      def line
        agent ? "#{base} #{agent}" : base
      end
    end

    STATE_FILE = 'a server-state file restores admin state and the agent address and port over the ' \
                 'configuration on reload; the desired state lives in Consul'
    # Lines refused anywhere in the rendered config.
    FORBIDDEN = [
      [/(\A|\s)server-state-(file|base)(\s|\z)/, STATE_FILE],
      [/(\A|\s)load-server-state-from-file(\s|\z)/, STATE_FILE],
      [/(\A|\s)stats\s+admin(\s|\z)/, 'an admin listener over TCP is refused'],
      [/(\A|\s)agent-(check|port|addr|inter|send)(\s|\z)/,
       'agent options come from the agent attributes through AgentCheck only (no server is enrolled by hand)'],
    ].freeze
    WEIGHT = /(?:\A|\s)weight\s+(\S+)/.freeze
    DISABLED = /(\A|\s)disabled(\s|\z)/.freeze
    DEFAULT_SERVER = /\A\s*default-server\s/.freeze
    RESOLVERS = /(?:\A|\s)resolvers\s+\S/.freeze
    RESOLVE_OPTS = /(?:\A|\s)resolve-opts\s+(\S+)/.freeze
    # A server whose address HAProxy resolves at run time takes the weight of
    # each DNS SRV answer (Consul's is 1), undoing the agent's weight at
    # every resolution; `ignore-weight` keeps the weight the agent set.
    IGNORE_WEIGHT = 'resolve-opts ignore-weight'
    IGNORE_WEIGHT_WHY = "HAProxy would set the server's weight from every DNS SRV answer, undoing the agent's " \
                        'weight at each resolution'
    # HAProxy starts a `disabled` server in MAINT and the agent's first
    # `ready` puts it in service (`ready` clears MAINT whoever set it).
    DISABLED_WHY = "starts the server in MAINT and the agent's first 'ready' puts it in service; keep a " \
                   'server out with `gitlab-haproxy-agent state set <backend>/<server> maint` instead'

    module_function

    def build(attrs)
      attrs ||= {}
      haproxy = hash_attr(attrs['haproxy'], 'haproxy')
      agent = hash_attr(attrs['agent'], 'agent')
      enabled = enabled?(agent['enable'])

      defaults = lines_attr(haproxy['defaults'], 'haproxy.defaults')
      # A frontend, backend, server or server-template set to nil (null in a
      # role) is left out: how a role removes one the cookbook or another
      # role defined.
      backends_attr = present(hash_attr(haproxy['backends'], 'haproxy.backends'))
      plan = enabled ? agent_plan(agent, backends_attr.keys.map(&:to_s)) : nil

      if plan && backends_attr.keys.any? { |name| !plan[:excluded].include?(name.to_s) }
        refuse_disabled_default_server!(haproxy['defaults'], 'haproxy.defaults')
      end
      frontends_attr = present(hash_attr(haproxy['frontends'], 'haproxy.frontends'))
      check_proxy_names!(frontends_attr.keys.map(&:to_s), backends_attr.keys.map(&:to_s))

      Config.new(
        global: global_lines(haproxy),
        defaults: defaults,
        resolvers: present(hash_attr(haproxy['resolvers'], 'haproxy.resolvers')).map do |name, lines|
          resolvers(name.to_s, lines)
        end,
        frontends: frontends_attr.map { |name, fe| frontend(name.to_s, fe) },
        backends: backends_attr.map { |name, be| backend(name.to_s, be, plan, defaults) }
      )
    end

    def enabled?(value)
      return false if value.nil? || value == false
      return true if value == true

      raise ConfigError, "#{ATTR}.agent.enable must be true or false, got #{value.inspect}"
    end

    # Validated agent attributes and group memberships, once per render.
    def agent_plan(agent, backend_names)
      excluded = agent['excluded_backends'] || []
      unless excluded.is_a?(Array)
        raise ConfigError, "#{ATTR}.agent.excluded_backends must be a list of backend names"
      end

      excluded = excluded.map(&:to_s)
      excluded.each do |name|
        next if backend_names.include?(name)

        raise ConfigError, "#{ATTR}.agent.excluded_backends lists #{name.inspect}, which is not in " \
                           "#{ATTR}.haproxy.backends"
      end
      zones = agent['zones'] || []
      raise ConfigError, "#{ATTR}.agent.zones must be a list of zone names" unless zones.is_a?(Array)

      zones = zones.map(&:to_s)
      zones.each { |z| AgentCheck.check_group!(z, "#{ATTR}.agent.zones") }
      {
        addr: agent['addr'], port: agent['port'], inter: agent['inter'], excluded: excluded, zones: zones,
        groups: AgentCheck.memberships(agent['groups'], backend_names, excluded)
      }
    end

    # A frontend may not share its name with a backend: HAProxy 3.2 warns
    # ("backend 'x' has the same name as frontend 'x' ... will not be
    # supported anymore in version 3.3"), 3.3 refuses it, and `haproxy -c
    # -dW` fails on it. The frontend is the one to rename: backend names are
    # half of every row key (<backend>/<server>) written in Consul.
    def check_proxy_names!(frontend_names, backend_names)
      frontend_names.each do |name|
        next unless backend_names.include?(name)

        raise ConfigError, "#{ATTR}.haproxy.frontends.#{name}: a frontend named like backend #{name.inspect} " \
                           'is refused by HAProxy 3.3 (3.2 warns); rename the frontend, not the backend, ' \
                           'whose name is part of every row key <backend>/<server> in Consul'
      end
    end

    def global_lines(haproxy)
      lines = lines_attr(haproxy['global'], 'haproxy.global')
      lines.each do |line|
        next unless line.match?(/\A\s*stats\s+socket\s/)

        raise ConfigError, "#{ATTR}.haproxy.global: #{line.inspect}: set the socket with " \
                           "#{ATTR}.haproxy.stats_socket (a unix socket path)"
      end
      socket = haproxy['stats_socket']
      return lines if socket.nil? || socket.to_s.empty?

      socket = socket.to_s
      unless socket.match?(%r{\A/[^\s"'\#$\\]+\z})
        raise ConfigError, "#{ATTR}.haproxy.stats_socket #{socket.inspect} is not an absolute unix socket path: " \
                           'an admin listener over TCP is refused'
      end
      lines + ["stats socket #{socket} mode 600 level admin"]
    end

    # A resolvers section (nameservers and timers), for servers with
    # `resolvers <name>`: name => config line, as every list of lines.
    def resolvers(name, lines)
      AgentCheck.check_name!(name, 'resolvers name', "#{ATTR}.haproxy.resolvers")
      lines = lines_attr(lines, "haproxy.resolvers.#{name}")
      raise ConfigError, "#{ATTR}.haproxy.resolvers.#{name} has no line (a nameserver at least)" if lines.empty?

      Section.new(name: name, lines: lines, servers: [])
    end

    def frontend(name, attrs)
      attr = "haproxy.frontends.#{name}"
      attrs = hash_attr(attrs, attr)
      binds = attrs['bind'].is_a?(Array) ? attrs['bind'] : [attrs['bind']].compact
      raise ConfigError, "#{ATTR}.#{attr}.bind is empty" if binds.empty?

      lines = binds.map { |b| "bind #{b}" } + lines_attr(attrs['options'], "#{attr}.options")
      Section.new(name: name, lines: lines, servers: [])
    end

    def backend(name, attrs, plan, defaults)
      attr = "haproxy.backends.#{name}"
      attrs = hash_attr(attrs, attr)
      lines = lines_attr(attrs['options'], "#{attr}.options")
      enrolled = plan && !plan[:excluded].include?(name)
      if enrolled
        refuse_disabled_default_server!(attrs['options'], "#{attr}.options")
        lines.each do |line|
          next unless line.match?(/\A\s*(server|server-template)\s/)

          raise ConfigError, "#{ATTR}.#{attr}.options: #{line.inspect}: an enrolled backend takes its servers " \
                             "from #{ATTR}.#{attr}.servers and #{ATTR}.#{attr}.server_templates; a backend " \
                             "that writes its server inline goes in #{ATTR}.agent.excluded_backends"
        end
      end
      servers = present(hash_attr(attrs['servers'], "#{attr}.servers"))
      templates = present(hash_attr(attrs['server_templates'], "#{attr}.server_templates"))
      members = servers.map { |n, a| [n.to_s, a, false] } + templates.map { |n, a| [n.to_s, a, true] }
      own_groups = enrolled ? server_groups(name, attrs, members, plan) : {}
      servers = members.map do |member_name, member_attrs, template|
        server(name, member_name, member_attrs, enrolled ? plan : nil, lines, defaults,
               template: template, own_groups: own_groups[[member_name, template]])
      end
      Section.new(name: name, lines: lines, servers: servers)
    end

    # Each enrolled server's (and server-template's) own groups, in order: its
    # zone as zone-<zone>, then its `groups`. A backend is zonal when its
    # `zonal` attribute is true, or is unset and any of its servers has a
    # zone; every server of a zonal backend must then have one, or a zonal
    # drain would leave it serving. `zonal` false refuses zones.
    def server_groups(backend, attrs, members, plan)
      attr = "haproxy.backends.#{backend}"
      zonal = attrs['zonal']
      unless [nil, true, false].include?(zonal)
        raise ConfigError, "#{ATTR}.#{attr}.zonal must be true, false or null, got #{zonal.inspect}"
      end

      zoned = members.select { |_, a, _| a.is_a?(Hash) && !a['zone'].nil? }
      zonal = !zoned.empty? if zonal.nil?
      members.to_h do |name, member_attrs, template|
        servers_attr = "#{attr}.#{template ? 'server_templates' : 'servers'}"
        AgentCheck.check_name!(name, template ? 'server-template name' : 'server name', "#{ATTR}.#{servers_attr}")
        member_attr = "#{servers_attr}.#{name}"
        member_attrs = hash_attr(member_attrs, member_attr)
        zone = member_attrs['zone']
        if zonal && zone.nil?
          why = attrs['zonal'] == true ? "#{ATTR}.#{attr}.zonal is true" : "#{zoned.first[0]} has a zone"
          raise ConfigError, "#{ATTR}.#{member_attr}.zone: #{backend}/#{name} has no zone, but backend " \
                             "#{backend} is zonal (#{why}): a zonal drain would leave it serving; set its " \
                             "zone, or #{ATTR}.#{attr}.zonal to false and remove the zones"
        end
        if !zonal && !zone.nil?
          raise ConfigError, "#{ATTR}.#{member_attr}.zone: backend #{backend} has zonal false"
        end

        groups = []
        groups << zone_group(zone, "#{ATTR}.#{member_attr}.zone", plan[:zones]) unless zone.nil?
        extra = member_attrs['groups'] || []
        unless extra.is_a?(Array)
          raise ConfigError, "#{ATTR}.#{member_attr}.groups must be a list of group names, got #{extra.inspect}"
        end

        extra.each do |g|
          AgentCheck.check_group!(g, "#{ATTR}.#{member_attr}.groups")
          groups << g.to_s
        end
        (groups + plan[:groups][backend]).group_by(&:itself).each do |g, same|
          next if same.length == 1

          where = if plan[:groups][backend].include?(g)
                    "by its zone or groups and by #{ATTR}.agent.groups.#{g}, which covers its whole backend"
                  else
                    'by its zone and groups'
                  end
          raise ConfigError, "#{ATTR}.#{member_attr}: #{backend}/#{name} is given group #{g.inspect} twice, #{where}"
        end
        [[name, template], groups]
      end
    end

    def zone_group(zone, attr, zones)
      text = zone.to_s
      AgentCheck.check_group!(text, attr)
      if !zones.empty? && !zones.include?(text)
        raise ConfigError, "#{attr}: zone #{text.inspect} is not in #{ATTR}.agent.zones (#{zones.join(', ')})"
      end

      group = "#{AgentCheck::ZONE_GROUP_PREFIX}#{text}"
      AgentCheck.check_group!(group, attr)
      group
    end

    def server(backend, name, attrs, plan, backend_lines, defaults, template: false, own_groups: nil)
      attr = "haproxy.backends.#{backend}.#{template ? 'server_templates' : 'servers'}.#{name}"
      attrs = hash_attr(attrs, attr)
      address = attrs['address'].to_s.strip
      raise ConfigError, "#{ATTR}.#{attr}.address is empty" if address.empty?

      address = "#{address}:#{attrs['port']}" unless attrs['port'].nil?
      options = attrs['options'].is_a?(Array) ? attrs['options'].join(' ') : attrs['options'].to_s
      options = options.strip
      check_line!("server #{name} #{options}", "#{attr}.options")
      if attrs.key?('weight') && !attrs['weight'].nil?
        if options.match?(WEIGHT)
          raise ConfigError, "#{ATTR}.#{attr}: weight is set in both .weight and .options"
        end

        options = [options, "weight #{attrs['weight']}"].reject(&:empty?).join(' ')
      end
      head = template ? "server-template #{name} #{template_count(attrs['count'], attr)}" : "server #{name}"
      base = ["#{head} #{address}", options].reject(&:empty?).join(' ')
      return Server.new(name: name, base: base, agent: nil) unless plan

      if options.match?(DISABLED)
        raise ConfigError, "#{ATTR}.#{attr}.options: 'disabled' on an enrolled server #{DISABLED_WHY}"
      end
      weight, weight_attr = configured_weight(attrs, options, attr, backend_lines, backend, defaults)
      base = "#{base} #{IGNORE_WEIGHT}" if needs_ignore_weight?(options, attr, backend_lines, defaults)
      agent = AgentCheck.server_options(
        backend: backend, server: name, groups: own_groups + plan[:groups][backend],
        addr: plan[:addr], port: plan[:port], inter: plan[:inter],
        weight: weight, weight_attr: weight_attr, template: template
      )
      Server.new(name: name, base: base, agent: agent)
    end

    # True when the enrolled server resolves its address at run time
    # (`resolvers` on its line or on a default-server line that reaches it)
    # and its options do not already say `resolve-opts ...ignore-weight`. A
    # `resolve-opts` without ignore-weight is refused rather than amended:
    # which of two resolve-opts wins is HAProxy's business, not ours.
    def needs_ignore_weight?(options, attr, backend_lines, defaults)
      # Most specific first: the server's options, its backend's
      # default-server lines (the last one first), then the defaults'.
      reaching = [options, *backend_lines.grep(DEFAULT_SERVER).reverse, *defaults.grep(DEFAULT_SERVER).reverse]
      return false unless reaching.any? { |line| line.match?(RESOLVERS) }

      opts = reaching.map { |line| line.match(RESOLVE_OPTS) }.compact
      return true if opts.empty?
      return false if opts.first[1].split(',').include?('ignore-weight')

      raise ConfigError, "#{ATTR}.#{attr}: 'resolve-opts #{opts.first[1]}' on an enrolled server that resolves its " \
                         "address must include ignore-weight (resolve-opts #{opts.first[1]},ignore-weight): " \
                         "without it #{IGNORE_WEIGHT_WHY}"
    end

    # server-template's <num | range>: a count (1-1000) or a range N-M.
    def template_count(value, attr)
      text = value.to_s.strip
      m = text.match(/\A([1-9][0-9]*)(?:-([1-9][0-9]*))?\z/)
      ok = m && (m[2].nil? ? m[1].to_i <= 1000 : m[1].to_i <= m[2].to_i && m[2].to_i - m[1].to_i < 1000)
      return text if ok

      raise ConfigError, "#{ATTR}.#{attr}.count #{value.inspect} is not a server count (1-1000) or a range N-M"
    end

    # The weight HAProxy will configure for the server and the attribute it
    # comes from: the server's own, else its backend's default-server, else
    # the defaults section's; nil when none is set (HAProxy's default is 1).
    def configured_weight(attrs, options, attr, backend_lines, backend, defaults)
      return [attrs['weight'], "#{ATTR}.#{attr}.weight"] if attrs.key?('weight') && !attrs['weight'].nil?

      m = options.match(WEIGHT)
      return [m[1], "#{ATTR}.#{attr}.options"] if m

      [[backend_lines, "haproxy.backends.#{backend}.options"], [defaults, 'haproxy.defaults']].each do |lines, where|
        lines.reverse_each do |line|
          next unless line.match?(/\A\s*default-server\s/)

          m = line.match(WEIGHT)
          return [m[1], "#{ATTR}.#{where} (default-server)"] if m
        end
      end
      [nil, nil]
    end

    # Config lines from a hash of name => line (nil or false: left out), in
    # the hash's order. A list is refused: Chef unions the arrays of a role
    # and of the cookbook's defaults (same precedence level), so a role could
    # neither replace nor remove a line, and HAProxy would keep the first of
    # two conflicting ones.
    def lines_attr(value, attr)
      return [] if value.nil?
      if value.is_a?(Array)
        raise ConfigError, "#{ATTR}.#{attr} must be a hash of name => config line, not a list: Chef unions " \
                           "a role's list with the cookbook's (same precedence level), so no line could be " \
                           'replaced or removed; name each line, and set a name to null to drop its line'
      end
      raise ConfigError, "#{ATTR}.#{attr} must be a hash of name => config line" unless value.is_a?(Hash)

      value.each_with_object([]) do |(name, line), lines|
        next if line.nil? || line == false
        unless line.is_a?(String)
          raise ConfigError, "#{ATTR}.#{attr}.#{name} must be a config line (a string) or null, got #{line.inspect}"
        end
        raise ConfigError, "#{ATTR}.#{attr}.#{name} has a line break: #{line.inspect}" if line.include?("\n")

        line = line.strip
        check_line!(line, "#{attr}.#{name}")
        lines << line unless line.empty?
      end
    end

    # `disabled` on a default-server line reaches every server after it: of
    # its backend, or (in defaults) of every backend.
    def refuse_disabled_default_server!(lines, attr)
      return unless lines.is_a?(Hash)

      lines.each do |name, line|
        next unless line.is_a?(String) && line.match?(DEFAULT_SERVER) && line.match?(DISABLED)

        raise ConfigError, "#{ATTR}.#{attr}.#{name}: #{line.strip.inspect}: 'disabled' on a default-server line " \
                           "that reaches enrolled servers #{DISABLED_WHY}"
      end
    end

    def check_line!(line, attr)
      FORBIDDEN.each do |pattern, why|
        raise ConfigError, "#{ATTR}.#{attr}: #{line.inspect}: #{why}" if line.match?(pattern)
      end
    end

    def present(hash)
      hash.reject { |_, v| v.nil? }
    end

    def hash_attr(value, attr)
      return {} if value.nil?
      raise ConfigError, "#{ATTR}.#{attr} must be a hash" unless value.is_a?(Hash)

      value
    end
  end
end
