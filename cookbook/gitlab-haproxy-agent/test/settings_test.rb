# frozen_string_literal: true

require_relative 'test_helper'

# /etc/default/gitlab-haproxy-agent: GitlabHaproxyAgent::Settings and its template.
class SettingsTest < Minitest::Test
  include CookbookTestHelpers

  def env(agent: {}, settings: {})
    defaults = ChefStandIn.cookbook_defaults[ATTR]
    GitlabHaproxyAgent::Settings.environment(defaults['agent'].merge(agent), defaults['settings'].merge(settings))
  end

  def test_defaults_render_the_documented_variables
    text = ChefStandIn.render('gitlab-haproxy-agent.default.erb', nil, environment: env)
    assert_equal <<~FILE, text
      # Managed by Chef (cookbook gitlab-haproxy-agent); local changes are overwritten.
      # Settings for gitlab-haproxy-agent, read by its systemd unit (EnvironmentFile=).
      # Variables are described in `gitlab-haproxy-agent --help`.
      GITLAB_HAPROXY_AGENT_LISTEN=127.0.0.1:9777
      GITLAB_HAPROXY_AGENT_PREFIX=gitlab-haproxy-agent/state/
      GITLAB_HAPROXY_AGENT_CONSUL_ADDR=http://127.0.0.1:8500
      GITLAB_HAPROXY_AGENT_HTTP_LISTEN=0.0.0.0:9778
    FILE
  end

  def test_variable_names_are_those_of_docs_options
    docs = File.join(ChefStandIn::COOKBOOK, '..', '..', 'docs')
    doc = File.join(docs, 'options.md')
    skip 'docs/options.md not found' unless File.exist?(doc)

    # The daemon's options: the table before "## check-ready". The
    # writer's Prometheus URL, which the writer reads from the same file,
    # is documented on the writer's page.
    text = File.read(doc)
    daemon = text[/\A(.*?)(?=^## check-ready)/m, 1]
    documented = daemon.scan(/`(GITLAB_HAPROXY_AGENT_[A-Z_]+)`/).flatten.uniq.sort
    writer = %w[GITLAB_HAPROXY_AGENT_PROMETHEUS_URL]
    ours = (GitlabHaproxyAgent::Settings::VARIABLES.values - writer +
            %w[GITLAB_HAPROXY_AGENT_LISTEN GITLAB_HAPROXY_AGENT_PREFIX]).sort
    assert_equal documented, ours
    writer_section = File.read(File.join(docs, 'writer.md'))
    writer.each { |name| assert_includes writer_section, "`#{name}`" }
  end

  def test_listen_follows_agent_addr_and_port
    assert_includes env(agent: { 'port' => 19_777 }), ['GITLAB_HAPROXY_AGENT_LISTEN', '127.0.0.1:19777']
    assert_includes env(agent: { 'addr' => '::1' }), ['GITLAB_HAPROXY_AGENT_LISTEN', '[::1]:9777']
    assert_includes env(settings: { 'listen' => '127.0.0.1:9777' }), ['GITLAB_HAPROXY_AGENT_LISTEN', '127.0.0.1:9777']
    assert_refused("#{ATTR}.settings.listen", /agent.addr:agent.port/) do
      env(settings: { 'listen' => '127.0.0.1:9999' })
    end
  end

  def test_all_settings_render_when_set
    all = env(settings: { 'consul_token_file' => '/etc/gitlab-haproxy-agent/consul-token', 'wait' => '30s',
                          'startup_timeout' => '10s', 'check_timeout' => '300ms', 'max_connections' => 512,
                          'log_format' => 'journald', 'prometheus_url' => 'http://prometheus.gprd:9090' })
    assert_equal %w[GITLAB_HAPROXY_AGENT_LISTEN GITLAB_HAPROXY_AGENT_PREFIX GITLAB_HAPROXY_AGENT_CONSUL_ADDR
                    GITLAB_HAPROXY_AGENT_CONSUL_TOKEN_FILE GITLAB_HAPROXY_AGENT_HTTP_LISTEN GITLAB_HAPROXY_AGENT_WAIT
                    GITLAB_HAPROXY_AGENT_STARTUP_TIMEOUT GITLAB_HAPROXY_AGENT_CHECK_TIMEOUT
                    GITLAB_HAPROXY_AGENT_MAX_CONNECTIONS GITLAB_HAPROXY_AGENT_LOG_FORMAT
                    GITLAB_HAPROXY_AGENT_PROMETHEUS_URL], all.map(&:first)
    assert_includes all, %w[GITLAB_HAPROXY_AGENT_MAX_CONNECTIONS 512]
  end

  def test_refusals_name_the_attribute
    assert_refused("#{ATTR}.settings", /consul_adr/) { env(settings: { 'consul_adr' => 'x' }) }
    assert_refused("#{ATTR}.agent.prefix", /end with/) { env(agent: { 'prefix' => 'gitlab-haproxy-agent/state' }) }
    assert_refused("#{ATTR}.agent.prefix", /empty/) { env(agent: { 'prefix' => '' }) }
    assert_refused("#{ATTR}.agent.prefix", /start/) { env(agent: { 'prefix' => '/state/' }) }
    assert_refused("#{ATTR}.settings.prefix", /agent.prefix/) { env(settings: { 'prefix' => 'other/' }) }
    assert_refused("#{ATTR}.settings.wait", /empty/) { env(settings: { 'wait' => '' }) }
    assert_refused("#{ATTR}.settings.consul_addr", /shell/) { env(settings: { 'consul_addr' => 'http://x $(id)' }) }
    assert_refused("#{ATTR}.settings.log_format", /shell/) { env(settings: { 'log_format' => "text\nX=1" }) }
    assert_refused("#{ATTR}.agent.port", /empty/) { env(agent: { 'port' => nil }) }
  end

  def test_consul_fallback_addrs_render_comma_joined_only_when_set
    names = env.map(&:first)
    refute_includes names, 'GITLAB_HAPROXY_AGENT_CONSUL_FALLBACK_ADDRS'
    assert_equal names, env(settings: { 'consul_fallback_addrs' => nil }).map(&:first)
    addrs = ['http://10.0.0.11:8500', '10.0.0.12:8500', 'http://consul-03.gprd.example:8500/', 'http://[fd00::13]:8500']
    set = env(settings: { 'consul_fallback_addrs' => addrs })
    assert_equal ['GITLAB_HAPROXY_AGENT_CONSUL_ADDR', 'http://127.0.0.1:8500'], set[2]
    assert_equal ['GITLAB_HAPROXY_AGENT_CONSUL_FALLBACK_ADDRS', addrs.join(',')], set[3]
    text = ChefStandIn.render('gitlab-haproxy-agent.default.erb', nil, environment: set)
    assert_includes text, "\nGITLAB_HAPROXY_AGENT_CONSUL_FALLBACK_ADDRS=#{addrs.join(',')}\n"
  end

  def test_consul_fallback_addrs_none_alone_turns_them_off_and_empty_finds_them
    refute_includes env.map(&:first), 'GITLAB_HAPROXY_AGENT_CONSUL_FALLBACK_ADDRS'
    assert_includes env(settings: { 'consul_fallback_addrs' => ['none'] }),
                    %w[GITLAB_HAPROXY_AGENT_CONSUL_FALLBACK_ADDRS none]
    attr = "#{ATTR}.settings.consul_fallback_addrs"
    assert_refused(attr, /alone/) do
      env(settings: { 'consul_fallback_addrs' => ['none', 'http://10.0.0.11:8500'] })
    end
    set = env(settings: { 'consul_fallback_port' => 8501, 'consul_fallback_refresh' => '10s' })
    assert_includes set, %w[GITLAB_HAPROXY_AGENT_CONSUL_FALLBACK_PORT 8501]
    assert_includes set, %w[GITLAB_HAPROXY_AGENT_CONSUL_FALLBACK_REFRESH 10s]
  end

  def test_consul_datacenter_renders_only_when_set_and_must_be_a_consul_name
    refute_includes env.map(&:first), 'GITLAB_HAPROXY_AGENT_CONSUL_DATACENTER'
    set = env(settings: { 'consul_datacenter' => 'gprd-us_east1' })
    assert_includes set, ['GITLAB_HAPROXY_AGENT_CONSUL_DATACENTER', 'gprd-us_east1']
    attr = "#{ATTR}.settings.consul_datacenter"
    ['dc.1', 'dc1/x', 'dc_' * 30].each do |bad|
      assert_refused(attr, /datacenter name/) { env(settings: { 'consul_datacenter' => bad }) }
    end
  end

  # The agent exits 64 at every start on a fallback address it refuses:
  # another scheme, a path or query, one given twice or equal to
  # --consul-addr (after adding its scheme and dropping a trailing slash),
  # plain http:// when --consul-addr is https://.
  def test_refuses_consul_fallback_addrs_the_agent_refuses
    attr = "#{ATTR}.settings.consul_fallback_addrs"
    assert_refused(attr, /list/) { env(settings: { 'consul_fallback_addrs' => 'http://10.0.0.11:8500' }) }
    {
      ['ftp://10.0.0.11:8501'] => /http\(s\)/,
      ['http://10.0.0.11:8500/v1/kv'] => /no path/,
      ['http://10.0.0.11:8500?dc=x'] => /no path/,
      ['http://10.0.0.11:99999'] => /http\(s\)/,
      ['http://'] => /http\(s\)/,
      ['10.0.0.11:8500,10.0.0.12:8500'] => /no commas/,
      [''] => /empty/,
      ['http://10.0.0.11:8500 $(id)'] => /shell/,
      ['http://127.0.0.1:8500'] => /twice or is settings.consul_addr/,
      ['127.0.0.1:8500/'] => /twice or is settings.consul_addr/,
      ['10.0.0.11:8500', 'http://10.0.0.11:8500/'] => /twice/,
    }.each do |addrs, pattern|
      error = assert_refused(attr, pattern) { env(settings: { 'consul_fallback_addrs' => addrs }) }
      assert_includes error.message, addrs.last.inspect, addrs.inspect unless addrs.last.empty?
    end
    # https:// beside an http:// consul_addr (the servers' HTTPS API); with an
    # https:// consul_addr an address without a scheme is https:// and plain
    # http:// is refused.
    servers = { 'consul_fallback_addrs' => ['https://10.0.0.11:8501'] }
    assert_includes env(settings: servers), %w[GITLAB_HAPROXY_AGENT_CONSUL_FALLBACK_ADDRS https://10.0.0.11:8501]
    tls = { 'consul_addr' => 'https://127.0.0.1:8501', 'consul_fallback_addrs' => ['10.0.0.11:8501'] }
    assert_includes env(settings: tls), %w[GITLAB_HAPROXY_AGENT_CONSUL_FALLBACK_ADDRS 10.0.0.11:8501]
    assert_refused(attr, /plain http while settings.consul_addr is https/) do
      env(settings: tls.merge('consul_fallback_addrs' => ['http://10.0.0.11:8500']))
    end
    # Compared with the consul_addr actually set.
    moved = { 'consul_addr' => 'http://10.0.0.5:8500', 'consul_fallback_addrs' => ['http://127.0.0.1:8500'] }
    assert_includes env(settings: moved), %w[GITLAB_HAPROXY_AGENT_CONSUL_FALLBACK_ADDRS http://127.0.0.1:8500]
    assert_refused(attr, /settings.consul_addr/) do
      env(settings: moved.merge('consul_fallback_addrs' => ['10.0.0.5:8500']))
    end
  end

  # The agent exits 64 at every start on a listen address it cannot parse:
  # a host name, or a port out of range.
  def test_refuses_listen_addresses_the_agent_cannot_bind
    assert_refused("#{ATTR}.agent.addr", /host name/) { env(agent: { 'addr' => 'localhost' }) }
    assert_refused("#{ATTR}.agent.port", /1-65535/) { env(agent: { 'port' => 65_536 }) }
    assert_refused("#{ATTR}.agent.port", /1-65535/) { env(agent: { 'port' => 0 }) }
    %w[localhost:9778 127.0.0.1 127.0.0.1:0 127.0.0.1:65536 ::1:9778 [127.0.0.1]:9778].each do |listen|
      assert_refused("#{ATTR}.settings.http_listen", /IP:PORT/) { env(settings: { 'http_listen' => listen }) }
    end
    assert_includes env(settings: { 'http_listen' => '[::1]:9778' }), ['GITLAB_HAPROXY_AGENT_HTTP_LISTEN', '[::1]:9778']
  end
end
