# frozen_string_literal: true

#
# Cookbook:: gitlab-haproxy-agent
# Recipe:: agent
#
# Installs gitlab-haproxy-agent from the internal apt mirror (trusting the
# mirror's key for that source only, at the pinned version when
# package.version is set; attributes/apt.rb), writes its settings to
# /etc/default/gitlab-haproxy-agent and keeps the service enabled and
# running, restarted when the settings or the package change, unless an
# operator masked it (froze the agent). A restart is
# harmless to traffic: while the port is closed HAProxy keeps each server's
# last state.

attrs = node['gitlab-haproxy-agent']
apt_attrs = attrs['apt']
pin_version = attrs['package']['version']
# The mirror's public key, for this source only (signed-by): a key in apt's
# global keyring (apt-key) would vouch for every source on the node.
keyring = '/etc/apt/keyrings/gitlab-haproxy-agent.asc'

# Checked at compile time so a bad setting fails the run before anything changes.
{ 'uri' => 'the base URL of the internal apt mirror', 'key' => "the URL of the mirror's signing key" }.each do |name, what|
  next if apt_attrs[name].to_s.match?(%r{\Ahttps?://[^\s\[\]]+\z})

  raise GitlabHaproxyAgent::ConfigError,
        "gitlab-haproxy-agent.apt.#{name} must be #{what} (http or https), got #{apt_attrs[name].inspect}"
end
# One fingerprint, or a list during a key rotation (the old key and the new).
fingerprints = apt_attrs['key_fingerprint'].nil? ? nil : Array(apt_attrs['key_fingerprint'])
fingerprints&.map! { |f| f.to_s.delete(' ').upcase }
if fingerprints && (fingerprints.empty? || !fingerprints.all? { |f| f.match?(/\A[0-9A-F]{40}\z/) })
  raise GitlabHaproxyAgent::ConfigError,
        'gitlab-haproxy-agent.apt.key_fingerprint must be the full fingerprint of the signing key ' \
        '(40 hex digits, `gpg --show-keys release.asc`), or a list of them during a key rotation, ' \
        "got #{apt_attrs['key_fingerprint'].inspect}"
end
# Debian policy 5.6.12: [epoch:]upstream[-revision], starting with a digit.
if pin_version && !pin_version.to_s.match?(/\A([0-9]+:)?[0-9][A-Za-z0-9.+~:-]*\z/)
  raise GitlabHaproxyAgent::ConfigError,
        "gitlab-haproxy-agent.package.version must be a Debian version such as '0.1.0-1' (or nil), " \
        "got #{pin_version.inspect}"
end
environment = GitlabHaproxyAgent::Settings.environment(attrs['agent'], attrs['settings'])

directory '/etc/apt/keyrings' do
  owner 'root'
  group 'root'
  mode '0755'
end

# Fetched at every run; with fingerprints set, a file holding no key or a key
# not listed is refused (the old file stays) and the run fails. During a
# rotation the file holds both keys (scripts/apt-repo.sh's
# APT_REPO_OVERLAP_KEY) and apt trusts either.
remote_file keyring do
  source apt_attrs['key']
  owner 'root'
  group 'root'
  mode '0644' # apt reads it as _apt
  if fingerprints
    # The first fpr after each pub is that primary key's; subkeys' are not
    # checked (they belong to a listed key).
    listed = fingerprints.map { |f| "ok[\"#{f}\"] = 1" }.join('; ')
    verify "gpg --batch --no-autostart --show-keys --with-colons %{path} | awk -F: '" \
           "BEGIN { #{listed} } " \
           "$1 == \"pub\" { n++; p = 1; next } $1 == \"fpr\" && p { p = 0; if (!($10 in ok)) bad++ } " \
           "END { exit !(n >= 1 && bad == 0) }'"
  end
end

# `options` needs Chef Infra Client 18.2 or later. key false: Chef installs
# no key of its own (the one above is the only one this source trusts).
apt_repository 'gitlab-haproxy-agent' do
  uri apt_attrs['uri']
  distribution apt_attrs['distribution'] || node['lsb']['codename']
  components apt_attrs['components']
  key false
  options ["signed-by=#{keyring}"]
  action :add
end

# The pin: the package resource installs that version, the preference keeps
# apt-get upgrade from moving it. Without a pin no preference is left behind.
apt_preference 'gitlab-haproxy-agent' do
  if pin_version
    pin "version #{pin_version}"
    pin_priority '1001'
    action :add
  else
    action :remove
  end
end

# Written before the package so its first start already uses these settings.
template '/etc/default/gitlab-haproxy-agent' do
  source 'gitlab-haproxy-agent.default.erb'
  owner 'root'
  group 'root'
  mode '0644'
  variables(environment: environment)
end

package 'gitlab-haproxy-agent' do
  version pin_version if pin_version
  action :install
end

# A masked unit is an agent an operator froze: no action and no restart
# touches it (guards apply to notified actions too) until it is unmasked.
service 'gitlab-haproxy-agent' do
  supports status: true, restart: true
  action [:enable, :start]
  not_if GitlabHaproxyAgent::Service::MASKED
  subscribes :restart, 'template[/etc/default/gitlab-haproxy-agent]', :delayed
  subscribes :restart, 'package[gitlab-haproxy-agent]', :delayed
end
