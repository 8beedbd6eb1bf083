# frozen_string_literal: true

require_relative 'test_helper'

class AgentCheckTest < Minitest::Test
  include CookbookTestHelpers

  def options(backend: 'web', server: 'web-01', groups: [], **agent)
    GitlabHaproxyAgent::AgentCheck.server_options(backend: backend, server: server, groups: groups,
                                                  **AGENT, **agent)
  end

  def test_server_without_groups_sends_only_its_row_key
    assert_equal 'agent-check agent-addr 127.0.0.1 agent-port 9777 agent-inter 2s agent-send "web/web-01\n"',
                 options
  end

  def test_row_key_comes_first_then_groups_in_order
    line = options(backend: 'canary_web', server: 'web-cny-01', groups: %w[canary zone-b])
    assert_equal 'agent-check agent-addr 127.0.0.1 agent-port 9777 agent-inter 2s ' \
                 'agent-send "canary_web/web-cny-01 canary zone-b\n"', line
  end

  def test_agent_send_newline_is_the_two_characters_haproxy_unescapes
    line = options
    assert line.end_with?('\\n"'), line
    refute_includes line, "\n"
  end

  def test_agent_options_are_taken_from_the_arguments
    line = options(addr: '::1', port: '19777', inter: '500ms')
    assert_includes line, 'agent-addr ::1 agent-port 19777 agent-inter 500ms '
  end

  def test_names_haproxy_accepts_are_kept_verbatim
    line = options(backend: 'be.pages_https:443', server: 'pages-01.c.gitlab-production.internal')
    assert_includes line, 'agent-send "be.pages_https:443/pages-01.c.gitlab-production.internal\n"'
  end

  def test_positive_weight_is_accepted
    assert_includes options(weight: 100), 'agent-check '
    assert_includes options(weight: '1'), 'agent-check '
  end

  def test_refuses_dollar_in_names
    assert_refused("#{ATTR}.haproxy.backends", /'\$'/) { options(backend: 'web$HOME') }
    assert_refused("#{ATTR}.haproxy.backends.web.servers", /'\$'/) { options(server: '$web') }
    assert_refused("#{ATTR}.agent.groups", /'\$'/) { options(groups: ['canary$']) }
  end

  def test_refuses_hash_in_names
    assert_refused("#{ATTR}.haproxy.backends", /'#'/) { options(backend: 'web#1') }
    assert_refused("#{ATTR}.haproxy.backends.web.servers", /'#'/) { options(server: 'web#01') }
    assert_refused("#{ATTR}.agent.groups", /'#'/) { options(groups: ['#canary']) }
  end

  def test_refuses_quotes_in_names
    ['"', "'", '`'].each do |q|
      assert_refused("#{ATTR}.haproxy.backends", /quote/) { options(backend: "web#{q}") }
      assert_refused("#{ATTR}.haproxy.backends.web.servers", /quote/) { options(server: "web-01#{q}") }
      assert_refused("#{ATTR}.agent.groups", /quote/) { options(groups: ["can#{q}ary"]) }
    end
  end

  def test_refuses_whitespace_in_names
    [' ', "\t", "\n"].each do |s|
      assert_refused("#{ATTR}.haproxy.backends", /whitespace/) { options(backend: "web#{s}x") }
      assert_refused("#{ATTR}.haproxy.backends.web.servers", /whitespace/) { options(server: "web#{s}01") }
      assert_refused("#{ATTR}.agent.groups", /whitespace/) { options(groups: ["canary#{s}b"]) }
    end
  end

  def test_refuses_empty_parts
    assert_refused("#{ATTR}.haproxy.backends", /empty/) { options(backend: '') }
    assert_refused("#{ATTR}.haproxy.backends", /empty/) { options(backend: nil) }
    assert_refused("#{ATTR}.haproxy.backends.web.servers", /empty/) { options(server: '') }
    assert_refused("#{ATTR}.agent.groups", /empty/) { options(groups: ['']) }
    assert_refused("#{ATTR}.agent.groups", /empty/) { options(groups: ['canary', nil]) }
  end

  def test_refuses_names_that_break_the_kv_key
    assert_refused("#{ATTR}.haproxy.backends", %r{'/'}) { options(backend: 'web/x') }
    assert_refused("#{ATTR}.haproxy.backends.web.servers", %r{'/'}) { options(server: 'a/b') }
    assert_refused("#{ATTR}.agent.groups", %r{'/'}) { options(groups: ['canary_web/web-cny-01']) }
    assert_refused("#{ATTR}.haproxy.backends", /'\\'/) { options(backend: 'web\\n') }
    assert_refused("#{ATTR}.haproxy.backends.web.servers", /'\.' or '\.\.'/) { options(server: '..') }
    assert_refused("#{ATTR}.agent.groups", /outside/) { options(groups: ['zone+b']) }
    assert_refused("#{ATTR}.haproxy.backends", /outside/) { options(backend: 'wéb') }
  end

  def test_groups_may_name_zones
    assert options(groups: ['zone:us-east1-b']).end_with?('agent-send "web/web-01 zone:us-east1-b\n"')
  end

  def test_refuses_what_the_agent_would_not_read
    assert_refused("#{ATTR}.haproxy.backends.web.servers", /longer than 255 bytes/) { options(server: 's' * 252) }
    assert options(server: 's' * 251).include?("web/#{'s' * 251}\\n")
    assert_refused("#{ATTR}.agent.groups", /longer than 255 bytes/) { options(groups: ['g' * 256]) }
    assert_refused("#{ATTR}.agent.groups", /at most 15 groups/) { options(groups: (1..16).map { |i| "g#{i}" }) }
    assert options(groups: (1..15).map { |i| "g#{i}" }).include?('g15\\n')
    assert_refused("#{ATTR}.agent.groups", /longer than 1024 bytes/) do
      options(groups: (1..5).map { |i| "#{i}#{'g' * 250}" })
    end
  end

  def test_refuses_a_group_listed_twice
    assert_refused("#{ATTR}.agent.groups", /twice/) { options(groups: %w[canary canary]) }
  end

  def test_refuses_empty_option_values
    assert_refused("#{ATTR}.agent.addr", /empty/) { options(addr: '') }
    assert_refused("#{ATTR}.agent.addr", /empty/) { options(addr: nil) }
    assert_refused("#{ATTR}.agent.port", /empty/) { options(port: '') }
    assert_refused("#{ATTR}.agent.port", /empty/) { options(port: nil) }
    assert_refused("#{ATTR}.agent.inter", /empty/) { options(inter: ' ') }
  end

  def test_refuses_malformed_option_values
    assert_refused("#{ATTR}.agent.port", /port number/) { options(port: 0) }
    assert_refused("#{ATTR}.agent.port", /port number/) { options(port: 65_536) }
    assert_refused("#{ATTR}.agent.port", /port number/) { options(port: '97 77') }
    assert_refused("#{ATTR}.agent.inter", /HAProxy time/) { options(inter: '2 s') }
    assert_refused("#{ATTR}.agent.inter", /HAProxy time/) { options(inter: '0s') }
    assert_refused("#{ATTR}.agent.inter", /HAProxy time/) { options(inter: '2sec') }
    assert_refused("#{ATTR}.agent.addr", /IP address/) { options(addr: '127.0.0.1 #') }
    assert_refused("#{ATTR}.agent.addr", /IP address/) { options(addr: '$AGENT') }
  end

  # The agent binds agent.addr:agent.port and exits 64 on a host name, so
  # the helper refuses what it would refuse.
  def test_refuses_an_agent_addr_the_agent_cannot_listen_on
    %w[localhost lb-01.internal 127.1 127.0.0.01 10.0.0.256 127.0.0.1/8 fe80::1%eth0 [::1] 1.2.3.4.].each do |addr|
      assert_refused("#{ATTR}.agent.addr", /not an IP address.*host name/) { options(addr: addr) }
    end
    %w[127.0.0.1 10.1.2.3 ::1 fe80::1 ::ffff:127.0.0.1].each do |addr|
      assert_includes options(addr: addr), "agent-addr #{addr} "
    end
  end

  def test_refuses_ports_out_of_range
    [-1, 0, 65_536, 100_000, '', 'http', '9777.0', 9777.5].each do |port|
      assert_refused("#{ATTR}.agent.port") { options(port: port) }
    end
    assert_includes options(port: 1), 'agent-port 1 '
    assert_includes options(port: '65535'), 'agent-port 65535 '
  end

  def test_refuses_weight_zero_on_an_enrolled_server
    error = assert_refused("#{ATTR}.haproxy.backends.web.servers.web-01.weight", /share of the configured weight/) do
      options(weight: 0)
    end
    assert_includes error.message, 'excluded_backends'
    assert_refused('haproxy.defaults (default-server)', /is 0/) do
      options(weight: '0', weight_attr: "#{ATTR}.haproxy.defaults (default-server)")
    end
    assert_refused("#{ATTR}.haproxy.backends.web.servers.web-01.weight", /integer/) { options(weight: 'x') }
  end

  def test_memberships_follow_group_definition_order
    groups = { 'canary' => %w[canary_web canary_api], 'zone-b' => %w[canary_web web] }
    m = GitlabHaproxyAgent::AgentCheck.memberships(groups, %w[web canary_web canary_api api], [])
    assert_equal %w[canary zone-b], m['canary_web']
    assert_equal %w[canary], m['canary_api']
    assert_equal %w[zone-b], m['web']
    assert_equal [], m['api']
  end

  def test_memberships_refuse_unknown_and_excluded_backends
    assert_refused("#{ATTR}.agent.groups.canary", /"canary_wbe", which is not in/) do
      GitlabHaproxyAgent::AgentCheck.memberships({ 'canary' => ['canary_wbe'] }, %w[canary_web], [])
    end
    assert_refused("#{ATTR}.agent.groups.canary", /excluded_backends/) do
      GitlabHaproxyAgent::AgentCheck.memberships({ 'canary' => ['asset_proxy'] }, %w[asset_proxy], ['asset_proxy'])
    end
    assert_refused("#{ATTR}.agent.groups.canary", /twice/) do
      GitlabHaproxyAgent::AgentCheck.memberships({ 'canary' => %w[web web] }, %w[web], [])
    end
    assert_refused("#{ATTR}.agent.groups.canary", /list of backend names/) do
      GitlabHaproxyAgent::AgentCheck.memberships({ 'canary' => 'web' }, %w[web], [])
    end
    assert_refused("#{ATTR}.agent.groups", /'\$'/) do
      GitlabHaproxyAgent::AgentCheck.memberships({ 'can$ary' => %w[web] }, %w[web], [])
    end
    assert_refused("#{ATTR}.agent.groups", /hash/) do
      GitlabHaproxyAgent::AgentCheck.memberships(['canary'], %w[web], [])
    end
    ['', ' '].each do |empty|
      assert_refused("#{ATTR}.agent.groups", /group name .* (is empty|contains whitespace)/) do
        GitlabHaproxyAgent::AgentCheck.memberships({ empty => %w[web] }, %w[web], [])
      end
    end
  end
end
