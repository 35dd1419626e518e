"""Shared testinfra setup for every Molecule scenario.

Molecule hands testinfra its Ansible inventory, whose hosts use the containers.podman connection plugin; testinfra
would then run every command through a full Ansible module round trip (about a second each). The test hosts are
podman containers named like their inventory hosts, so the same checks run through `podman exec` directly.
"""
import pytest
import testinfra


@pytest.fixture(scope="module")
def host(_testinfra_host):
    backend = _testinfra_host.backend
    if getattr(backend, "NAME", "") == "ansible":
        return testinfra.get_host("podman://%s" % backend.host)
    return _testinfra_host
