# frozen_string_literal: true

# The agent's systemd unit as the agent recipe manages it. Plain Ruby (no
# Chef API).
module GitlabHaproxyAgent
  module Service
    UNIT = 'gitlab-haproxy-agent.service'
    # Succeeds when an operator masked the unit (`systemctl mask --now`: the
    # agent frozen, runbook "Freezing the agent on a node"): the recipe then
    # neither enables, starts nor restarts it. UnitFileState is `masked` or
    # `masked-runtime`.
    MASKED = "systemctl show --property UnitFileState --value #{UNIT} | grep -q '^masked'"
  end
end
