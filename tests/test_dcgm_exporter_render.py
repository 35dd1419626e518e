"""Render the dcgm_exporter role's unit, counters CSV and tmpfiles entry for every install method.

The package and binary methods need NVIDIA's packages and GPUs, which the test machines do not have, so Molecule
only runs the "none" method (the GPU simulator). Here the role's own templates and derived variables
(roles/dcgm_exporter/vars/main.yml; the unit is the shared roles/service template with the values the role's
configure.yml gives it) are rendered by ansible-playbook on localhost for each method, then checked:
flags, device access, capabilities, host engine ordering, `systemd-analyze verify` and `systemd-analyze security`,
and the CSV is parsed by the GPU simulator's dcgm-exporter-compatible parser.
"""
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tooling import service_unit_vars

REPO = Path(__file__).resolve().parents[1]
ROLE = REPO / "roles" / "dcgm_exporter"
SERVICE = REPO / "roles" / "service"
SIM = REPO / "roles" / "lab_gpu_simulator" / "files" / "hpcobs-gpusim"

CASES = {
    "package": {},
    "binary": {"dcgm_exporter_install_method": "binary",
               "dcgm_exporter_extra_packages": ["datacenter-gpu-manager-4-cuda12"]},
    "embedded": {"dcgm_exporter_remote_hostengine": "",
                 "dcgm_exporter_capabilities": ["CAP_SYS_ADMIN"],
                 "dcgm_exporter_supplementary_groups": ["video"]},
    "none": {"dcgm_exporter_install_method": "none",
             "dcgm_exporter_executable": "/usr/local/bin/hpcobs-gpusim",
             "dcgm_exporter_remote_hostengine": "",
             "dcgm_exporter_device_allow": [],
             "dcgm_exporter_state_directory": "hpcobs-gpusim",
             "dcgm_exporter_extra_fields": [
                 {"field": "DCGM_FI_DEV_FB_TOTAL", "type": "gauge", "help": "Total frame buffer (MiB)."},
                 {"field": "DCGM_FI_DEV_SERIAL", "type": "label", "help": "Board serial number."}]},
    "no_mapping": {"dcgm_exporter_job_mapping_dir": "", "dcgm_exporter_listen_address": "127.0.0.1:9401",
                   "dcgm_exporter_extra_args": ["--kubernetes=false"]},
    # the site's GPU sample interval sets the collect interval (and VictoriaMetrics' dcgm scrape interval)
    "sample_interval": {"hpcobs_gpu_sample_interval": "1m30s"},
}


