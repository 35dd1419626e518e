#!/usr/bin/env python3
"""The lab's published ports and endpoints, from the components map (files/components.yml) and the lab inventory.

A management UI or API (`lab: true` in the map) is published on 127.0.0.1 at its own port; every other service at
20000 + its port + the host's place in the inventory (node_exporter of the third host: 29102).

    scripts/lab-endpoints.py ports HOST        "hostport:containerport ..." for podman run -p 127.0.0.1:...
    scripts/lab-endpoints.py status [DISABLED]  each endpoint and whether it answers (DISABLED: components not deployed)
    scripts/lab-endpoints.py security           "on" or "off": the lab's security switch
    scripts/lab-endpoints.py jobstats-conf      the settings (jobstats.conf format) hpcobs-report reads the lab with

With the site's security switch on (the lab's default), a component marked `tls: true` serves HTTPS from the lab's
site CA (.cache/lab/pki, inventories/lab/group_vars/all.yml): the check trusts that CA, and where an endpoint asks
for a credential it presents the component's client credential (<component>-client) as the stack's own clients do.
"""
import base64
import importlib.util
import os
import ssl
import sys
import urllib.error
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKI = os.path.join(ROOT, ".cache", "lab", "pki")

# The components map, its shared facts and the credential names, as the playbooks read them
_spec = importlib.util.spec_from_file_location(
    "hpcobs_service", os.path.join(ROOT, "playbooks", "filter_plugins", "hpcobs_service.py"))
service = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(service)


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
    with open(os.path.join(ROOT, "inventories", "lab", "hosts.yml"), encoding="utf-8") as handle:
        hosts = lab_hosts(yaml.safe_load(handle))
    return endpoints(service.load_components(), hosts)


def published(host, component):
    """The 127.0.0.1 port the lab publishes for a component of a host."""
    return next(port for name, comp, port, _, _ in load() if name == host and comp == component)


def lab_security():
    """The lab's security switch: hpcobs_security of inventories/lab/group_vars/all.yml, else the map's default."""
    with open(os.path.join(ROOT, "inventories", "lab", "group_vars", "all.yml"), encoding="utf-8") as handle:
        lab_vars = yaml.safe_load(handle) or {}
    return bool(lab_vars.get("hpcobs_security", service.shared_fact("security")))


def client_credential(component):
    """The file of a component's client credential in the lab's PKI (hpcobs_client_credential)."""
    return os.path.join(PKI, "credentials", service.client_credential(component))


def probe(url, component, context):
    """'up', 'HTTP <code>' or 'down (<why>)' of one endpoint: without a credential first, then (on 401) with the
    component's client credential, as the stack's own client of it."""
    headers = {}
    for attempt in (1, 2):
        try:
            code = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=3,
                                          context=context).status
        except urllib.error.HTTPError as exc:
            code = exc.code
        except Exception as exc:  # noqa: BLE001 - report whatever went wrong
            return "down (%s)" % getattr(exc, "reason", exc)
        if code == 401 and attempt == 1 and os.path.exists(client_credential(component)):
            with open(client_credential(component), encoding="utf-8") as handle:
                secret = handle.read().strip()
            user = service.shared_fact("client_user")
            headers = {"Authorization": "Basic " + base64.b64encode(("%s:%s" % (user, secret)).encode()).decode()}
            continue
        break
    if code != 200:
        return "HTTP %d" % code
    return "up (%s)" % ("credential" if headers else "open") if context else "up"


def status(disabled):
    secure = lab_security()
    context = None
    if secure:
        if not os.path.exists(os.path.join(PKI, "ca.crt")):
            print("  the lab's site CA %s is not there yet: run make lab" % os.path.join(PKI, "ca.crt"))
            return
        context = ssl.create_default_context(cafile=os.path.join(PKI, "ca.crt"))
        # the host certificate of the management host: the endpoints that take client certificates only
        mgmt = os.path.join(PKI, "hosts", "mgmt01")
        if os.path.exists(mgmt + ".crt"):
            context.load_cert_chain(mgmt + ".crt", mgmt + ".key")
    tls = {name for name, entry in service.load_components().items() if entry.get("tls")}
    for host, name, published, _, path in load():
        scheme = "https" if secure and name in tls else "http"
        url = "%s://127.0.0.1:%d%s" % (scheme, published, path)
        if name in disabled:
            state = "not deployed (not in the bundle)"
        else:
            state = probe(url, name, context if scheme == "https" else None)
        print("  %-32s %-42s %s" % ("%s %s" % (name, host), url, state))
    if secure:
        print("\nTLS and authentication are on (hpcobs_security): browsers and clients trust the lab's site CA %s;"
              "\nthe client credentials are in %s." % (os.path.join(PKI, "ca.crt"), os.path.join(PKI, "credentials")))


def jobstats_conf():
    """With the switch on, VictoriaMetrics' read-only front of mgmt01 as the Slurm hosts' tools reach it (the lab's CA,
    the reader credential); with it off, VictoriaMetrics itself over plain HTTP."""
    if not lab_security():
        return "url = http://127.0.0.1:%d\n" % published("mgmt01", "victoriametrics")
    return ("# written by scripts/lab.sh report: the lab's read-only front, its CA and the reader credential\n"
            "url = https://127.0.0.1:%d\nca_file = %s\nuser = %s\npassword_file = %s\n"
            % (published("mgmt01", "victoriametrics_reader"), os.path.join(PKI, "ca.crt"),
               service.shared_fact("client_user"), client_credential("victoriametrics_reader")))


def main(argv):
    if len(argv) >= 2 and argv[0] == "ports":
        print(" ".join("%d:%d" % (published, port) for host, _, published, port, _ in load() if host == argv[1]))
    elif argv and argv[0] == "jobstats-conf":
        sys.stdout.write(jobstats_conf())
    elif argv and argv[0] == "security":
        print("on" if lab_security() else "off")
    elif argv and argv[0] == "status":
        status(set(" ".join(argv[1:]).split()))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
