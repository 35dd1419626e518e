#!/usr/bin/env python3
"""The lab's published ports and endpoints, from the components map (files/components.yml) and the lab inventory.

A management UI or API (`lab: true` in the map) is published on 127.0.0.1 at its own port; every other service at
20000 + its port + the host's place in the inventory (node_exporter of the third host: 29102).

    scripts/lab-endpoints.py ports HOST        "hostport:containerport ..." for podman run -p 127.0.0.1:...
    scripts/lab-endpoints.py status [DISABLED]  each endpoint and whether it answers (DISABLED: components not deployed)
"""
import os
import sys
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lab_hosts(inventory):
    """[(host, {groups})] of the lab inventory, in its order."""
    hosts = {}

    def walk(name, node):
        for host in (node or {}).get("hosts") or {}:
            hosts.setdefault(host, set()).add(name)
        for child, sub in ((node or {}).get("children") or {}).items():
            walk(child, sub)

    walk("all", inventory.get("all"))
    return list(hosts.items())


def endpoints(components, hosts, log_shipper="promtail"):
    """[(host, component, host port, container port, ready path)] the lab publishes."""
    out = []
    for index, (host, groups) in enumerate(hosts):
        for name, entry in components.items():
            if "port" not in entry or not groups & set(entry["groups"]):
                continue
            if name in ("promtail", "alloy") and name != log_shipper:
                continue
            port = entry["port"]
            out.append((host, name, port if entry.get("lab") else 20000 + port + index, port,
                        entry.get("ready_path", "/")))
    return out


def load():
    with open(os.path.join(ROOT, "files", "components.yml"), encoding="utf-8") as handle:
        components = yaml.safe_load(handle)["components"]
    with open(os.path.join(ROOT, "inventories", "lab", "hosts.yml"), encoding="utf-8") as handle:
        hosts = lab_hosts(yaml.safe_load(handle))
    return endpoints(components, hosts)


def status(disabled):
    for host, name, published, _, path in load():
        url = "http://127.0.0.1:%d%s" % (published, path)
        if name in disabled:
            state = "not deployed (not in the bundle)"
        else:
            try:
                code = urllib.request.urlopen(url, timeout=3).status
                state = "up" if code == 200 else "HTTP %d" % code
            except Exception as exc:  # noqa: BLE001 - report whatever went wrong
                state = "down (%s)" % getattr(exc, "reason", exc)
        print("  %-32s %-42s %s" % ("%s %s" % (name, host), url, state))


def main(argv):
    if len(argv) >= 2 and argv[0] == "ports":
        print(" ".join("%d:%d" % (published, port) for host, _, published, port, _ in load() if host == argv[1]))
    elif argv and argv[0] == "status":
        status(set(" ".join(argv[1:]).split()))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
