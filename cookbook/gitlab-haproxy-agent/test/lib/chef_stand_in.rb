# frozen_string_literal: true

# The little of Chef the tests need, in plain Ruby: cookbook attribute files
# evaluated against an auto-vivifying `default`, role attributes merged over
# them, and templates rendered with Erubis the way Chef's template resource
# does (`node` and @variables in scope, library modules loaded).

require 'erubis'
require 'json'

module ChefStandIn
  COOKBOOK = File.expand_path('../..', __dir__)
  SAMPLE_ROLE = File.join(COOKBOOK, 'test', 'fixtures', 'sample_role.json')

  Dir[File.join(COOKBOOK, 'libraries', '*.rb')].sort.each { |f| require f }

  # Receiver for attributes/*.rb: `default['a']['b'] = v`.
  class AttributeFile
    attr_reader :default

    def initialize
      @default = vivify
    end

    def load(path)
      instance_eval(File.read(path), path)
      self
    end

    private

    def vivify
      Hash.new { |h, k| h[k] = vivify }
    end
  end

  # What templates call `node`: read-only nested attributes.
  class Node
    def initialize(attributes)
      @attributes = attributes
    end

    def [](key)
      @attributes[key]
    end

    def to_h
      @attributes
    end
  end

  # Erubis evaluates a template with instance_eval on this object, as Chef's
  # TemplateContext does.
  class TemplateContext < Erubis::Context
    attr_reader :node

    def initialize(node, variables)
      super(variables)
      @node = node
    end
  end

  module_function

  # Plain nested Hash copy (drops auto-vivification, so missing keys read nil).
  def plain(value)
    case value
    when Hash then value.each_with_object({}) { |(k, v), h| h[k.to_s] = plain(v) }
    when Array then value.map { |v| plain(v) }
    else value
    end
  end

  # Chef's merge across precedence levels: hashes merge key by key, anything
  # else (arrays included) is replaced by the higher level.
  def deep_merge(low, high)
    return plain(high) unless low.is_a?(Hash) && high.is_a?(Hash)

    merged = plain(low)
    high.each { |k, v| merged[k.to_s] = merged.key?(k.to_s) ? deep_merge(merged[k.to_s], v) : plain(v) }
    merged
  end

  def cookbook_defaults
    files = Dir[File.join(COOKBOOK, 'attributes', '*.rb')].sort
    plain(files.each_with_object(AttributeFile.new) { |f, a| a.load(f) }.default)
  end

  # Cookbook defaults, then the role's default_attributes and
  # override_attributes, then `extra` (a Hash in the same shape) on top.
  def node(role: SAMPLE_ROLE, extra: {})
    attrs = cookbook_defaults
    if role
      data = JSON.parse(File.read(role))
      attrs = deep_merge(attrs, data['default_attributes'] || {})
      attrs = deep_merge(attrs, data['override_attributes'] || {})
    end
    Node.new(deep_merge(attrs, extra))
  end

  def render(template, node, variables = {})
    src = File.read(File.join(COOKBOOK, 'templates', 'default', template))
    Erubis::Eruby.new(src, filename: template).evaluate(TemplateContext.new(node, variables))
  end
end
