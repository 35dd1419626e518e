"""Shared testinfra setup for every Molecule scenario.

Molecule hands testinfra its Ansible inventory; testinfra would then run every command through a full Ansible
module round trip (about a second each). The test hosts are local podman containers named like their inventory
hosts, so the checks run in them directly: with nsenter in the namespaces of the container's init process (a few
milliseconds a command, where `podman exec` takes a few hundred).
"""
import subprocess

import pytest
import testinfra
from testinfra.backend import base

ENVIRONMENT = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8"


class NsenterBackend(base.BaseBackend):
    """Commands in a running local container, as root, through nsenter (the connection plugin of the scenarios,
    molecule/shared/connection_plugins/hpcobs_nsenter.py, works the same way)."""

    NAME = "hpcobs-nsenter"

    def __init__(self, name, *args, **kwargs):
        self.name = name
        proc = subprocess.run(["podman", "inspect", "--type", "container", "--format", "{{.State.Pid}}", name],
                              capture_output=True, text=True, check=False)
        self.pid = proc.stdout.strip()
        if proc.returncode != 0 or not self.pid.isdigit() or self.pid == "0":
            raise RuntimeError("container %s is not running: %s" % (name, proc.stderr.strip()))
        super().__init__(name, *args, **kwargs)

    def run(self, command, *args, **kwargs):
        cmd = self.get_command(command, *args)
        out = self.run_local("nsenter --target %s --mount --uts --ipc --net --pid --cgroup --root --wd "
                             "/usr/bin/env -i " + ENVIRONMENT + " /bin/sh -c %s", self.pid, cmd)
        out.command = self.encode(cmd)
        return out


@pytest.fixture(scope="module")
def host(_testinfra_host):
    backend = _testinfra_host.backend
    if getattr(backend, "NAME", "") == "ansible":
        nsenter = NsenterBackend(backend.host)
        target = testinfra.host.Host(nsenter)
        nsenter.set_host(target)
        return target
    return _testinfra_host
