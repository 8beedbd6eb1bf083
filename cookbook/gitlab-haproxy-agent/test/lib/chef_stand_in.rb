# The little of Chef the tests need, in plain Ruby: cookbook attribute files,
# roles and the node's precedence levels merged the way Chef merges them, and
# templates rendered with Erubis the way Chef's template resource does (`node`
# and @variables in scope, library modules loaded).
#
# The attribute rules, as Chef documents them:
#
# - docs.chef.io "Attribute Precedence" (https://docs.chef.io/attribute_precedence/):
#   the levels apply in the order default, force_default, normal, override,
#   force_override, automatic, the last one winning. Within default the sources
#   apply as cookbook attribute file, recipe, environment, role; within
#   override as cookbook attribute file, recipe, role, environment. A role's
#   default_attributes are therefore the same level as the cookbook's
#   `default[...]` lines, applied after them.
# - docs.chef.io "Attribute Arrays" (https://docs.chef.io/attribute_arrays/):
#   "When an attribute value is a hash, that data is merged. When an attribute
#   value is an array, if the attribute precedence levels are the same, then
#   that data is merged. If the attribute value precedence levels in an array
#   are different, then that data is replaced. For all other value types (such
#   as strings, integers, etc.), that data is replaced." Its "Addition" example
#   ([ '1', '2' ] + [ '3' ] = [ '1', '2', '3' ]) is a union.
# - Chef's implementation (chef/chef lib/chef/node/attribute.rb): the sources
#   of one level are combined with deep_merge! (hashes merged key by key,
#   arrays `merge_onto |= merge_with`, anything else replaced, an explicit nil
#   included; only a path absent from the source keeps the value below), and
#   the levels with hash_only_merge! (the same, except that arrays are
#   replaced).
#
# Roles of a run list are expanded in order and their attributes merged the
# same way at their level (a later role wins). Not modelled: recipes setting
# attributes, environments, force_default/force_override and the `-j` JSON.

require 'erubis'
require 'json'

module ChefStandIn
  COOKBOOK = File.expand_path('../..', __dir__)
  SAMPLE_ROLE = File.join(COOKBOOK, 'test', 'fixtures', 'sample_role.json')

  Dir[File.join(COOKBOOK, 'libraries', '*.rb')].sort.each { |f| require f }

  # Receiver for attributes/*.rb: `default['a']['b'] = v` and
  # `override['a']['b'] = v`, each its own auto-vivifying tree.
  class AttributeFile
    attr_reader :default, :override

    def initialize
      @default = vivify
      @override = vivify
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

  # Chef's merge of two sources of the same precedence level (deep_merge! in
  # lib/chef/node/attribute.rb): hashes merge key by key, arrays are unioned
  # (`|`: the lower source's items first, then the new ones), anything else is
  # replaced, by nil too.
  def merge_same_level(low, high)
    merge(low, high, arrays: :union)
  end

  # Chef's merge of a higher precedence level over a lower one
  # (hash_only_merge!): hashes merge key by key, arrays and anything else are
  # replaced.
  def merge_levels(low, high)
    merge(low, high, arrays: :replace)
  end

  def merge(low, high, arrays:)
    if low.is_a?(Hash) && high.is_a?(Hash)
      merged = plain(low)
      high.each do |k, v|
        k = k.to_s
        merged[k] = merged.key?(k) ? merge(merged[k], v, arrays: arrays) : plain(v)
      end
      merged
    elsif low.is_a?(Array) && high.is_a?(Array) && arrays == :union
      plain(low) | plain(high)
    else
      plain(high)
    end
  end

  def attribute_files
    files = Dir[File.join(COOKBOOK, 'attributes', '*.rb')].sort
    files.each_with_object(AttributeFile.new) { |f, a| a.load(f) }
  end

  # The cookbook's `default[...]` attributes alone.
  def cookbook_defaults
    plain(attribute_files.default)
  end

  # The node after Chef's merge of:
  #   default   cookbook attribute files, then each role's default_attributes
  #   normal    `normal`
  #   override  cookbook attribute files, then each role's override_attributes,
  #             then `override` (what a wrapper cookbook's override[...] would set)
  #   automatic `automatic` (Ohai, e.g. { 'lsb' => { 'codename' => 'bookworm' } })
  # roles: role JSON files in run-list order (role: one of them, or nil for none).
  def node(role: SAMPLE_ROLE, roles: nil, normal: {}, override: {}, automatic: {})
    roles ||= [role].compact
    files = attribute_files
    data = roles.map { |r| r.is_a?(Hash) ? r : JSON.parse(File.read(r)) }
    default_level = data.inject(plain(files.default)) do |acc, d|
      merge_same_level(acc, d['default_attributes'] || {})
    end
    override_level = data.inject(plain(files.override)) do |acc, d|
      merge_same_level(acc, d['override_attributes'] || {})
    end
    override_level = merge_same_level(override_level, override)
    merged = [normal, override_level, automatic].inject(default_level) { |acc, level| merge_levels(acc, level) }
    Node.new(merged)
  end

  def render(template, node, variables = {})
    src = File.read(File.join(COOKBOOK, 'templates', 'default', template))
    Erubis::Eruby.new(src, filename: template).evaluate(TemplateContext.new(node, variables))
  end
end
