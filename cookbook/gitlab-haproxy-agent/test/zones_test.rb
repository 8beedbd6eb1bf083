# frozen_string_literal: true

require_relative 'test_helper'

# Per-server zones (zone-<zone> on the server's own agent-send line) and
# server-templates, rendered from the sample role.
class ZonesTest < Minitest::Test
  include CookbookTestHelpers

  # agent-send of every zoned server of the sample role.
  ZONED = {
    'web/web-01' => 'web/web-01 zone-b',
    'web/web-02' => 'web/web-02 zone-c',
    'web/web-03' => 'web/web-03 zone-d',
    'canary_web/web-cny-01' => 'canary_web/web-cny-01 zone-b canary',
    'canary_web/web-cny-02' => 'canary_web/web-cny-02 zone-c canary',
    'canary_api/api-cny-01' => 'canary_api/api-cny-01 zone-d canary',
  }.freeze
  TEMPLATE = 'server-template web-tpl 2 127.0.0.1:18104 check agent-check agent-addr 127.0.0.1 agent-port 9777 ' \
             'agent-inter 2s agent-send "zone-b\n"'

  def cfg(changes = {})
    render_cfg(sample_node(changes))
  end

  def sends(text)
    server_lines(text).transform_values { |l| l[/agent-send "([^"]*)\\n"\z/, 1] }
  end

  def web(change)
    { 'haproxy' => { 'backends' => { 'web' => change } } }
  end

  def test_each_server_sends_its_row_key_then_its_zone_then_its_backends_groups
    got = sends(cfg).slice(*ZONED.keys)
    assert_equal ZONED, got
    sends(cfg).each do |key, send|
      next if ZONED.key?(key) || send.nil?

      assert_equal key, send, "#{key}: not zonal, no group"
    end
  end

  def test_server_template_sends_its_groups_only
    text = cfg
    assert_equal ["    #{TEMPLATE}\n"], text.lines.grep(/server-template/)
    assert_includes text[/^backend web\n(.*?)\n\n/m, 1], TEMPLATE
  end

  def test_server_template_without_the_agent_renders_as_written
    text = render_cfg(sample_node('agent' => { 'enable' => false }))
    assert_equal ["    server-template web-tpl 2 127.0.0.1:18104 check\n"], text.lines.grep(/server-template/)
  end

  def test_server_template_carries_backend_groups_and_its_own
    change = { 'server_templates' => { 'web-tpl' => { 'groups' => %w[rack-7] } } }
    assert_includes cfg(web(change)), 'agent-send "zone-b rack-7\n"'
    node = sample_node('haproxy' => { 'backends' => { 'canary_api' => { 'server_templates' => {
                         'api-cny-tpl' => { 'count' => '3-4', 'address' => '127.0.0.1', 'port' => 18212, 'zone' => 'b' }
                       } } } })
    line = render_cfg(node).lines.grep(/api-cny-tpl/).first
    assert line.start_with?('    server-template api-cny-tpl 3-4 127.0.0.1:18212 agent-check '), line
    assert line.end_with?("agent-send \"zone-b canary\\n\"\n"), line
  end

  def test_server_groups_follow_the_zone
    change = { 'servers' => { 'web-01' => { 'groups' => %w[rack-1 hw-gen3] } } }
    assert_equal 'web/web-01 zone-b rack-1 hw-gen3', sends(cfg(web(change)))['web/web-01']
    change = { 'servers' => { 'ci-01' => { 'groups' => %w[rack-1] } } }
    node = sample_node('haproxy' => { 'backends' => { 'ci' => change } })
    assert_equal 'ci/ci-01 rack-1', sends(render_cfg(node))['ci/ci-01']
  end

  # --- refusals, naming the attribute ---

  def test_a_server_of_a_zonal_backend_without_a_zone_fails_naming_it
    err = assert_refused("#{ATTR}.haproxy.backends.web.servers.web-02.zone", /no zone/) do
      cfg(web('servers' => { 'web-02' => { 'zone' => nil } }))
    end
    assert_includes err.message, 'web/web-02'
    assert_refused("#{ATTR}.haproxy.backends.web.server_templates.web-tpl.zone", /zonal drain/) do
      cfg(web('server_templates' => { 'web-tpl' => { 'zone' => nil } }))
    end
  end

  def test_zonal_true_needs_every_zone_and_false_refuses_them
    node = sample_node('haproxy' => { 'backends' => { 'ci' => { 'zonal' => true } } })
    assert_refused("#{ATTR}.haproxy.backends.ci.servers.ci-01.zone", /zonal is true/) { render_cfg(node) }
    assert_refused("#{ATTR}.haproxy.backends.web.servers.web-01.zone", /zonal false/) do
      cfg(web('zonal' => false))
    end
    assert_refused("#{ATTR}.haproxy.backends.web.zonal", /true, false or null/) { cfg(web('zonal' => 'yes')) }
  end

  def test_refuses_a_zone_outside_agent_zones_or_a_bad_zone_name
    err = assert_refused("#{ATTR}.haproxy.backends.web.servers.web-03.zone", /agent.zones/) do
      cfg(web('servers' => { 'web-03' => { 'zone' => 'e' } }))
    end
    assert_includes err.message, '"e"'
    ['', 'b c', 'b$', 'b/c'].each do |zone|
      assert_refused("#{ATTR}.haproxy.backends.web.servers.web-03.zone") do
        cfg('agent' => { 'zones' => [] }, 'haproxy' => { 'backends' => { 'web' => { 'servers' => {
              'web-03' => { 'zone' => zone }
            } } } })
      end
    end
    assert_refused("#{ATTR}.agent.zones", /whitespace/) { cfg('agent' => { 'zones' => ['b c'] }) }
    assert_equal 'web/web-03 zone-e', sends(cfg('agent' => { 'zones' => [] }, **web('servers' => {
                                                  'web-03' => { 'zone' => 'e' }
                                                })))['web/web-03']
  end

  def test_refuses_a_group_given_twice
    node = sample_node('agent' => { 'groups' => { 'zone-b' => %w[web] } })
    assert_refused("#{ATTR}.haproxy.backends.web.servers.web-01", /agent.groups.zone-b/) { render_cfg(node) }
    assert_refused("#{ATTR}.haproxy.backends.web.servers.web-02", /twice/) do
      cfg(web('servers' => { 'web-02' => { 'groups' => %w[zone-c] } }))
    end
    assert_refused("#{ATTR}.haproxy.backends.web.servers.web-02.groups", /whitespace/) do
      cfg(web('servers' => { 'web-02' => { 'groups' => ['rack 1'] } }))
    end
    assert_refused("#{ATTR}.haproxy.backends.web.servers.web-02.groups", /list/) do
      cfg(web('servers' => { 'web-02' => { 'groups' => 'rack-1' } }))
    end
  end

  def test_a_server_template_no_group_can_reach_fails
    node = sample_node('haproxy' => { 'backends' => { 'ci' => { 'server_templates' => {
                         'ci-tpl' => { 'count' => 2, 'address' => '127.0.0.1', 'port' => 18303 }
                       } } } })
    assert_refused("#{ATTR}.haproxy.backends.ci.server_templates.ci-tpl", /no row key/) { render_cfg(node) }
  end

  def test_refuses_bad_server_templates
    [0, -1, 'x', '3-1', 1001, '1-1001', nil].each do |count|
      assert_refused("#{ATTR}.haproxy.backends.web.server_templates.web-tpl.count", /count/) do
        cfg(web('server_templates' => { 'web-tpl' => { 'count' => count } }))
      end
    end
    assert_refused("#{ATTR}.haproxy.backends.web.server_templates.web-tpl.weight", /share/) do
      cfg(web('server_templates' => { 'web-tpl' => { 'weight' => 0 } }))
    end
    assert_refused("#{ATTR}.haproxy.backends.web.server_templates", /'\$'/) do
      cfg(web('server_templates' => { 'web$' => { 'count' => 1, 'address' => '127.0.0.1', 'zone' => 'b' } }))
    end
    assert_refused("#{ATTR}.haproxy.backends.web.options", /server_templates/) do
      cfg(web('options' => { 'tpl' => 'server-template x 2 127.0.0.1:1' }))
    end
  end

  def test_rollback_renders_whatever_the_zones_say
    node = sample_node('agent' => { 'enable' => false },
                       'haproxy' => { 'backends' => { 'web' => { 'zonal' => true, 'servers' => {
                         'web-02' => { 'zone' => nil }
                       } } } })
    assert_equal fixture('sample_role.agent-disabled.haproxy.cfg'), render_cfg(node)
  end
end
