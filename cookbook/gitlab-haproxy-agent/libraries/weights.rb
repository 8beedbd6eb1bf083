# frozen_string_literal: true

require_relative 'haproxy_config'

# Enrolled backends whose balance algorithm ignores runtime weights. HAProxy
# (configuration.txt, "balance") calls static-rr, first and the hash-based
# algorithms (source, uri, url_param, hdr(...), rdp-cookie, hash) static
# unless `hash-type consistent`: a weight set at runtime other than 0% or
# 100% has no effect there, so an agent's `ready 25%` is answered and not
# applied, and `undrain --ramp` jumps from maint to full weight. roundrobin,
# leastconn and random (the default is roundrobin) apply weights.
#
# check() returns one warning per such backend (the recipe logs them); with
# agent.weights true (the fleet writes weights or ramps) it raises
# ConfigError naming the backend instead. Plain Ruby, no Chef API.
module GitlabHaproxyAgent
  module Weights
    HASHED = %w[source uri url_param hdr rdp-cookie hash].freeze
    ALWAYS_STATIC = %w[static-rr first].freeze

    module_function

    def check(attrs)
      attrs ||= {}
      haproxy = attrs['haproxy'] || {}
      agent = attrs['agent'] || {}
      return [] unless agent['enable'] == true

      strict = agent['weights']
      unless [nil, true, false].include?(strict)
        raise ConfigError, "#{ATTR}.agent.weights must be true or false, got #{strict.inspect}"
      end

      excluded = Array(agent['excluded_backends']).map(&:to_s)
      defaults = HaproxyConfig.lines_attr(haproxy['defaults'], 'haproxy.defaults')
      (haproxy['backends'] || {}).each_with_object([]) do |(name, be), out|
        next if be.nil? || excluded.include?(name.to_s)

        lines = HaproxyConfig.lines_attr(be['options'], "haproxy.backends.#{name}.options")
        why = static_algorithm(lines, defaults)
        next unless why

        text = "#{ATTR}.haproxy.backends.#{name}: #{why}: HAProxy ignores runtime weights other than 0% and " \
               "100% there, so agent weights (state set #{name}/SERVER 25%) are answered and not applied and " \
               'undrain --ramp jumps from maint to full weight; balance it with roundrobin, leastconn or ' \
               "hash-type consistent, or list it in #{ATTR}.agent.excluded_backends"
        raise ConfigError, "#{text} (#{ATTR}.agent.weights is true)" if strict == true

        out << text
      end
    end

    # The static algorithm of a backend's lines (or of defaults when the
    # backend sets no `balance`), as text, or nil.
    def static_algorithm(lines, defaults)
      balance = last_word(lines, 'balance') || last_word(defaults, 'balance')
      return nil unless balance

      algorithm = balance.split(/[\s(]/).first
      hash_type = last_word(lines, 'hash-type') || last_word(defaults, 'hash-type')
      return "`balance #{balance}` is static" if ALWAYS_STATIC.include?(algorithm)
      return nil unless HASHED.include?(algorithm)
      return nil if hash_type.to_s.split.first == 'consistent'

      "`balance #{balance}` without `hash-type consistent` is static"
    end

    # The rest of the last line starting with `keyword`.
    def last_word(lines, keyword)
      found = lines.map(&:strip).select { |l| l.split.first == keyword }.last
      found&.sub(/\A#{Regexp.escape(keyword)}\s+/, '')&.strip
    end
  end
end
