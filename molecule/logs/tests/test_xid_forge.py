"""The on-call XID page cannot be forged from a GPU node.

An unprivileged user on each GPU node (Promtail on one, Alloy on the other) writes the driver's XID 79 line with
`logger -t kernel`: it reaches Loki with syslog_identifier="kernel" but transport="syslog", and Loki's ruler must
raise NO alert for it. In the same evaluations, the positive control: the lab's injector writes an XID 79 line of
another GPU as a kernel-transport journal entry (roles/lab_gpu_simulator, journal-remote), which DOES raise
HpcobsGpuXidKernelLogCritical for that node. Both lines are in Loki before the evaluation that fires the control, so
that one evaluation also proves the forged line fires nothing (the rules have no `for`; the scenario evaluates every
5s).
"""
import json
import re
import shlex
import time

import testinfra

from helpers import LOKI_LOCAL, MGMT, NODE, http_json, query
from polling import wait_for

testinfra_hosts = [NODE]

NODES = (NODE, "logs-gpu02")  # Promtail, Alloy
FORGER = "hpcobs-forger"
FORGED_PCI = "0000:3b:00"
FORGED = "NVRM: Xid (PCI:%s): 79, pid=1, name=x, GPU has fallen off the bus." % FORGED_PCI
SIM = "/usr/local/bin/hpcobs-gpusim"


def node(name):
    return testinfra.get_host("podman://%s" % name)


def ruler_alerts():
    return http_json(node(MGMT), LOKI_LOCAL + "/prometheus/api/v1/alerts")["data"]["alerts"]


def inject_control(host):
    """XID 79 on a simulated GPU whose address is not the forged one, the lab's way; its kernel PCI address."""
    for gpu in (0, 1):
        out = host.check_output("%s fault set --gpu %d xid --code 79 --journal journal-remote" % (SIM, gpu))
        assert "[journal-remote]" in out, out
        pci = re.search(r"NVRM: Xid \(PCI:([0-9a-f:]+)\): 79, ", out).group(1)
        if pci != FORGED_PCI:
            return gpu, pci
        host.check_output("%s fault clear --gpu %d" % (SIM, gpu))
    raise AssertionError("no simulated GPU with an address other than %s" % FORGED_PCI)


def test_a_forged_kernel_xid_line_pages_nobody_while_a_kernel_one_does():
    since = time.time_ns() - 10 ** 9
    controls = {}
    try:
        for name in NODES:
            host = node(name)
            host.check_output("id -u %s >/dev/null 2>&1 || useradd --create-home --shell /bin/sh %s" % (FORGER, FORGER))
            assert host.check_output("id -u %s" % FORGER) != "0"
            assert not {"root", "adm", "systemd-journal"} & set(host.check_output("id -nG %s" % FORGER).split())
            host.check_output("runuser -u %s -- logger -t kernel %s" % (FORGER, shlex.quote(FORGED)))
            controls[name] = inject_control(host)

        def shipped():
            streams = query(node(NODE), '{node=~"%s"} |= "NVRM: Xid"' % "|".join(NODES), since)
            found = {(s["stream"]["node"], s["stream"].get("transport"), v[1]) for s in streams for v in s["values"]}
            forged = {name for name, _, line in found if line == FORGED}
            kernel = {name for name, _, line in found if "(PCI:%s): 79, " % controls[name][1] in line}
            return found if forged == kernel == set(NODES) else None
        found = wait_for("the forged and the kernel XID lines of both nodes in Loki", shipped, 30)
        for name, transport, line in found:
            # both lines carry the identifier any client can set; only the kernel's has transport="kernel"
            assert transport == ("syslog" if FORGED_PCI in line else "kernel"), (name, transport, line)

        def control_alerts():
            alerts = [a for a in ruler_alerts() if a["labels"]["alertname"] == "HpcobsGpuXidKernelLogCritical"
                      and a["labels"]["node"] in NODES]
            return alerts if {a["labels"]["node"] for a in alerts} == set(NODES) else None
        alerts = wait_for("HpcobsGpuXidKernelLogCritical for the kernel lines (ruler every 5s)", control_alerts, 30)
        assert {(a["labels"]["node"], a["labels"]["pci"], a["labels"]["xid"], a["state"]) for a in alerts} == {
            (name, controls[name][1], "79", "firing") for name in NODES}, json.dumps(alerts)
        assert all(a["labels"]["severity"] == "critical" and a["labels"]["audience"] == "oncall" for a in alerts)
        # the forged line (and test_pipeline's logger line of the same address) raised nothing, in any rule
        forged = [a for a in ruler_alerts() if a["labels"].get("pci") == FORGED_PCI]
        assert forged == [], json.dumps(forged)
        rules = http_json(node(MGMT), LOKI_LOCAL + "/prometheus/api/v1/rules")["data"]["groups"][0]["rules"]
        assert {r["name"]: r["state"] for r in rules} == {"HpcobsGpuXidKernelLogCritical": "firing",
                                                          "HpcobsGpuXidKernelLog": "inactive"}
    finally:
        for name, (gpu, _) in controls.items():
            node(name).run("%s fault clear --gpu %d" % (SIM, gpu))


def test_the_injector_left_no_listener_and_wrote_the_nodes_own_journal():
    for name in NODES:
        host = node(name)
        # the package's remote-journal service stays off: nothing listens on its port (19532)
        assert host.run("systemctl is-enabled systemd-journal-remote.socket").stdout.strip() != "enabled"
        assert not host.socket("tcp://0.0.0.0:19532").is_listening
        machine = host.file("/etc/machine-id").content_string.strip()
        journal = host.file("/var/log/journal/%s/hpcobs-gpusim-kernel.journal" % machine)
        assert journal.exists and journal.user == "root" and journal.group == "systemd-journal"
        assert not journal.mode & 0o007
        # journalctl -k (this boot's kernel messages, as the runbook reads them) has the control line
        assert "NVRM: Xid" in host.check_output("journalctl -k --no-pager -g 'NVRM: Xid'")
