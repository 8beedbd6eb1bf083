# frozen_string_literal: true

require_relative 'test_helper'
require 'open3'
require 'tmpdir'

# Recipes evaluated against a recorder that stands in for Chef's resource DSL:
# which resources are declared, in which order, with which properties and
# notifications. (Converging needs Chef; this checks what the recipe asks for.)
class RecipeTest < Minitest::Test
  include CookbookTestHelpers

  Resource = Struct.new(:type, :name, :properties, :subscribes, :notifies)

  # Receiver for a resource block: every call sets a property; `node` is in
  # scope as it is in a Chef resource block.
  class Properties
    attr_reader :node, :values

    def initialize(node)
      @node = node
      @values = {}
      @subscribes = []
      @notifies = []
    end

    def subscribes(*args)
      return @subscribes if args.empty?

      @subscribes << args
    end

    def notifies(*args)
      return @notifies if args.empty?

      @notifies << args
    end

    def method_missing(name, *args)
      @values[name] = args.size == 1 ? args.first : args
    end

    def respond_to_missing?(*)
      true
    end
  end

  # Receiver for a recipe file.
  class Recorder
    TYPES = %i[directory remote_file apt_repository apt_preference package template service execute file].freeze
    attr_reader :node, :resources, :included

    def initialize(node)
      @node = node
      @resources = []
      @included = []
    end

    def run(recipe)
      path = File.join(ChefStandIn::COOKBOOK, 'recipes', "#{recipe}.rb")
      instance_eval(File.read(path), path)
      self
    end

    def include_recipe(name)
      @included << name
    end

    TYPES.each do |type|
      define_method(type) do |name, &block|
        props = Properties.new(@node)
        props.instance_eval(&block) if block
        @resources << Resource.new(type, name, props.values, props.subscribes, props.notifies)
      end
    end

    def find(type, name)
      @resources.find { |r| r.type == type && r.name == name } || raise("no #{type}[#{name}]")
    end
  end

  def recorder(changes = {})
    node = ChefStandIn.node(override: { ATTR => changes }, automatic: { 'lsb' => { 'codename' => 'bookworm' } })
    Recorder.new(node)
  end

  def test_attribute_defaults
    agent = ChefStandIn.cookbook_defaults[ATTR]['agent']
    assert_equal false, agent['enable']
    assert_equal 9777, agent['port']
    assert_equal '127.0.0.1', agent['addr']
    assert_equal '2s', agent['inter']
    assert_equal 'gitlab-haproxy-agent/state/', agent['prefix']
    assert_equal({}, agent['groups'])
    assert_equal [], agent['zones']
    assert_equal [], agent['excluded_backends']
    assert_equal [], ChefStandIn.cookbook_defaults[ATTR]['settings']['consul_fallback_addrs']
  end

  KEYRING = '/etc/apt/keyrings/gitlab-haproxy-agent.asc'

  def test_apt_attributes_live_in_attributes_apt_rb
    path = File.join(ChefStandIn::COOKBOOK, 'attributes', 'apt.rb')
    own = ChefStandIn.plain(ChefStandIn::AttributeFile.new.load(path).default)[ATTR]
    assert_equal({ 'uri' => nil, 'key' => nil, 'key_fingerprint' => nil, 'distribution' => nil,
                   'components' => ['main'] }, own['apt'])
    assert_equal({ 'version' => nil }, own['package'])
    assert_equal %w[apt package], own.keys.sort
  end

  def test_agent_recipe_installs_configures_and_runs_the_agent
    r = recorder.run('agent')
    assert_equal [%i[directory /etc/apt/keyrings], [:remote_file, KEYRING.to_sym],
                  %i[apt_repository gitlab-haproxy-agent], %i[apt_preference gitlab-haproxy-agent],
                  %i[template /etc/default/gitlab-haproxy-agent], %i[package gitlab-haproxy-agent],
                  %i[service gitlab-haproxy-agent]],
                 r.resources.map { |x| [x.type, x.name.to_sym] }

    assert_equal '0755', r.find(:directory, '/etc/apt/keyrings').properties[:mode]
    key = r.find(:remote_file, KEYRING).properties
    assert_equal 'https://apt.example.internal/gitlab-haproxy-agent/release.asc', key[:source]
    assert_equal %w[root root 0644], key.values_at(:owner, :group, :mode)
    assert_nil key[:verify], 'no fingerprint set: nothing to verify against'

    repo = r.find(:apt_repository, 'gitlab-haproxy-agent').properties
    assert_equal 'https://apt.example.internal/gitlab-haproxy-agent', repo[:uri]
    assert_equal 'bookworm', repo[:distribution]
    assert_equal ['main'], repo[:components]
    # The key trusted for this source only: none in apt's global keyring.
    assert_equal false, repo[:key]
    assert_equal ["signed-by=#{KEYRING}"], repo[:options]

    settings = r.find(:template, '/etc/default/gitlab-haproxy-agent').properties
    assert_equal 'gitlab-haproxy-agent.default.erb', settings[:source]
    assert_equal '0644', settings[:mode]
    env = settings[:variables][:environment]
    assert_includes env, ['GITLAB_HAPROXY_AGENT_LISTEN', '127.0.0.1:9777']
    assert_includes env, ['GITLAB_HAPROXY_AGENT_PREFIX', 'gitlab-haproxy-agent/state/']
    refute(env.any? { |name, _| name == 'GITLAB_HAPROXY_AGENT_CONSUL_FALLBACK_ADDRS' }, 'left out: the agent finds them')

    service = r.find(:service, 'gitlab-haproxy-agent')
    assert_equal %i[enable start], service.properties[:action]
    # A frozen (masked) agent is neither enabled, started nor restarted.
    assert_equal GitlabHaproxyAgent::Service::MASKED, service.properties[:not_if]
    assert_includes service.properties[:not_if], 'gitlab-haproxy-agent.service'
    assert_includes service.subscribes, [:restart, 'template[/etc/default/gitlab-haproxy-agent]', :delayed]
    assert_includes service.subscribes, [:restart, 'package[gitlab-haproxy-agent]', :delayed]
  end

  def test_agent_recipe_pins_a_package_version_when_asked
    r = recorder.run('agent')
    assert_nil r.find(:package, 'gitlab-haproxy-agent').properties[:version]
    assert_equal({ action: :remove }, r.find(:apt_preference, 'gitlab-haproxy-agent').properties,
                 'no pin: a preference left by an earlier pin is removed')

    r = recorder('package' => { 'version' => '0.1.0-1' }).run('agent')
    assert_equal '0.1.0-1', r.find(:package, 'gitlab-haproxy-agent').properties[:version]
    # Rendered by Chef as Package/Pin/Pin-Priority in
    # /etc/apt/preferences.d/gitlab-haproxy-agent.pref; 1001 holds the
    # version against apt-get upgrade and allows a downgrade to it.
    assert_equal({ pin: 'version 0.1.0-1', pin_priority: '1001', action: :add },
                 r.find(:apt_preference, 'gitlab-haproxy-agent').properties)
  end

  # The remote_file's verify command run as Chef runs it (sh, %{path}
  # replaced) against real key files made with gpg.
  def test_agent_recipe_verifies_the_downloaded_key_against_its_fingerprint
    Dir.mktmpdir do |dir|
      one, one_fpr = new_key(dir, 'one')
      two, two_fpr = new_key(dir, 'two')
      both = File.join(dir, 'both.asc')
      File.write(both, File.read(one) + File.read(two))

      spaced = one_fpr.downcase.scan(/.{4}/).join(' ')
      r = recorder('apt' => { 'key_fingerprint' => spaced }).run('agent')
      verify = r.find(:remote_file, KEYRING).properties[:verify]
      refute_nil verify
      home = File.join(dir, 'gnupg-chef')
      Dir.mkdir(home, 0o700)
      run = lambda do |path|
        Open3.capture2e({ 'GNUPGHOME' => home }, 'sh', '-c', format(verify, path: path))[1].success?
      end
      assert run.call(one), 'the key with the pinned fingerprint is accepted'
      refute run.call(two), "a key with another fingerprint (#{two_fpr}) is refused"
      refute run.call(both), 'a file with a second key beside the pinned one is refused'
      refute run.call(File.join(dir, 'missing.asc')), 'no file is refused'
      empty = File.join(dir, 'empty.asc')
      File.write(empty, '')
      refute run.call(empty), 'a file with no key is refused'

      # A rotation: both fingerprints listed; the file may hold both, or
      # either one, but no other key.
      r = recorder('apt' => { 'key_fingerprint' => [one_fpr, two_fpr.downcase] }).run('agent')
      verify = r.find(:remote_file, KEYRING).properties[:verify]
      assert run.call(both), 'both keys of a rotation'
      assert run.call(one), 'the old key alone'
      assert run.call(two), 'the new key alone'
      three, = new_key(dir, 'three')
      with_third = File.join(dir, 'with-third.asc')
      File.write(with_third, File.read(both) + File.read(three))
      refute run.call(with_third), 'a key not listed beside the listed ones is refused'
    end
  end

  def test_agent_recipe_refuses_a_missing_mirror_or_bad_settings
    assert_refused("#{ATTR}.apt.uri", /mirror/) { recorder('apt' => { 'uri' => nil }).run('agent') }
    assert_refused("#{ATTR}.apt.uri", /mirror/) { recorder('apt' => { 'uri' => 'apt.example.internal' }).run('agent') }
    assert_refused("#{ATTR}.apt.key", /signing key/) { recorder('apt' => { 'key' => nil }).run('agent') }
    assert_refused("#{ATTR}.apt.key", /URL/) do
      recorder('apt' => { 'key' => '0123456789ABCDEF0123456789ABCDEF01234567' }).run('agent')
    end
    assert_refused("#{ATTR}.apt.key_fingerprint", /40 hex digits/) do
      recorder('apt' => { 'key_fingerprint' => '36926C95' }).run('agent')
    end
    assert_refused("#{ATTR}.apt.key_fingerprint", /list of them/) do
      recorder('apt' => { 'key_fingerprint' => ['0123456789ABCDEF0123456789ABCDEF01234567', 'x'] }).run('agent')
    end
    assert_refused("#{ATTR}.apt.key_fingerprint", /list of them/) do
      recorder('apt' => { 'key_fingerprint' => [] }).run('agent')
    end
    assert_refused("#{ATTR}.package.version", /Debian version/) do
      recorder('package' => { 'version' => 'latest' }).run('agent')
    end
    r = recorder('package' => { 'version' => '1:0.2.0~rc1-1+deb12u1' }).run('agent')
    assert_equal '1:0.2.0~rc1-1+deb12u1', r.find(:package, 'gitlab-haproxy-agent').properties[:version]
    assert_refused("#{ATTR}.settings", /consul_adr/) do
      recorder('settings' => { 'consul_adr' => 'http://127.0.0.1:8500' }).run('agent')
    end
    assert_refused("#{ATTR}.settings.consul_fallback_addrs", /plain http/) do
      recorder('settings' => { 'consul_fallback_addrs' => ['https://10.0.0.11:8501'] }).run('agent')
    end
  end

  def test_agent_recipe_writes_the_consul_fallback_addrs
    servers = %w[http://10.0.0.11:8500 http://10.0.0.12:8500 http://10.0.0.13:8500]
    r = recorder('settings' => { 'consul_fallback_addrs' => servers }).run('agent')
    env = r.find(:template, '/etc/default/gitlab-haproxy-agent').properties[:variables][:environment]
    assert_includes env, ['GITLAB_HAPROXY_AGENT_CONSUL_FALLBACK_ADDRS', servers.join(',')]
  end

  # [armored public key file, fingerprint] of a new key in its own keyring.
  def new_key(dir, name)
    home = File.join(dir, "gnupg-#{name}")
    Dir.mkdir(home, 0o700)
    env = { 'GNUPGHOME' => home }
    _, status = Open3.capture2e(env, 'gpg', '--batch', '--passphrase', '', '--quick-gen-key',
                                "#{name} <#{name}@example.invalid>", 'ed25519', 'sign', 'never')
    assert status.success?, 'gpg --quick-gen-key'
    out, = Open3.capture3(env, 'gpg', '--batch', '--with-colons', '--list-keys')
    fpr = out.lines.find { |l| l.start_with?('fpr:') }.split(':')[9]
    path = File.join(dir, "#{name}.asc")
    File.write(path, Open3.capture2(env, 'gpg', '--batch', '--armor', '--export', fpr)[0])
    [path, fpr]
  ensure
    Open3.capture2e(env, 'gpgconf', '--kill', 'gpg-agent') if env
  end

  def test_haproxy_recipe_verifies_and_reloads
    r = recorder.run('haproxy')
    cfg = r.find(:template, '/etc/haproxy/haproxy.cfg')
    assert_equal 'haproxy.cfg.erb', cfg.properties[:source]
    assert_equal '/usr/sbin/haproxy -c -q -f %{path}', cfg.properties[:verify]
    assert_includes cfg.notifies, [:reload, 'service[haproxy]', :delayed]
    assert_equal %i[enable start], r.find(:service, 'haproxy').properties[:action]
  end

  GUARD = '/etc/systemd/system/haproxy.service.d/gitlab-haproxy-agent.conf'
  RELOAD = 'execute[systemd daemon-reload for the haproxy drop-in]'

  # The drop-in that makes HAProxy's reload ask the agent first comes before
  # haproxy.cfg (whose change notifies the reload), and goes away with the
  # agent.
  # The agent listens on every address by default; the guard asks it on
  # loopback, where /-/answering and the agent-check port answer.
  def test_the_reload_guard_asks_an_agent_listening_everywhere_on_loopback
    guard = GitlabHaproxyAgent::ReloadGuard
    assert_equal '127.0.0.1:9778', guard.local_addr('0.0.0.0:9778')
    assert_equal '[::1]:9778', guard.local_addr('[::]:9778')
    assert_equal '10.0.0.5:9778', guard.local_addr('10.0.0.5:9778')
  end

  def test_haproxy_recipe_guards_the_reload_with_the_agent_only
    r = recorder.run('haproxy')
    names = r.resources.map { |x| "#{x.type}[#{x.name}]" }
    assert_operator names.index("template[#{GUARD}]"), :<, names.index('template[/etc/haproxy/haproxy.cfg]')
    guard = r.find(:template, GUARD)
    assert_equal 'haproxy-reload-guard.conf.erb', guard.properties[:source]
    assert_equal({ agent_bin: '/usr/bin/gitlab-haproxy-agent', haproxy_bin: '/usr/sbin/haproxy',
                   agent_addr: '127.0.0.1:9777', http_addr: '127.0.0.1:9778',
                   override_file: '/run/gitlab-haproxy-agent-allow-haproxy-reload',
                   started_file: '/run/gitlab-haproxy-agent-haproxy-started' }, guard.properties[:variables])
    assert_includes guard.notifies, [:run, RELOAD, :immediately]
    assert_equal :nothing, r.find(:execute, 'systemd daemon-reload for the haproxy drop-in').properties[:action]
    text = ChefStandIn.render('haproxy-reload-guard.conf.erb', nil, guard.properties[:variables])
    assert_equal ['', '/usr/bin/gitlab-haproxy-agent check-ready --agent-addr 127.0.0.1:9777 ' \
                      '--http-addr 127.0.0.1:9778 --override-file /run/gitlab-haproxy-agent-allow-haproxy-reload',
                  '/usr/sbin/haproxy -Ws -f $CONFIG -c -q $EXTRAOPTS', '/bin/kill -USR2 $MAINPID'],
                 text.lines.filter_map { |l| l.chomp.delete_prefix!('ExecReload=') }
    # A restart is checked once HAProxy started since boot (the marker under /run).
    assert_equal ["/bin/sh -c 'if [ -e /run/gitlab-haproxy-agent-haproxy-started ]; then exec " \
                  '/usr/bin/gitlab-haproxy-agent check-ready --agent-addr 127.0.0.1:9777 --http-addr ' \
                  "127.0.0.1:9778 --override-file /run/gitlab-haproxy-agent-allow-haproxy-reload; fi'"],
                 text.lines.filter_map { |l| l.chomp.delete_prefix!('ExecStartPre=') }
    assert_equal ['/bin/touch /run/gitlab-haproxy-agent-haproxy-started'],
                 text.lines.filter_map { |l| l.chomp.delete_prefix!('ExecStartPost=') }

    r = recorder('agent' => { 'enable' => false }).run('haproxy')
    gone = r.find(:file, GUARD)
    assert_equal :delete, gone.properties[:action]
    assert_includes gone.notifies, [:run, RELOAD, :immediately]
    assert_raises(RuntimeError) { r.find(:template, GUARD) }
  end

  def test_haproxy_recipe_fails_before_changing_anything
    r = recorder('agent' => { 'groups' => { 'canary' => ['nope'] } })
    assert_refused("#{ATTR}.agent.groups.canary") { r.run('haproxy') }
    assert_empty r.resources
  end

  # What the agent cannot use fails the run at compile time, in both
  # recipes, before any resource is declared.
  def test_both_recipes_refuse_what_the_agent_cannot_use
    cases = {
      { 'agent' => { 'addr' => 'localhost' } } => ["#{ATTR}.agent.addr", /host name/],
      { 'agent' => { 'port' => 70_000 } } => ["#{ATTR}.agent.port", /1-65535/],
      { 'agent' => { 'groups' => { '' => %w[web] } } } => ["#{ATTR}.agent.groups", /empty/],
    }
    cases.each do |change, (attr, why)|
      %w[agent haproxy].each do |recipe|
        next if recipe == 'agent' && attr.end_with?('groups')

        r = recorder(change)
        assert_refused(attr, why) { r.run(recipe) }
        assert_empty r.resources, "#{recipe}: #{change}"
      end
    end
  end

  def test_default_recipe_includes_the_agent_only_when_enabled
    assert_equal %w[gitlab-haproxy-agent::agent gitlab-haproxy-agent::haproxy], recorder.run('default').included
    assert_equal %w[gitlab-haproxy-agent::haproxy],
                 recorder('agent' => { 'enable' => false }).run('default').included
  end
end
