# frozen_string_literal: true

require 'minitest/autorun'
require_relative 'lib/chef_stand_in'

module CookbookTestHelpers
  ATTR = GitlabHaproxyAgent::ATTR
  AGENT = { addr: '127.0.0.1', port: 9777, inter: '2s' }.freeze

  # The sample role's node with `changes` (same shape, under
  # gitlab-haproxy-agent) set at the override level, as a wrapper cookbook's
  # override[...] would: hashes merge into the role's, arrays and values
  # replace them (Chef's rules, see lib/chef_stand_in.rb).
  def sample_node(changes = {})
    ChefStandIn.node(override: { ATTR => changes })
  end

  def render_cfg(node)
    ChefStandIn.render('haproxy.cfg.erb', node)
  end

  def fixture(name)
    File.read(File.join(ChefStandIn::COOKBOOK, 'test', 'fixtures', name))
  end

  # Asserts a ConfigError whose message names `attr` (and matches `pattern`).
  def assert_refused(attr, pattern = nil, &block)
    error = assert_raises(GitlabHaproxyAgent::ConfigError, &block)
    assert_includes error.message, attr
    assert_match pattern, error.message if pattern
    error
  end

  # server lines of a rendered config: { "backend/server" => line }
  def server_lines(cfg)
    backend = nil
    cfg.each_line.with_object({}) do |line, out|
      backend = Regexp.last_match(1) if line =~ /\Abackend (\S+)/
      out["#{backend}/#{Regexp.last_match(1)}"] = line.strip if line =~ /\A\s+server (\S+) /
    end
  end
end
