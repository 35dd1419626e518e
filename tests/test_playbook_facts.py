"""Every play that gathers facts gathers the `min` subset, and the roles read only facts that subset has.

The hardware subset statvfs()es every mount: on an HPC node with parallel and network file systems that costs
seconds per node per run, or the whole gather timeout when one server does not answer. The facts the roles need
(OS, architecture, service manager, SELinux, host name, local facts) are all in `min`; Alertmanager gathers the
network subset itself when it needs the host's addresses.
"""
import glob
import os
import re

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What ansible-core's `min` subset returns (ansible.module_utils.facts: platform, distribution, service_mgr,
# selinux, local, python, env, user, ... collectors), as far as the roles read it.
MIN_FACTS = {"architecture", "distribution", "distribution_major_version", "distribution_version",
             "distribution_release", "os_family", "service_mgr", "selinux", "hostname", "fqdn", "nodename",
             "python", "python_version", "local", "env", "user_id", "pkg_mgr", "machine", "system", "kernel"}
# Read after a task of the same role gathers them (module or setup with another subset).
GATHERED_BY_THE_ROLE = {"all_ipv4_addresses": "alertmanager", "all_ipv6_addresses": "alertmanager"}


def plays():
    for path in sorted(glob.glob(os.path.join(ROOT, "playbooks", "*.yml"))
                       + glob.glob(os.path.join(ROOT, "bench", "deploy", "*.yml"))):
        for play in yaml.safe_load(open(path, encoding="utf-8")) or []:
            if isinstance(play, dict) and "hosts" in play:
                yield os.path.relpath(path, ROOT), play


def test_every_play_that_gathers_facts_gathers_the_min_subset():
    found = list(plays())
    assert len(found) > 10
    wrong = ["%s %r" % (path, play.get("name")) for path, play in found
             if play.get("gather_facts", True) is not False and play.get("gather_subset") != ["min"]]
    assert wrong == [], "plays gathering more than the min subset (add gather_subset: [min]): %s" % wrong


def test_the_roles_read_only_facts_of_the_min_subset():
    used = {}
    for path in glob.glob(os.path.join(ROOT, "roles", "*", "**", "*.yml"), recursive=True):
        role = os.path.relpath(path, ROOT).split(os.sep)[1]
        for fact in re.findall(r"ansible_facts\.([a-z0-9_]+)", open(path, encoding="utf-8").read()):
            used.setdefault(fact, set()).add(role)
    assert "architecture" in used and "os_family" in used, "the scan found the roles' facts"
    outside = {fact: sorted(roles) for fact, roles in used.items() if fact not in MIN_FACTS
               and not (fact in GATHERED_BY_THE_ROLE
                        and (GATHERED_BY_THE_ROLE[fact] is None or roles == {GATHERED_BY_THE_ROLE[fact]}))}
    assert outside == {}, "facts outside the min subset (gather them in the role, as alertmanager does): %s" % outside


def test_alertmanager_gathers_the_network_facts_it_reads():
    preflight = open(os.path.join(ROOT, "roles", "alertmanager", "tasks", "preflight.yml"), encoding="utf-8").read()
    assert re.search(r"gather_subset: \[.*network", preflight)
    assert "ansible_facts.all_ipv4_addresses is not defined" in preflight