def ansible_playbook():
    beside = Path(sys.executable).parent / "ansible-playbook"
    if beside.exists():
        return str(beside)
    found = shutil.which("ansible-playbook")
    if not found:
        pytest.fail("ansible-playbook not found (next to the Python running pytest, or on PATH)")
    return found


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("dcgm_exporter")
    plays = []
    for case, overrides in CASES.items():
        (out / case).mkdir()
        # the role's defaults with the case's settings on top (vars_files would rank above play vars)
        variables = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
        variables.update(service_unit_vars(ROLE))
        variables.update({
            "ansible_python_interpreter": "{{ ansible_playbook_python }}",
            # what the role sees when it runs: its path and the host's OS family
            "role_path": str(ROLE),
            "ansible_facts": {"os_family": "Debian"},
            "_out": str(out / case),
            # the plain mode (a site's opt-out of the security switch); the secured unit runs in the gpu_node scenario
            "hpcobs_security": False,
        })
        variables.update(overrides)
        plays.append({
            "name": "Render the %s case" % case,
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars_files": [str(ROLE / "vars" / "main.yml")],
            "vars": variables,
            "tasks": [
                {"name": "Render the templates",
                 "ansible.builtin.copy": {
                     "dest": "{{ _out }}/{{ item.dest }}",
                     "content": "{{ lookup('ansible.builtin.template', item.src) }}",
                     "mode": "0644"},
                 "loop": [{"src": str(SERVICE / "templates" / "service.service.j2"), "dest": "dcgm_exporter.service"},
                          {"src": str(ROLE / "templates" / "hpcobs-counters.csv.j2"), "dest": "hpcobs-counters.csv"},
                          {"src": str(ROLE / "templates" / "hpcobs-dcgm-job-mapping.conf.j2"),
                           "dest": "tmpfiles.conf"}]},
                {"name": "Record the derived values",
                 "ansible.builtin.copy": {
                     "dest": "{{ _out }}/derived.json",
                     "content": "{{ {'packages': _dcgm_exporter_package_list, 'exec': _dcgm_exporter_exec,"
                                " 'hostengine': _dcgm_exporter_hostengine_managed | bool} | to_json }}",
                     "mode": "0644"}},
            ],
        })
    playbook = out / "render.yml"
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
    # the project's filters (beside playbooks/ for the playbooks there; this play is elsewhere)
    env = dict(os.environ, ANSIBLE_FILTER_PLUGINS=str(REPO / "playbooks" / "filter_plugins"))
    proc = subprocess.run([ansible_playbook(), "-i", "localhost,", str(playbook)], capture_output=True, text=True,
                          timeout=300, check=False, cwd=str(REPO), env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def unit(rendered, case):
    return (rendered / case / "dcgm_exporter.service").read_text()


def directives(text):
    """[(key, value)] of a unit file, continuation lines joined."""
    joined = text.replace("\\\n", " ")
    pairs = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            pairs.append((key, value))
    return pairs


def values(text, key):
    return [v for k, v in directives(text) if k == key]


def exec_argv(text):
    return values(text, "ExecStart")[0].split()


def derived(rendered, case):
    return json.loads((rendered / case / "derived.json").read_text())


def test_package_method_defaults(rendered):
    text = unit(rendered, "package")
    assert exec_argv(text) == [
        "/usr/bin/dcgm-exporter", "--collectors", "/etc/dcgm-exporter/hpcobs-counters.csv", "--address", ":9400",
        "--collect-interval", "30000", "--hpc-job-mapping-dir", "/run/hpcobs/dcgm-job-mapping",
        "--remote-hostengine-info", "localhost:5555"]
    # the exporter talks to the node's own host engine: start after it
    assert values(text, "Wants") == ["network-online.target nvidia-dcgm.service"]
    assert values(text, "After") == ["network-online.target nvidia-dcgm.service"]
    # NVML opens the NVIDIA device nodes; nothing else, no capability
    assert values(text, "PrivateDevices") == ["no"]
    assert values(text, "DevicePolicy") == ["closed"]
    assert values(text, "DeviceAllow") == ["char-nvidia-frontend rw", "char-nvidia-caps r"]
    assert values(text, "CapabilityBoundingSet") == [""]
    assert values(text, "AmbientCapabilities") == [""]
    assert values(text, "User") == ["dcgm_exporter"]
    assert values(text, "StateDirectory") == []
    catalog = yaml.safe_load((REPO / "files" / "artifacts.yml").read_text())
    assert derived(rendered, "package") == {
        "packages": catalog["package_only"]["dcgm_exporter"]["packages"]["Debian"],
        "exec": "/usr/bin/dcgm-exporter", "hostengine": True}


def test_binary_method(rendered):
    text = unit(rendered, "binary")
    assert exec_argv(text)[0] == "/usr/local/bin/dcgm-exporter"
    assert derived(rendered, "binary") == {
        "packages": ["datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda12"],
        "exec": "/usr/local/bin/dcgm-exporter", "hostengine": True}


def test_embedded_host_engine_with_profiling_capability(rendered):
    text = unit(rendered, "embedded")
    assert "--remote-hostengine-info" not in exec_argv(text)
    assert values(text, "Wants") == ["network-online.target"]
    assert values(text, "CapabilityBoundingSet") == ["CAP_SYS_ADMIN"]
    assert values(text, "AmbientCapabilities") == ["CAP_SYS_ADMIN"]
    assert values(text, "SupplementaryGroups") == ["video"]
    assert derived(rendered, "embedded")["hostengine"] is False


def test_none_method_runs_the_given_executable_without_devices(rendered):
    text = unit(rendered, "none")
    argv = exec_argv(text)
    assert argv[0] == "/usr/local/bin/hpcobs-gpusim"
    assert "--remote-hostengine-info" not in argv
    assert values(text, "PrivateDevices") == ["yes"]
    assert values(text, "DeviceAllow") == []
    assert values(text, "StateDirectory") == ["hpcobs-gpusim"]
    assert derived(rendered, "none") == {"packages": ["datacenter-gpu-manager-4-core"],
                                         "exec": "/usr/local/bin/hpcobs-gpusim", "hostengine": False}


def test_job_mapping_off_and_extra_args(rendered):
    argv = exec_argv(unit(rendered, "no_mapping"))
    assert "--hpc-job-mapping-dir" not in argv
    assert argv[argv.index("--address") + 1] == "127.0.0.1:9401"
    assert argv[-1] == "--kubernetes=false"


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_unit_is_hardened(rendered, case):
    text = unit(rendered, case)
    for key, value in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                       ("PrivateTmp", "yes"), ("ProtectKernelModules", "yes"), ("ProtectKernelTunables", "yes"),
                       ("RestrictSUIDSGID", "yes"), ("MemoryDenyWriteExecute", "yes"),
                       ("SystemCallFilter", "@system-service"), ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
                       ("Restart", "on-failure")]:
        assert values(text, key) == [value], key


