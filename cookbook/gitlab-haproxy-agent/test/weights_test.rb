# frozen_string_literal: true

require_relative 'test_helper'
require_relative '../libraries/weights'

# Enrolled backends whose balance algorithm ignores runtime weights: warned
# about, or refused with agent.weights true.
class WeightsTest < Minitest::Test
  include CookbookTestHelpers

  def attrs(changes)
    sample_node(changes).to_h[ATTR]
  end

  def balanced(line, extra = {})
    { 'agent' => { 'enable' => true }.merge(extra),
      'haproxy' => { 'backends' => { 'web' => { 'options' => { 'balance' => line } } } } }
  end

  def test_the_sample_role_has_no_static_algorithm
    assert_equal [], GitlabHaproxyAgent::Weights.check(attrs('agent' => { 'enable' => true }))
  end

  def test_static_algorithms_are_warned_about
    ['balance source', 'balance uri', 'balance url_param userid', 'balance hdr(host)',
     'balance rdp-cookie', 'balance hash path', 'balance static-rr', 'balance first'].each do |line|
      warnings = GitlabHaproxyAgent::Weights.check(attrs(balanced(line)))
      assert_equal 1, warnings.length, line
      assert_includes warnings.first, "#{ATTR}.haproxy.backends.web: `#{line}`"
      assert_includes warnings.first, 'answered and not applied'
    end
  end

  def test_dynamic_algorithms_and_consistent_hashing_are_not
    ['balance roundrobin', 'balance leastconn', 'balance random'].each do |line|
      assert_equal [], GitlabHaproxyAgent::Weights.check(attrs(balanced(line))), line
    end
    consistent = balanced('balance source')
    consistent['haproxy']['backends']['web']['options']['hash'] = 'hash-type consistent'
    assert_equal [], GitlabHaproxyAgent::Weights.check(attrs(consistent))
    # static-rr ignores weights whatever the hash-type.
    consistent['haproxy']['backends']['web']['options']['balance'] = 'balance static-rr'
    assert_equal 1, GitlabHaproxyAgent::Weights.check(attrs(consistent)).length
  end

  def test_excluded_backends_and_a_disabled_agent_are_not_checked
    excluded = balanced('balance source', 'excluded_backends' => ['web'])
    assert_equal [], GitlabHaproxyAgent::Weights.check(attrs(excluded))
    disabled = balanced('balance source', 'enable' => false)
    assert_equal [], GitlabHaproxyAgent::Weights.check(attrs(disabled))
  end

  def test_agent_weights_true_fails_the_run
    assert_refused("#{ATTR}.haproxy.backends.web", /agent\.weights is true/) do
      GitlabHaproxyAgent::Weights.check(attrs(balanced('balance source', 'weights' => true)))
    end
    assert_refused("#{ATTR}.agent.weights") do
      GitlabHaproxyAgent::Weights.check(attrs(balanced('balance source', 'weights' => 'yes')))
    end
  end

  def test_the_recipe_logs_a_warning
    recipe = File.read(File.join(ChefStandIn::COOKBOOK, 'recipes', 'haproxy.rb'))
    assert_includes recipe, 'GitlabHaproxyAgent::Weights.check(attrs).each { |warning| Chef::Log.warn(warning) }'
  end
end
