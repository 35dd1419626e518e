"""The smartctl_exporter role's helper (roles/smartctl_exporter/files/smartctl_exporter-smartctl): the allow-list
between the unprivileged exporter and smartctl running with CAP_SYS_RAWIO/CAP_SYS_ADMIN is pinned here."""
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys

import pytest

HELPER = os.path.join(os.path.dirname(__file__), "..", "roles", "smartctl_exporter", "files",
                      "smartctl_exporter-smartctl")
loader = importlib.machinery.SourceFileLoader("smartctl_exporter_smartctl", HELPER)
spec = importlib.util.spec_from_loader("smartctl_exporter_smartctl", loader)
helper = importlib.util.module_from_spec(spec)
loader.exec_module(helper)

READ = ["--json", "--info", "--health", "--attributes", "--tolerance=verypermissive", "--nocheck=standby",
        "--format=brief", "--log=error"]


def read(device_type, device, nocheck="--nocheck=standby"):
    """The device read of smartctl_exporter 0.14 (readjson.go), in its order."""
    args = list(READ)
    args[5] = nocheck
    return args + ["--device=" + device_type, device]


@pytest.mark.parametrize("args", [
    ["--json", "--scan"],
    ["--json", "--scan", "--device", "nvme", "--device", "sat"],
    ["--json", "--scan", "--device", "by-id"],
    read("auto", "/dev/sda"),
    read("nvme", "/dev/nvme0"),
    read("sat", "/dev/disk/by-id/ata-ST4000NM0035-1V4107_ZC1AE78X"),
    read("megaraid,1", "/dev/bus/0"),
    read("sat+megaraid,2", "/dev/bus/0"),
    read("auto", "/dev/sdb", nocheck="--nocheck=never"),
])
def test_exporter_calls_are_allowed(args):
    assert helper.check(args) is None


@pytest.mark.parametrize("args", [
    ["--scan-open"],
    ["--json", "--scan-open"],
    ["--json", "--scan", "--device"],
    ["--json", "--scan", "-d", "nvme"],
    ["--json", "--scan", "--device", "nvme;id"],
    ["--set=standby,now", "/dev/sda"],
    ["-t", "long", "/dev/sda"],
    ["--smart=off", "/dev/sda"],
    read("auto", "/etc/shadow"),
    read("auto", "/dev/../etc/shadow"),
    read("auto", "/dev/sda/../../etc/shadow"),
    read("auto", "relative/sda"),
    read("auto;id", "/dev/sda"),
    read("auto", "/dev/sda", nocheck="--nocheck=bogus"),
    READ[:-1] + ["--set=apm,off", "--device=auto", "/dev/sda"],
    read("auto", "/dev/sda") + ["--xall"],
    "--json --scan",
    [None],
])
def test_anything_else_is_refused(args):
    assert helper.check(args)


def test_server_refuses_without_running_smartctl(tmp_path):
    marker = tmp_path / "ran"
    fake = tmp_path / "smartctl"
    fake.write_text("#!/bin/sh\ntouch %s\n" % marker)
    fake.chmod(0o755)
    code = open(HELPER).read().replace('SMARTCTL = "/usr/sbin/smartctl"', "SMARTCTL = %r" % str(fake))
    script = tmp_path / "helper.py"
    script.write_text(code)
    request = json.dumps({"args": ["--set=standby,now", "/dev/sda"]}).encode() + b"\n"
    out = subprocess.run([sys.executable, str(script), "serve"], input=request, capture_output=True, timeout=30,
                         check=True)
    assert json.loads(out.stdout) == {"rc": 2, "output": ""}
    assert not marker.exists()
    # an allowed call reaches smartctl with exactly the arguments given
    fake.write_text("#!/bin/sh\necho \"$*\"\nexit 4\n")
    request = json.dumps({"args": ["--json", "--scan"]}).encode() + b"\n"
    out = subprocess.run([sys.executable, str(script), "serve"], input=request, capture_output=True, timeout=30,
                         check=True)
    assert json.loads(out.stdout) == {"rc": 4, "output": "--json --scan\n"}
