# frozen_string_literal: true

name 'gitlab-haproxy-agent'
maintainer 'GitLab Infrastructure'
license 'MIT'
description 'Enrolls HAProxy backends with gitlab-haproxy-agent (agent-check), renders haproxy.cfg, ' \
            'and installs and runs the agent'
version '0.1.0'
chef_version '>= 18.2' # apt_repository's options (signed-by)
supports 'debian'
supports 'ubuntu'
source_url 'https://gitlab.com/gitlab-com/gl-infra/gitlab-haproxy-agent'
issues_url 'https://gitlab.com/gitlab-com/gl-infra/gitlab-haproxy-agent/-/issues'
