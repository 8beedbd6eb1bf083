#!/usr/bin/env python3
"""Turns the shipped manifest into what podman 4.3 `kube play` can run.

  podman_manifest.py MANIFEST OUTDIR SUFFIX AGENT_IMAGE HAPROXY_IMAGE RUNDIR

Writes OUTDIR/secret.yaml, OUTDIR/configmap.yaml and OUTDIR/deployment.yaml.
Only what must differ on one machine without a cluster or a registry is
changed, each for the reason given:

- images: the locally built ones (no registry);
- replicas: 1 (podman makes one pod per replica);
- names of the Deployment, ConfigMap and Secret get SUFFIX: podman's secrets
  and volumes are global to the machine, so runs must not share them;
- HOST_IP: 127.0.0.1, the pod's own loopback, where the test runs Consul in
  place of the node's Consul agent (podman has no status.hostIP);
- `$(VAR)` references in command and args are expanded from the
  container's env, as the kubelet does (podman 4.3 passes them verbatim);
- containerPort entries are dropped: podman 4.3 turns them into host port
  mappings, which a `--network none` pod cannot have (the probes still
  resolve named ports from the shipped manifest);
- emptyDir volumes become hostPaths RUNDIR/<volume name> (mode 1777):
  podman's emptyDir is root-owned 0755 where the kubelet's is 0777, and the
  test reads HAProxy's stats socket there;
- Secret stringData becomes data (podman 4.3 reads only data), and secret
  volumes say `optional: false` (podman 4.3 dereferences it unset).
"""

import base64
import os
import re
import sys

import yaml


def main():
    manifest, outdir, suffix, agent_image, haproxy_image, rundir = sys.argv[1:7]
    with open(manifest) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    by_kind = {d["kind"]: d for d in docs}
    cm, secret, dep = by_kind["ConfigMap"], by_kind["Secret"], by_kind["Deployment"]

    cm_name, secret_name = cm["metadata"]["name"], secret["metadata"]["name"]
    cm["metadata"]["name"] += suffix
    secret["metadata"]["name"] += suffix
    dep["metadata"]["name"] += suffix

    data = secret.setdefault("data", {})
    for key, value in secret.pop("stringData", {}).items():
        data[key] = base64.b64encode(value.encode()).decode()

    spec = dep["spec"]
    spec["replicas"] = 1
    pod = spec["template"]["spec"]
    for v in pod["volumes"]:
        if "configMap" in v and v["configMap"]["name"] == cm_name:
            v["configMap"]["name"] += suffix
        if "secret" in v and v["secret"]["secretName"] == secret_name:
            v["secret"]["secretName"] += suffix
            v["secret"]["optional"] = False
        if "emptyDir" in v:
            del v["emptyDir"]
            path = os.path.join(rundir, v["name"])
            os.makedirs(path, exist_ok=True)
            os.chmod(path, 0o1777)
            v["hostPath"] = {"path": path, "type": "Directory"}
        old = v["name"]
        v["name"] += suffix
        for c in pod["containers"]:
            for m in c.get("volumeMounts", []):
                if m["name"] == old:
                    m["name"] = v["name"]

    for c in pod["containers"]:
        c.pop("ports", None)
        c["image"] = agent_image if c["name"] == "gitlab-haproxy-agent" else haproxy_image
        for e in c.get("env", []):
            if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.hostIP":
                del e["valueFrom"]
                e["value"] = "127.0.0.1"
        env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
        for field in ("command", "args"):
            if field in c:
                c[field] = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), a) for a in c[field]]

    for name, doc in (("secret", secret), ("configmap", cm), ("deployment", dep)):
        with open(f"{outdir}/{name}.yaml", "w") as f:
            yaml.safe_dump(doc, f, sort_keys=False)


if __name__ == "__main__":
    main()
