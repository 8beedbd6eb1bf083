# frozen_string_literal: true

require_relative 'test_helper'
require 'open3'
require 'rbconfig'

# test/render_sample.rb, the script other tests use to get a runnable config.
class RenderSampleTest < Minitest::Test
  include CookbookTestHelpers

  SCRIPT = File.join(ChefStandIn::COOKBOOK, 'test', 'render_sample.rb')
  CLEAN_ENV = %w[SAMPLE_SERVER_ADDR SAMPLE_SERVERS SAMPLE_BINDS SAMPLE_AGENT_PORT SAMPLE_AGENT_ADDR
                 SAMPLE_AGENT_INTER SAMPLE_STATS_SOCKET SAMPLE_AGENT_ENABLE SAMPLE_ROLE].to_h { |k| [k, nil] }

  def run_script(*args, env: {})
    out, err, status = Open3.capture3(CLEAN_ENV.merge(env), RbConfig.ruby, SCRIPT, *args)
    [out, err, status.exitstatus]
  end

  def test_without_arguments_prints_the_reviewed_sample
    out, err, code = run_script
    assert_equal [0, ''], [code, err]
    assert_equal fixture('sample_role.haproxy.cfg'), out
  end

  def test_points_servers_agent_socket_and_binds_where_asked
    out, _, code = run_script('--server-addr', '127.0.0.1:40001', '--server', 'canary_web/web-cny-02=127.0.0.1:40002',
                              '--bind', 'main=127.0.0.1:40003', '--agent-port', '40004', '--agent-inter', '200ms',
                              '--stats-socket', '/tmp/sample-test/admin.sock')
    assert_equal 0, code
    lines = server_lines(out)
    assert lines['web/web-01'].start_with?('server web-01 127.0.0.1:40001 check agent-check agent-addr 127.0.0.1 ' \
                                           'agent-port 40004 agent-inter 200ms ')
    assert lines['canary_web/web-cny-02'].start_with?('server web-cny-02 127.0.0.1:40002 ')
    assert_equal 'server asset_proxy 127.0.0.1:40001', lines['asset_proxy/asset_proxy']
    assert_includes out, "    bind 127.0.0.1:40003\n"
    assert_includes out, "    stats socket /tmp/sample-test/admin.sock mode 600 level admin\n"
  end

  def test_reads_the_environment_and_options_win
    env = { 'SAMPLE_SERVER_ADDR' => '127.0.0.1:41001', 'SAMPLE_AGENT_PORT' => '41002',
            'SAMPLE_SERVERS' => 'web/web-01=127.0.0.1:41003,api/api-02=127.0.0.1:41004',
            'SAMPLE_BINDS' => 'registry_http=127.0.0.1:41005', 'SAMPLE_STATS_SOCKET' => '/tmp/s.sock' }
    out, _, code = run_script('--agent-port', '41009', env: env)
    assert_equal 0, code
    lines = server_lines(out)
    assert_includes lines['web/web-01'], ' 127.0.0.1:41003 '
    assert_includes lines['api/api-02'], ' 127.0.0.1:41004 '
    assert_includes lines['ci/ci-01'], ' 127.0.0.1:41001 '
    assert_includes lines['ci/ci-01'], 'agent-port 41009 '
    assert_includes out, "    bind 127.0.0.1:41005\n"
    assert_includes out, 'stats socket /tmp/s.sock '
  end

  def test_disable_agent
    assert_equal fixture('sample_role.agent-disabled.haproxy.cfg'), run_script('--disable-agent').first
    out, = run_script(env: { 'SAMPLE_AGENT_ENABLE' => 'false' })
    assert_equal fixture('sample_role.agent-disabled.haproxy.cfg'), out
  end

  def test_refuses_non_loopback_addresses_and_unknown_names
    [%w[--server-addr 10.0.0.1:80], %w[--server web/web-01=0.0.0.0:80], %w[--bind main=:80],
     %w[--agent-addr 10.1.1.1], %w[--server web/web-09=127.0.0.1:80], %w[--bind nope=127.0.0.1:80],
     %w[--bogus]].each do |args|
      out, err, code = run_script(*args)
      assert_equal [2, ''], [code, out], args.inspect
      refute_empty err
    end
  end

  def test_cookbook_refusals_exit_1_naming_the_attribute
    out, err, code = run_script('--agent-inter', '2 s')
    assert_equal [1, ''], [code, out]
    assert_includes err, 'gitlab-haproxy-agent.agent.inter'
  end
end
