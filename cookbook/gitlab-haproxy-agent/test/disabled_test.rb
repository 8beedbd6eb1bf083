# frozen_string_literal: true

require_relative 'test_helper'
require 'open3'
require 'tmpdir'

# `disabled` starts a server in MAINT, and the agent's first `ready` puts it
# in service: wherever it would reach an enrolled server (its own line, its
# backend's default-server, the defaults section's default-server, a
# server-template) the render is refused, naming the attribute. What the
# cookbook still renders passes `haproxy -c`.
class DisabledTest < Minitest::Test
  include CookbookTestHelpers

  def backend_option(backend, line)
    { 'haproxy' => { 'backends' => { backend => { 'options' => { 'default_server' => line } } } } }
  end

  def test_disabled_on_a_backend_default_server_is_refused
    node = sample_node(backend_option('web', 'default-server inter 3s fall 3 rise 2 weight 100 disabled'))
    error = assert_refused("#{ATTR}.haproxy.backends.web.options.default_server", /disabled/) { render_cfg(node) }
    assert_match(/state set .* maint/, error.message)
  end

  def test_disabled_on_the_defaults_default_server_is_refused
    node = sample_node('haproxy' => { 'defaults' => { 'default_server' => 'default-server disabled' } })
    assert_refused("#{ATTR}.haproxy.defaults.default_server", /disabled/) { render_cfg(node) }
  end

  def test_disabled_on_a_server_template_is_refused
    node = sample_node('haproxy' => { 'backends' => { 'web' => { 'server_templates' => {
                         'web-tpl' => { 'options' => 'check disabled' },
                       } } } })
    assert_refused("#{ATTR}.haproxy.backends.web.server_templates.web-tpl.options", /disabled/) { render_cfg(node) }
  end

  def test_disabled_on_a_server_line_is_refused
    node = sample_node('haproxy' => { 'backends' => { 'web' => { 'servers' => {
                         'web-01' => { 'options' => 'check disabled' },
                       } } } })
    assert_refused("#{ATTR}.haproxy.backends.web.servers.web-01.options", /disabled/) { render_cfg(node) }
  end

  # Where no enrolled server takes it, `disabled` stays HAProxy's: an
  # excluded backend, or the agent off. Both renders pass `haproxy -c`.
  def test_disabled_where_no_enrolled_server_takes_it_is_rendered_and_valid
    excluded = sample_node(backend_option('asset_proxy', 'default-server disabled'))
    off = ChefStandIn.node(override: { ATTR => { 'agent' => { 'enable' => false },
                                                 'haproxy' => { 'defaults' => {
                                                   'default_server' => 'default-server disabled',
                                                 } } } })
    [render_cfg(excluded), render_cfg(off)].each do |cfg|
      assert_match(/^\s+default-server disabled$/, cfg)
      Dir.mktmpdir('cookbook-disabled', '/tmp') do |dir|
        path = File.join(dir, 'haproxy.cfg')
        File.write(path, cfg.gsub(%r{/run/haproxy/admin.sock}, File.join(dir, 'admin.sock')))
        out, status = Open3.capture2e('haproxy', '-c', '-f', path)
        assert status.success?, "haproxy -c: #{out}"
      end
    end
  end
end
