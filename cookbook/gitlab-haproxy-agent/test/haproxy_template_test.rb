# frozen_string_literal: true

require_relative 'test_helper'

# haproxy.cfg.erb rendered with Erubis over the sample role, as Chef renders it.
class HaproxyTemplateTest < Minitest::Test
  include CookbookTestHelpers

  AGENT_SUFFIX = / agent-check agent-addr \S+ agent-port \S+ agent-inter \S+ agent-send "[^"]*"$/.freeze
  CANARY = %w[canary_web/web-cny-01 canary_web/web-cny-02 canary_api/api-cny-01].freeze

  def enabled
    @enabled ||= render_cfg(sample_node)
  end

  def disabled
    @disabled ||= render_cfg(sample_node('agent' => { 'enable' => false }))
  end

  def test_enabled_sample_matches_the_reviewed_config
    assert_equal fixture('sample_role.haproxy.cfg'), enabled
  end

  def test_disabled_renders_byte_for_byte_the_config_without_agent_options
    assert_equal fixture('sample_role.agent-disabled.haproxy.cfg'), disabled
    refute_match(/agent-(check|port|addr|inter|send)/, disabled)
  end

  def test_disabled_differs_from_enabled_only_by_the_agent_options
    stripped = enabled.lines.map { |l| l.chomp.sub(AGENT_SUFFIX, '') + "\n" }.join
    assert_equal disabled, stripped
    refute_equal disabled, enabled
  end

  def test_cookbook_default_is_disabled
    node = ChefStandIn.node(override: { ATTR => { 'agent' => { 'enable' => nil } } })
    assert_equal false, ChefStandIn.cookbook_defaults[ATTR]['agent']['enable']
    assert_equal disabled, render_cfg(node)
  end

  def test_every_server_of_an_enrolled_backend_is_enrolled_once
    lines = server_lines(enabled)
    enrolled = lines.reject { |k, _| k.start_with?('asset_proxy/') }
    assert_equal 14, enrolled.size
    enrolled.each do |key, line|
      assert_match AGENT_SUFFIX, line
      assert_equal 1, line.scan('agent-check').size, line
      assert_includes line, "agent-send \"#{key}"
      assert_includes line, 'agent-addr 127.0.0.1 agent-port 9777 agent-inter 2s '
    end
  end

  def test_canary_group_comes_from_the_groups_attribute
    server_lines(enabled).each do |key, line|
      next if key.start_with?('asset_proxy/')

      if CANARY.include?(key)
        assert_match(/ agent-send "#{Regexp.escape(key)} zone-[bcd] canary\\n"\z/, line)
      else
        refute_includes line, 'canary'
      end
    end
  end

  def test_server_names_alone_never_make_a_group_member
    node = sample_node('agent' => { 'groups' => { 'canary' => ['canary_web'] } })
    lines = server_lines(render_cfg(node))
    assert lines['canary_web/web-cny-01'].end_with?('"canary_web/web-cny-01 zone-b canary\n"')
    assert lines['canary_api/api-cny-01'].end_with?('"canary_api/api-cny-01 zone-d\n"'), 'a -cny- name is not a group'
  end

  def test_excluded_inline_backend_is_rendered_as_written
    assert_includes enabled, "backend asset_proxy\n    http-request set-header Host assets.example.internal\n" \
                             "    server asset_proxy 127.0.0.1:18601\n"
    assert_equal ['asset_proxy/asset_proxy'], server_lines(enabled).keys.grep(/\Aasset_proxy/)
  end

  def test_excluded_backend_servers_from_attributes_are_not_enrolled
    node = sample_node('agent' => { 'excluded_backends' => %w[asset_proxy registry] },
                       'haproxy' => { 'backends' => { 'registry' => {
                         'options' => { 'default_server' => 'default-server weight 0' }
                       } } })
    lines = server_lines(render_cfg(node))
    assert_equal 'server registry-01 127.0.0.1:18501 check weight 100', lines['registry/registry-01']
    assert_match AGENT_SUFFIX, lines['web/web-01']
  end

  def test_groups_from_several_definitions_keep_their_order
    node = sample_node('agent' => { 'groups' => { 'canary' => %w[canary_web], 'east' => %w[canary_web web] } })
    lines = server_lines(render_cfg(node))
    assert lines['canary_web/web-cny-02'].end_with?('agent-send "canary_web/web-cny-02 zone-c canary east\n"')
    assert lines['web/web-03'].end_with?('agent-send "web/web-03 zone-d east\n"')
  end

  def test_rendered_config_has_no_state_file_and_no_admin_tcp_listener
    [enabled, disabled].each do |cfg|
      refute_match(/server-state|load-server-state-from-file/, cfg)
      refute_match(/stats\s+admin/, cfg)
      sockets = cfg.lines.grep(/\A\s*stats\s+socket\s/)
      assert_equal ["    stats socket /run/haproxy/admin.sock mode 600 level admin\n"], sockets
      cfg.lines.grep(/\A\s*bind\s/).each { |l| assert_match(/\A\s*bind 127\.0\.0\.1:\d+\n\z/, l) }
    end
  end

  def test_sample_uses_loopback_addresses_only
    ips = enabled.scan(/\b(\d{1,3}(?:\.\d{1,3}){3})\b/).flatten.uniq
    assert_equal ['127.0.0.1'], ips
  end

  # --- refusals surface when rendering, naming the attribute ---

  def test_refuses_servers_enrolled_by_hand
    node = sample_node('haproxy' => { 'backends' => { 'web' => { 'servers' => {
                         'web-01' => { 'options' => 'check agent-check agent-port 9777' }
                       } } } })
    assert_refused("#{ATTR}.haproxy.backends.web.servers.web-01.options", /by hand/) { render_cfg(node) }
    node = sample_node('haproxy' => { 'backends' => { 'web' => { 'options' => { 'agent' => 'default-server agent-check' } } } })
    assert_refused("#{ATTR}.haproxy.backends.web.options", /by hand/) { render_cfg(node) }
    node = sample_node('haproxy' => { 'defaults' => { 'agent' => 'default-server agent-port 9777' } })
    assert_refused("#{ATTR}.haproxy.defaults", /by hand/) { render_cfg(node) }
    disabled_node = sample_node('agent' => { 'enable' => false },
                                'haproxy' => { 'defaults' => { 'agent' => 'default-server agent-port 9777' } })
    assert_refused("#{ATTR}.haproxy.defaults", /by hand/) { render_cfg(disabled_node) }
  end

  def test_refuses_an_inline_server_in_an_enrolled_backend
    inline = { 'web09' => 'server web-09 127.0.0.1:1 check' }
    node = sample_node('haproxy' => { 'backends' => { 'web' => { 'options' => inline } } })
    error = assert_refused("#{ATTR}.haproxy.backends.web.options", /excluded_backends/) { render_cfg(node) }
    assert_includes error.message, 'web-09'
  end

  def test_refuses_weight_zero_wherever_it_is_configured
    cases = {
      "#{ATTR}.haproxy.backends.api.servers.api-01.weight" =>
        { 'backends' => { 'api' => { 'servers' => { 'api-01' => { 'weight' => 0 } } } } },
      "#{ATTR}.haproxy.backends.ci.servers.ci-01.options" =>
        { 'backends' => { 'ci' => { 'servers' => { 'ci-01' => { 'weight' => nil, 'options' => 'check weight 0' } } } } },
      "#{ATTR}.haproxy.backends.web.options (default-server)" =>
        { 'backends' => { 'web' => { 'options' => { 'default_server' => 'default-server inter 3s weight 0' } } } },
      "#{ATTR}.haproxy.defaults (default-server)" =>
        { 'defaults' => { 'default_server' => 'default-server weight 0' },
          'backends' => { 'web' => { 'options' => { 'default_server' => 'default-server inter 3s' } } } },
    }
    cases.each do |attr, change|
      assert_refused(attr, /share of the configured weight/) { render_cfg(sample_node('haproxy' => change)) }
    end
  end

  def test_weight_zero_is_fine_without_enrollment
    change = { 'backends' => { 'api' => { 'servers' => { 'api-01' => { 'weight' => 0 } } } } }
    cfg = render_cfg(sample_node('agent' => { 'enable' => false }, 'haproxy' => change))
    assert_includes cfg, "    server api-01 127.0.0.1:18201 check weight 0\n"
  end

  def test_refuses_disabled_on_an_enrolled_server
    node = sample_node('haproxy' => { 'backends' => { 'web' => { 'servers' => {
                         'web-02' => { 'options' => 'check disabled' }
                       } } } })
    assert_refused("#{ATTR}.haproxy.backends.web.servers.web-02.options", /ready/) { render_cfg(node) }
  end

  def test_refuses_state_files_and_admin_tcp_listeners
    [
      ["#{ATTR}.haproxy.global.state", { 'global' => { 'state' => 'server-state-file /var/lib/haproxy/state' } }],
      ["#{ATTR}.haproxy.global.state", { 'global' => { 'state' => 'server-state-base /var/lib/haproxy' } }],
      ["#{ATTR}.haproxy.defaults.state", { 'defaults' => { 'state' => 'load-server-state-from-file global' } }],
      ["#{ATTR}.haproxy.backends.web.options.state",
       { 'backends' => { 'web' => { 'options' => { 'state' => 'load-server-state-from-file local' } } } }],
    ].each do |attr, change|
      assert_refused(attr, /server-state file/) { render_cfg(sample_node('haproxy' => change)) }
    end
    assert_refused("#{ATTR}.haproxy.global", /stats_socket/) do
      render_cfg(sample_node('haproxy' => { 'global' => { 'socket' => 'stats socket ipv4@127.0.0.1:9999 level admin' } }))
    end
    assert_refused("#{ATTR}.haproxy.stats_socket", /TCP/) do
      render_cfg(sample_node('haproxy' => { 'stats_socket' => 'ipv4@127.0.0.1:9999' }))
    end
    assert_refused("#{ATTR}.haproxy.frontends.main.options.stats", /admin listener/) do
      options = { 'stats' => 'stats admin if TRUE' }
      render_cfg(sample_node('haproxy' => { 'frontends' => { 'main' => { 'options' => options } } }))
    end
  end

  def test_refuses_names_and_options_through_the_template
    node = sample_node('agent' => { 'port' => '' })
    assert_refused("#{ATTR}.agent.port", /empty/) { render_cfg(node) }
    node = sample_node('agent' => { 'groups' => { 'canary' => %w[canary_web canary_wbe] } })
    assert_refused("#{ATTR}.agent.groups.canary", /canary_wbe/) { render_cfg(node) }
    node = sample_node('agent' => { 'excluded_backends' => %w[asset_proxi] })
    assert_refused("#{ATTR}.agent.excluded_backends", /asset_proxi/) { render_cfg(node) }
    node = sample_node('haproxy' => { 'backends' => { 'web' => { 'servers' => { 'web$1' => { 'address' => '127.0.0.1' } } } } })
    assert_refused("#{ATTR}.haproxy.backends.web.servers", /'\$'/) { render_cfg(node) }
    node = sample_node('agent' => { 'enable' => 'false' })
    assert_refused("#{ATTR}.agent.enable", /true or false/) { render_cfg(node) }
  end

  def test_refuses_a_frontend_named_like_a_backend
    node = sample_node('haproxy' => { 'frontends' => { 'pages' => { 'bind' => ['127.0.0.1:18083'],
                                                                     'options' => { 'mode' => 'mode tcp' } } } })
    assert_refused("#{ATTR}.haproxy.frontends.pages", /rename the frontend/) { render_cfg(node) }
    disabled_node = sample_node('agent' => { 'enable' => false },
                                'haproxy' => { 'frontends' => { 'web' => { 'bind' => ['127.0.0.1:18083'] } } })
    assert_refused("#{ATTR}.haproxy.frontends.web", /3\.3/) { render_cfg(disabled_node) }
  end

  def test_rollback_renders_even_when_agent_attributes_are_wrong
    node = sample_node('agent' => { 'enable' => false, 'port' => '', 'groups' => { 'canary' => ['gone'] },
                                    'excluded_backends' => ['gone'] })
    assert_equal fixture('sample_role.agent-disabled.haproxy.cfg'), render_cfg(node)
  end

  # --- servers resolved through DNS (server-template with resolvers) ---

  RESOLVERS = { 'consul' => { 'nameserver' => 'nameserver consul 127.0.0.1:8600',
                              'hold_valid' => 'hold valid 10s' } }.freeze

  def dns_node(template_options, agent_enable: true, backend_options: {})
    sample_node('agent' => { 'enable' => agent_enable },
                'haproxy' => { 'resolvers' => RESOLVERS, 'backends' => { 'web' => {
                  'options' => backend_options,
                  'server_templates' => { 'web-tpl' => { 'address' => '_web._tcp.service.consul', 'port' => nil,
                                                         'options' => template_options } }
                } } })
  end

  def template_line(cfg)
    cfg.lines.find { |l| l.include?('server-template web-tpl ') }.strip
  end

  def test_resolvers_sections_are_rendered_before_the_proxies
    cfg = render_cfg(dns_node('check resolvers consul init-addr none'))
    assert_includes cfg, "\nresolvers consul\n    nameserver consul 127.0.0.1:8600\n    hold valid 10s\n"
    assert_operator cfg.index('resolvers consul'), :<, cfg.index('frontend main')
    assert_refused("#{ATTR}.haproxy.resolvers.consul", /nameserver/) do
      render_cfg(sample_node('haproxy' => { 'resolvers' => { 'consul' => {} } }))
    end
  end

  def test_an_enrolled_server_resolved_at_run_time_ignores_the_srv_weight
    line = template_line(render_cfg(dns_node('check resolvers consul init-addr none')))
    assert_equal 'server-template web-tpl 2 _web._tcp.service.consul check resolvers consul init-addr none ' \
                 'resolve-opts ignore-weight agent-check agent-addr 127.0.0.1 agent-port 9777 agent-inter 2s ' \
                 'agent-send "zone-b\\n"', line
    # resolvers on a default-server line reaches the template too.
    line = template_line(render_cfg(dns_node('check init-addr none',
                                             backend_options: { 'dns' => 'default-server resolvers consul' })))
    assert_includes line, ' resolve-opts ignore-weight agent-check '
    # Already said: not said twice.
    line = template_line(render_cfg(dns_node('check resolvers consul resolve-opts allow-dup-ip,ignore-weight')))
    assert_equal 1, line.scan('resolve-opts').size, line
    # Without resolvers (address resolved once at start) nothing changes.
    refute_includes template_line(render_cfg(dns_node('check'))), 'resolve-opts'
    # Not enrolled: HAProxy's own behaviour, SRV weights included.
    refute_includes template_line(render_cfg(dns_node('check resolvers consul', agent_enable: false))),
                    'resolve-opts'
  end

  def test_refuses_resolve_opts_without_ignore_weight_on_an_enrolled_server
    assert_refused("#{ATTR}.haproxy.backends.web.server_templates.web-tpl", /ignore-weight/) do
      render_cfg(dns_node('check resolvers consul resolve-opts allow-dup-ip'))
    end
    assert_refused("#{ATTR}.haproxy.backends.web.server_templates.web-tpl", /SRV/) do
      render_cfg(dns_node('check resolvers consul', backend_options: { 'dns' => 'default-server resolve-opts prevent-dup-ip' }))
    end
  end
end
