"""The roles' preflight refuses bad inputs with a clear message and changes nothing: molecule/gpu_node/refusals.yml
runs every case against the converged test host (outside the "lab" group of its own inventory)."""
import json
import os
import shutil
import subprocess

import pytest
import testinfra

from gpu_node_lib import COUNTERS, EXPECTED

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIO = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(SCENARIO))
WATCHED = ["/etc/systemd/system/dcgm_exporter.service", COUNTERS, "/etc/hpcobs-gpusim/config.json",
           "/usr/local/bin/hpcobs-gpusim", "/etc/tmpfiles.d/hpcobs-dcgm-job-mapping.conf"]


def start_refusals(name):
    """Start ansible-playbook refusals.yml against one test host (in an inventory of its own)."""
    env = dict(os.environ)
    env.update({
        "ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": os.path.join(ROOT, "roles"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_NOCOLOR": "1",
        "HPCOBS_BUNDLE_DIR": env.get("HPCOBS_BUNDLE_DIR") or os.path.join(ROOT, ".cache/bundle-test/bundle"),
    })
    cmd = [shutil.which("ansible-playbook") or "ansible-playbook", "-i", "%s," % name,
           "-c", "hpcobs_nsenter", "-e", "ansible_python_interpreter=/usr/bin/python3",
           os.path.join(SCENARIO, "refusals.yml")]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_refusals(name, proc):
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-4000:] + err[-4000:]
    report = json.loads(out)
    last = report["plays"][0]["tasks"][-1]
    assert last["task"]["name"] == "Report the refusals"
    return last["hosts"][name]["_refusals | default({})"], report["stats"][name]


_RESULTS = {}


def checksums(host):
    return {path: host.file(path).sha256sum for path in WATCHED}


@pytest.fixture(scope="module")
def refusals(host):
    # The first test host's fixture runs the playbook against every test host (side by side) and keeps the results.
    if not _RESULTS:
        hosts = {name: testinfra.get_host("podman://%s" % name) for name in sorted(EXPECTED)}
        before = {name: checksums(h) for name, h in hosts.items()}
        running = {name: start_refusals(name) for name in hosts}
        results = {name: finish_refusals(name, proc) for name, proc in running.items()}
        for name, test_host in hosts.items():
            assert checksums(test_host) == before[name], "the refused runs changed files on %s" % name
        _RESULTS.update(results)
    # the playbook's own /dev/nvidiactl fixture is gone again
    assert not host.file("/dev/nvidiactl").exists
    return _RESULTS[host.backend.name]


def test_nothing_changed(refusals):
    _, stats = refusals
    assert stats["changed"] == 0
    assert stats["failures"] == 0 and stats["unreachable"] == 0
    assert stats["rescued"] == 8


@pytest.mark.parametrize("case,words", [
    ("not_lab", ['is not in the inventory group "lab"', "lab_gpu_simulator_enabled", "Nothing was changed"]),
    ("nvidiactl", ["has /dev/nvidiactl", "real NVIDIA GPU node", "Nothing was changed"]),
    ("none_missing", ["/usr/local/bin/no-such-exporter does not exist", "Nothing was changed"]),
    ("package_no_repo", ["cannot install datacenter-gpu-manager-4-core, datacenter-gpu-manager-exporter",
                         "mirror of NVIDIA", "Nothing was changed"]),
    ("binary_no_artifact", ["has no dcgm_exporter", "Nothing was changed"]),
    ("extra_comma", ["DCGM_FI_DEV_FB_TOTAL", "Total memory, in MiB", "help (text without commas",
                     "Nothing was changed"]),
    ("extra_duplicate", ["DCGM_FI_DEV_GPU_TEMP is listed twice", "Nothing was changed"]),
    ("mapping_dir", ["job_mapping_dir", "/var/lib/dcgm-job-mapping", "Nothing was changed"]),
])
def test_refusal_message(refusals, case, words):
    messages, _ = refusals
    assert case in messages, "case %s was not refused: %s" % (case, sorted(messages))
    message = " ".join(messages[case].split())
    for word in words:
        assert word in message, message


def test_each_lab_refusal_names_only_its_own_reason(refusals):
    messages, _ = refusals
    assert "nvidiactl" not in messages["not_lab"]
    assert "inventory group" not in messages["nvidiactl"]