@pytest.mark.parametrize("case", sorted(CASES))
def test_systemd_accepts_the_unit(rendered, case, tmp_path):
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is part of systemd, which the test machines run"
    text = unit(rendered, case)
    # verify needs an existing executable: point ExecStart at one, keep everything else
    program = exec_argv(text)[0]
    path = tmp_path / "dcgm_exporter.service"
    path.write_text(text.replace("ExecStart=%s " % program, "ExecStart=/bin/true ", 1))
    proc = subprocess.run([analyze, "verify", "--man=no", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dcgm_exporter.service:" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


# systemd 252 (Debian 12) rates them 2.0, 1.8 and 2.4; the margin absorbs other systemd versions' weighting.
@pytest.mark.parametrize("case,limit", [("package", 2.2), ("none", 2.0), ("embedded", 2.6)])
def test_exposure_score(rendered, case, limit, tmp_path):
    """systemd's own rating of the sandbox (0 = fully locked down, 10 = unprotected)."""
    path = tmp_path / "dcgm_exporter.service"
    path.write_text(unit(rendered, case))
    proc = subprocess.run([shutil.which("systemd-analyze"), "security", "--offline=true", "--no-pager", str(path)],
                          capture_output=True, text=True, check=False)
    line = [x for x in proc.stdout.splitlines() if "Overall exposure level" in x]
    assert line, proc.stdout + proc.stderr
    score = float(line[0].split(":")[1].split()[0])
    assert score <= limit, "\n".join(proc.stdout.splitlines()[-40:])


def load_simulator():
    """The simulator's package (hpcobs_gpusim, beside its launcher SIM), imported without writing bytecode there."""
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    sys.path.insert(0, str(SIM.parent))
    try:
        return importlib.import_module("hpcobs_gpusim")
    finally:
        sys.path.remove(str(SIM.parent))
        sys.dont_write_bytecode = saved


def test_counters_csv_is_the_roles_file_plus_extra_rows_and_parses(rendered):
    sim = load_simulator()
    base = sim.parse_counters_csv((ROLE / "files" / "hpcobs-counters.csv").read_text())
    installed = sim.parse_counters_csv((rendered / "none" / "hpcobs-counters.csv").read_text())
    assert [c.name for c in installed] == [c.name for c in base] + ["DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_SERIAL"]
    assert installed[-1].prom_type == "label" and installed[-2].help == "Total frame buffer (MiB)."
    # without extra fields the installed CSV is the role's file, field for field
    plain = sim.parse_counters_csv((rendered / "package" / "hpcobs-counters.csv").read_text())
    assert [(c.name, c.prom_type, c.help) for c in plain] == [(c.name, c.prom_type, c.help) for c in base]


def test_tmpfiles_entry(rendered):
    lines = [x for x in (rendered / "package" / "tmpfiles.conf").read_text().splitlines() if not x.startswith("#")]
    assert lines == ["d /run/hpcobs/dcgm-job-mapping 0755 root root -"]


@pytest.mark.parametrize("value,refused", [("/run/nvidia-dcgm/nv-hostengine.sock", True),
                                           ("unix:///run/nvidia-dcgm/nv-hostengine.sock", True),
                                           ("localhost:5555", False), ("", False)])
def test_preflight_refuses_a_unix_socket_for_the_host_engine(tmp_path, value, refused):
    """dcgm-exporter hands the value to DCGM as a TCP address: the role refuses a socket before anything changes."""
    tasks = yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())
    (task,) = [t for t in tasks if t.get("name") == "Refuse a Unix socket for the host engine"]
    playbook = tmp_path / "check.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "connection": "local", "gather_facts": False,
                                         "vars": {"dcgm_exporter_remote_hostengine": value,
                                                  "ansible_python_interpreter": "{{ ansible_playbook_python }}"},
                                         "tasks": [task]}]))
    result = subprocess.run([ansible_playbook(), "-i", "localhost,", str(playbook)], capture_output=True, text=True,
                            timeout=300, env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg")), cwd=REPO)
    output = " ".join(result.stdout.split())
    assert (result.returncode != 0) == refused, output[-2000:]
    if refused:
        assert "connects to nv-hostengine over TCP only" in output and "Nothing was changed." in output


@pytest.mark.parametrize("value", ["/run/nvidia-dcgm/nv-hostengine.sock", "unix:///tmp/nv-hostengine"])
def test_the_simulator_refuses_a_unix_socket_as_dcgm_exporter_fails_on_it(tmp_path, value):
    env = dict(os.environ, HPCOBS_GPUSIM_CONFIG="none")
    result = subprocess.run([sys.executable, str(SIM), "-r", value, "--sim-state-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == 1 and "Failed to connect to remote hostengine" in result.stderr, result.stderr
    by_env = subprocess.run([sys.executable, str(SIM), "--sim-state-dir", str(tmp_path)], capture_output=True,
                            text=True, timeout=30, env=dict(env, DCGM_REMOTE_HOSTENGINE_INFO=value))
    assert by_env.returncode == 1 and "over TCP only" in by_env.stderr


def test_the_collect_interval_follows_the_sites_gpu_sample_interval(rendered):
    argv = exec_argv(unit(rendered, "sample_interval"))
    assert argv[argv.index("--collect-interval") + 1] == "90000"
