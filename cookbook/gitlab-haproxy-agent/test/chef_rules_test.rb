# frozen_string_literal: true

require_relative 'test_helper'

# The stand-in merges attributes by Chef's documented rules (the sources are
# cited in lib/chef_stand_in.rb), and the sample role renders under them.
class ChefRulesTest < Minitest::Test
  include CookbookTestHelpers

  def role(default: {}, override: {})
    { 'default_attributes' => default, 'override_attributes' => override }
  end

  def merged(*roles, **levels)
    ChefStandIn.node(roles: roles, **levels).to_h
  end

  # docs.chef.io "Attribute Arrays", Attribute Array Logic: hashes merge
  # ("Addition", "multi-level hash"), strings are replaced ("Substitution").
  def test_hashes_merge_and_scalars_are_replaced
    base = role(default: { 'x' => { 'y' => '2', 's' => '1' } })
    other = role(default: { 'x' => { 'z' => '3', 's' => '9' } })
    assert_equal({ 'y' => '2', 's' => '9', 'z' => '3' }, merged(base, other)['x'])
  end

  # "Attribute Arrays": "When an attribute value is an array, if the attribute
  # precedence levels are the same, then that data is merged" ([ '1', '2' ] +
  # [ '3' ] = [ '1', '2', '3' ]); Chef's deep_merge! makes it a union (`|=`).
  def test_arrays_of_the_same_level_are_unioned
    a = role(default: { 'list' => %w[1 2] })
    b = role(default: { 'list' => %w[2 3] })
    assert_equal %w[1 2 3], merged(a, b)['list']
  end

  # "Attribute Precedence": default applies cookbook attribute file, then
  # role; so a role's default_attributes meet the cookbook's defaults at the
  # same level, and their arrays are unioned, not replaced.
  def test_role_default_arrays_union_with_the_cookbook_defaults
    cookbook = ChefStandIn.cookbook_defaults[ATTR]['agent']['excluded_backends']
    node = merged(role(default: { ATTR => { 'agent' => { 'excluded_backends' => %w[a] } } }))
    assert_equal cookbook | %w[a], node[ATTR]['agent']['excluded_backends']
    node = merged(role(default: { ATTR => { 'settings' => { 'consul_addr' => 'http://127.0.0.1:18500' } } }))
    assert_equal 'http://127.0.0.1:18500', node[ATTR]['settings']['consul_addr']
  end

  # "Attribute Arrays": "If the attribute value precedence levels in an array
  # are different, then that data is replaced" (hash_only_merge! between
  # levels).
  def test_a_higher_level_replaces_arrays
    r = role(default: { 'list' => %w[1 2] }, override: { 'list' => %w[3] })
    assert_equal %w[3], merged(r)['list']
    assert_equal %w[4], merged(role(default: { 'list' => %w[1] }), normal: { 'list' => %w[4] })['list']
    assert_equal %w[5], merged(role(default: { 'list' => %w[1] }), automatic: { 'list' => %w[5] })['list']
  end

  # "Attribute Precedence": default < normal < override < automatic, the last
  # one winning.
  def test_levels_apply_in_chefs_order
    r = role(default: { 'v' => 'default', 'h' => { 'd' => 1 } }, override: { 'v' => 'override', 'h' => { 'o' => 1 } })
    node = merged(r, normal: { 'v' => 'normal', 'h' => { 'n' => 1 } })
    assert_equal 'override', node['v']
    assert_equal({ 'd' => 1, 'n' => 1, 'o' => 1 }, node['h'])
    assert_equal 'ohai', merged(r, automatic: { 'v' => 'ohai' })['v']
  end

  # Chef's deep_merge!: an explicit nil replaces the value below (only a key
  # the source does not have keeps it), which is how a role drops a line.
  def test_an_explicit_nil_replaces_and_an_absent_key_keeps
    a = role(default: { 'h' => { 'keep' => 'k', 'drop' => 'd' } })
    b = role(default: { 'h' => { 'drop' => nil } })
    assert_equal({ 'keep' => 'k', 'drop' => nil }, merged(a, b)['h'])
  end

  # The "Attribute Arrays" page's own example: role web extends role
  # baseline's override_attributes; the deep merge keeps baseline's other keys.
  def test_the_documented_baseline_and_web_roles
    baseline = role(override: { 'apache' => { 'listen_ports' => [80], 'prefork' => {
                      'startservers' => 20, 'minspareservers' => 20, 'maxspareservers' => 40
                    } } })
    web = role(override: { 'apache' => { 'prefork' => { 'startservers' => 30 } } })
    assert_equal({ 'startservers' => 30, 'minspareservers' => 20, 'maxspareservers' => 40 },
                 merged(baseline, web)['apache']['prefork'])
    assert_equal [80], merged(baseline, web)['apache']['listen_ports']
  end

  # --- the cookbook's attributes under these rules ---

  def test_sample_role_global_is_its_three_lines_not_a_union_with_the_defaults
    cfg = render_cfg(sample_node)
    global = cfg[/^global\n(.*?)\n\n/m, 1].lines.map(&:strip)
    assert_equal ['log stderr format short local0 notice', 'maxconn 4096', 'stats timeout 30s',
                  'stats socket /run/haproxy/admin.sock mode 600 level admin'], global
    assert_equal 1, cfg.scan(/^\s*maxconn /).size
  end

  def test_sample_role_renders_exactly_the_fixture
    assert_equal fixture('sample_role.haproxy.cfg'), render_cfg(ChefStandIn.node(roles: [ChefStandIn::SAMPLE_ROLE]))
  end

  def test_a_role_replaces_a_line_by_name_drops_it_with_nil_and_adds_new_names_after
    r = role(default: { ATTR => { 'haproxy' => {
               'defaults' => { 'retries' => 'retries 5', 'redispatch' => nil, 'timeout_queue' => 'timeout queue 10s' }
             } } })
    node = ChefStandIn.node(roles: [ChefStandIn::SAMPLE_ROLE, r])
    defaults = render_cfg(node)[/^defaults\n(.*?)\n\n/m, 1].lines.map(&:strip)
    assert_equal ['log global', 'mode http', 'option httplog', 'option dontlognull', 'retries 5',
                  'timeout connect 5s', 'timeout client 90s', 'timeout server 90s', 'timeout check 2s',
                  'timeout queue 10s'], defaults
  end

  def test_two_roles_extend_one_backend
    extra = role(default: { ATTR => { 'haproxy' => { 'backends' => { 'web' => {
                   'options' => { 'balance' => 'balance leastconn', 'retry_on' => 'retry-on conn-failure' },
                   'servers' => { 'web-04' => { 'address' => '127.0.0.1', 'port' => 18105, 'zone' => 'c',
                                                'options' => 'check' } }
                 } } } } })
    lines = server_lines(render_cfg(ChefStandIn.node(roles: [ChefStandIn::SAMPLE_ROLE, extra])))
    assert_equal %w[web/web-01 web/web-02 web/web-03 web/web-04], lines.keys.grep(%r{\Aweb/})
    cfg = render_cfg(ChefStandIn.node(roles: [ChefStandIn::SAMPLE_ROLE, extra]))
    web = cfg[/^backend web\n(.*?)\n\n/m, 1]
    assert_includes web, "    balance leastconn\n    option httpchk"
    assert_includes web, "    retry-on conn-failure\n    server web-01 "
    refute_includes web, 'roundrobin'
  end

  def test_a_role_removes_a_server_a_backend_or_a_frontend_with_nil
    r = role(default: { ATTR => { 'haproxy' => {
               'frontends' => { 'pages_tcp' => nil },
               'backends' => { 'pages' => nil, 'web' => { 'servers' => { 'web-03' => nil } } }
             } } })
    cfg = render_cfg(ChefStandIn.node(roles: [ChefStandIn::SAMPLE_ROLE, r]))
    refute_match(/pages/, cfg)
    assert_equal %w[web/web-01 web/web-02], server_lines(cfg).keys.grep(%r{\Aweb/})
  end

  def test_a_list_of_lines_is_refused_naming_the_attribute
    %w[global defaults].each do |section|
      r = role(default: { ATTR => { 'haproxy' => { section => ['maxconn 4096'] } } })
      assert_refused("#{ATTR}.haproxy.#{section}", /not a list/) do
        render_cfg(ChefStandIn.node(roles: [ChefStandIn::SAMPLE_ROLE, r]))
      end
    end
    node = sample_node('haproxy' => { 'backends' => { 'web' => { 'options' => ['balance roundrobin'] } } })
    assert_refused("#{ATTR}.haproxy.backends.web.options", /union/) { render_cfg(node) }
    node = sample_node('haproxy' => { 'frontends' => { 'main' => { 'options' => { 'mode' => 7 } } } })
    assert_refused("#{ATTR}.haproxy.frontends.main.options.mode", /string/) { render_cfg(node) }
    node = sample_node('haproxy' => { 'global' => { 'x' => "maxconn 1\nmaxconn 2" } })
    assert_refused("#{ATTR}.haproxy.global.x", /line break/) { render_cfg(node) }
  end
end
