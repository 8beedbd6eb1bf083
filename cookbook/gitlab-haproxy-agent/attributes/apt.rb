# frozen_string_literal: true

#
# Package source: the internal apt mirror that scripts/apt-repo.sh builds
# (docs/releasing.md). Recipe agent adds it
# and installs the package from it.
#

# Base URL of the repository: the folder holding dists/ and pool/. Must be
# set by the role, e.g. 'https://apt.example.internal/gitlab-haproxy-agent'.
default['gitlab-haproxy-agent']['apt']['uri'] = nil
# URL of the repository's public signing key (release.asc at the top of the
# mirror). It is kept as /etc/apt/keyrings/gitlab-haproxy-agent.asc and named
# by the source's signed-by, so it vouches for this repository only, never
# for the node's other sources. Must be set by the role.
default['gitlab-haproxy-agent']['apt']['key'] = nil
# Full fingerprint of that key (40 hex digits), or, during a key rotation,
# a list of the old and the new one. When set, a downloaded key file holding
# a key not listed here (or none) fails the Chef run before apt uses it.
# nil: the key is trusted as the mirror serves it.
default['gitlab-haproxy-agent']['apt']['key_fingerprint'] = nil
# The suite (apt-repo.sh's APT_REPO_SUITE). nil: the node's release codename.
default['gitlab-haproxy-agent']['apt']['distribution'] = nil
default['gitlab-haproxy-agent']['apt']['components'] = ['main']

# Version pin, e.g. '0.1.0-1': that version is installed (upgraded or
# downgraded to), and an apt preference (Pin-Priority 1001) keeps
# `apt-get upgrade` and unattended-upgrades from moving it. The mirror keeps
# every published version, so a pin to an older one is a rollback.
# nil: no pin; the newest version is installed once, later ones arrive with
# `apt-get upgrade`.
default['gitlab-haproxy-agent']['package']['version'] = nil
