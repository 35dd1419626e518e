"""Shared testinfra setup for every Molecule scenario.

Molecule hands testinfra its Ansible inventory; testinfra would then run every command through a full Ansible
module round trip (about a second each). The test hosts are local podman containers named like their inventory
hosts, so the checks run in them directly, the way the scenarios' connection plugin runs tasks: with nsenter in the
namespaces of the container's init process (a few milliseconds a command, where `podman exec` takes a few hundred).
"""
import shlex

import pytest
import testinfra
from ansible.errors import AnsibleConnectionFailure
from connection_plugins.hpcobs_nsenter import init_pid, nsenter_argv
from testinfra.backend import base


class NsenterBackend(base.BaseBackend):
    """Commands in a running local container, as root, through nsenter (molecule/shared/connection_plugins)."""

    NAME = "hpcobs-nsenter"

    def __init__(self, name, *args, **kwargs):
        self.name = name
        super().__init__(name, *args, **kwargs)

    def run(self, command, *args, **kwargs):
        cmd = self.get_command(command, *args)
        try:
            pid = init_pid(self.name)
        except AnsibleConnectionFailure as error:  # stopped or restarting: a failed command, as podman exec gives
            return self.result(125, self.encode(cmd), b"", str(error).encode())
        out = self.run_local(" ".join(shlex.quote(a) for a in nsenter_argv(pid, ["/bin/sh", "-c"])) + " %s", cmd)
        out.command = self.encode(cmd)
        return out


def nsenter_host(name):
    """The test host `name` (a local container) as a testinfra Host running commands through nsenter."""
    nsenter = NsenterBackend(name)
    target = testinfra.host.Host(nsenter)
    nsenter.set_host(target)
    return target


@pytest.fixture(scope="module")
def host(_testinfra_host):
    backend = _testinfra_host.backend
    if getattr(backend, "NAME", "") == "ansible":
        return nsenter_host(backend.host)
    return _testinfra_host


@pytest.fixture(scope="session")
def named_host():
    """nsenter_host, for a test about one host of the scenario: it runs once instead of once per host."""
    return nsenter_host
