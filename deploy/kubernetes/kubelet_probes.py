#!/usr/bin/env python3
"""Runs a Deployment's httpGet probes the way the kubelet does.

podman 4.3 does not run readiness or startup probes, so deploy/kubernetes/
test.sh runs this inside the pod's network namespace (`nsenter -t PID -n`).
For every container of the Deployment in MANIFEST it follows the kubelet's
rules (pkg/kubelet/prober/worker.go):

- the startup probe runs first, from initialDelaySeconds, every
  periodSeconds; one success marks the container started, failureThreshold
  failures in a row would restart it;
- readiness and liveness are not probed before the container has started;
  readiness starts as failing and changes after successThreshold successes
  or failureThreshold failures in a row; liveness starts as passing and
  failureThreshold failures in a row would restart the container;
- the pod is ready when every container is ready.

A probe is an HTTP GET to HOST (the pod IP for the kubelet; the pod's
loopback here) with timeoutSeconds; 200-399 passes. One line per probe run
and per change goes to stdout:
  <seconds since start> <container> <probe> pass|fail <detail>
  <seconds> <container> started|startup-failed|ready|unready|liveness-failed
  <seconds> pod ready|unready
SIGUSR1 marks the container named by --restarted as restarted (its probes
start over from its startup probe), as the kubelet does for a new
container. Runs until SIGTERM.
"""

import argparse
import http.client
import signal
import sys
import time

import yaml


class Probe:
    def __init__(self, kind, spec, ports):
        self.kind = kind
        get = spec["httpGet"]
        port = get["port"]
        self.port = ports[port] if isinstance(port, str) else int(port)
        self.path = get.get("path", "/")
        self.initial_delay = spec.get("initialDelaySeconds", 0)
        self.period = spec.get("periodSeconds", 10)
        self.timeout = spec.get("timeoutSeconds", 1)
        self.success_threshold = spec.get("successThreshold", 1)
        self.failure_threshold = spec.get("failureThreshold", 3)


class Container:
    def __init__(self, spec, now):
        self.name = spec["name"]
        ports = {p["name"]: p["containerPort"] for p in spec.get("ports", []) if "name" in p}
        self.probes = {
            kind: Probe(kind, spec[kind + "Probe"], ports)
            for kind in ("startup", "readiness", "liveness")
            if kind + "Probe" in spec
        }
        self.restart(now)

    def restart(self, now):
        self.start = now
        self.started = "startup" not in self.probes
        self.ready = "readiness" not in self.probes
        self.runs = {kind: 0 for kind in self.probes}  # consecutive, + pass, - fail
        self.next = {kind: now + p.initial_delay for kind, p in self.probes.items()}
        if self.started:
            self.on_started(now)

    def on_started(self, now):
        for kind in ("readiness", "liveness"):
            if kind in self.probes:
                p = self.probes[kind]
                self.next[kind] = max(now, self.start + p.initial_delay)

    def due(self, kind):
        if kind not in self.probes:
            return False
        if kind == "startup":
            return not self.started
        return self.started


def get(host, probe):
    try:
        conn = http.client.HTTPConnection(host, probe.port, timeout=probe.timeout)
        conn.request("GET", probe.path, headers={"User-Agent": "kube-probe/1.30"})
        status = conn.getresponse().status
        conn.close()
        return 200 <= status < 400, str(status)
    except OSError as e:
        return False, type(e).__name__


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("manifest")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--restarted", default="")
    args = ap.parse_args()

    with open(args.manifest) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    deployment = next(d for d in docs if d.get("kind") == "Deployment")
    origin = time.monotonic()
    containers = [Container(c, origin) for c in deployment["spec"]["template"]["spec"]["containers"]]

    def say(*words):
        print(f"{time.monotonic() - origin:.3f}", *words, flush=True)

    restarts = []
    signal.signal(signal.SIGUSR1, lambda *_: restarts.append(args.restarted))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    pod_ready = False
    say("pod", "unready")
    while True:
        now = time.monotonic()
        while restarts:
            name = restarts.pop()
            for c in containers:
                if c.name == name:
                    c.restart(now)
                    say(c.name, "restarted")
        for c in containers:
            for kind in ("startup", "readiness", "liveness"):
                if not c.due(kind) or now < c.next[kind]:
                    continue
                probe = c.probes[kind]
                c.next[kind] = now + probe.period
                ok, detail = get(args.host, probe)
                say(c.name, kind, "pass" if ok else "fail", detail)
                run = c.runs[kind]
                c.runs[kind] = (run + 1 if run > 0 else 1) if ok else (run - 1 if run < 0 else -1)
                if kind == "startup":
                    if ok:
                        c.started = True
                        say(c.name, "started")
                        c.on_started(now)
                    elif -c.runs[kind] >= probe.failure_threshold:
                        say(c.name, "startup-failed")
                        c.restart(now)
                elif kind == "readiness":
                    if ok and not c.ready and c.runs[kind] >= probe.success_threshold:
                        c.ready = True
                        say(c.name, "ready")
                    elif not ok and c.ready and -c.runs[kind] >= probe.failure_threshold:
                        c.ready = False
                        say(c.name, "unready")
                elif not ok and -c.runs[kind] >= probe.failure_threshold:
                    say(c.name, "liveness-failed")
                    c.restart(now)
        ready = all(c.ready for c in containers)
        if ready != pod_ready:
            pod_ready = ready
            say("pod", "ready" if ready else "unready")
        wake = min(
            (c.next[k] for c in containers for k in c.probes if c.due(k)),
            default=now + 1,
        )
        time.sleep(max(0.01, min(wake - time.monotonic(), 1.0)))


if __name__ == "__main__":
    main()
