# frozen_string_literal: true

require_relative 'test_helper'

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
    TYPES = %i[apt_repository package template service].freeze
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
  end

  def test_agent_recipe_installs_configures_and_runs_the_agent
    r = recorder.run('agent')
    assert_equal [%i[apt_repository gitlab-haproxy-agent], %i[template /etc/default/gitlab-haproxy-agent],
                  %i[package gitlab-haproxy-agent], %i[service gitlab-haproxy-agent]],
                 r.resources.map { |x| [x.type, x.name.to_sym] }

    repo = r.find(:apt_repository, 'gitlab-haproxy-agent').properties
    assert_equal 'https://apt.example.internal/gitlab-haproxy-agent', repo[:uri]
    assert_equal 'https://apt.example.internal/gitlab-haproxy-agent/release.asc', repo[:key]
    assert_equal 'bookworm', repo[:distribution]
    assert_equal ['main'], repo[:components]

    settings = r.find(:template, '/etc/default/gitlab-haproxy-agent').properties
    assert_equal 'gitlab-haproxy-agent.default.erb', settings[:source]
    assert_equal '0644', settings[:mode]
    env = settings[:variables][:environment]
    assert_includes env, ['GITLAB_HAPROXY_AGENT_LISTEN', '127.0.0.1:9777']
    assert_includes env, ['GITLAB_HAPROXY_AGENT_PREFIX', 'gitlab-haproxy-agent/state/']

    service = r.find(:service, 'gitlab-haproxy-agent')
    assert_equal %i[enable start], service.properties[:action]
    assert_includes service.subscribes, [:restart, 'template[/etc/default/gitlab-haproxy-agent]', :delayed]
    assert_includes service.subscribes, [:restart, 'package[gitlab-haproxy-agent]', :delayed]
  end

  def test_agent_recipe_pins_a_package_version_when_asked
    assert_nil recorder.run('agent').find(:package, 'gitlab-haproxy-agent').properties[:version]
    r = recorder('package' => { 'version' => '0.1.0-1' }).run('agent')
    assert_equal '0.1.0-1', r.find(:package, 'gitlab-haproxy-agent').properties[:version]
  end

  def test_agent_recipe_refuses_a_missing_mirror_or_bad_settings
    assert_refused("#{ATTR}.apt.uri", /mirror/) { recorder('apt' => { 'uri' => nil }).run('agent') }
    assert_refused("#{ATTR}.settings", /consul_adr/) do
      recorder('settings' => { 'consul_adr' => 'http://127.0.0.1:8500' }).run('agent')
    end
  end

  def test_haproxy_recipe_verifies_and_reloads
    r = recorder.run('haproxy')
    cfg = r.find(:template, '/etc/haproxy/haproxy.cfg')
    assert_equal 'haproxy.cfg.erb', cfg.properties[:source]
    assert_equal '/usr/sbin/haproxy -c -q -f %{path}', cfg.properties[:verify]
    assert_includes cfg.notifies, [:reload, 'service[haproxy]', :delayed]
    assert_equal %i[enable start], r.find(:service, 'haproxy').properties[:action]
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
