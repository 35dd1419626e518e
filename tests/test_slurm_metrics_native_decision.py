"""slurm_metrics' preflight decides per controller whether slurmctld serves the Slurm metrics itself.

The role's own preflight tasks run on localhost against a stand-in `scontrol -V` (it prints the version a test
gives) and a slurm.conf written by the test: auto turns native metrics on only for Slurm 25.11+ whose slurm.conf
lets VictoriaMetrics read them (without a token, or with a JWT of a MetricsAuthUsers user where slurmctld takes JWTs)
and counts GPUs; true fails where they would not work.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ROLE = REPO / "roles" / "slurm_metrics"
GPU_CONF = "GresTypes=gpu\nAccountingStorageTRES=gres/gpu\n"


def decide(tmp_path, version, conf, mode, token_user="", http_jwt=True):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 'slurm %s'\n" % version)
    (bin_dir / "scontrol").chmod(0o755)
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "auth_jwt.so").write_text("")
    if http_jwt:
        (plugins / "http_auth_jwt.so").write_text("")
    (tmp_path / "slurm.conf").write_text("# ClusterName=x\n" + conf + "NodeName=n1 CPUs=2\n")
    out = tmp_path / "decision.json"
    facts = {"os_family": "Debian", "service_mgr": "systemd", "distribution": "Debian", "distribution_version": "13"}
    playbook = [{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars_files": [str(ROLE / "defaults" / "main.yml")],
        "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}",
                 },
        "environment": {"PATH": "%s:%s" % (bin_dir, os.environ["PATH"])},
        "tasks": [
            # a Debian 13 controller with systemd (the test machine's own facts may say otherwise)
            {"name": "Facts", "ansible.builtin.set_fact": {"ansible_facts": facts}},
            {"name": "Preflight", "ansible.builtin.import_tasks": str(ROLE / "tasks" / "preflight.yml")},
            {"name": "Keep the decision", "ansible.builtin.copy": {
                "dest": str(out), "mode": "0644",
                "content": "{{ {'on': _slurm_metrics_native_on | bool, 'version': _slurm_metrics_version_number,"
                           " 'token': _slurm_metrics_token_user} | to_json }}"}},
        ],
    }]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(playbook))
    beside = Path(sys.executable).parent / "ansible-playbook"
    result = subprocess.run([str(beside) if beside.exists() else "ansible-playbook", "-i", "localhost,",
                             str(tmp_path / "play.yml"), "-e", json.dumps({"hpcobs_slurm_native_metrics": mode,
                                                                     "slurm_metrics_token_user": token_user,
                                                                     "slurm_metrics_plugin_dirs": [str(plugins)],
                                                                     "slurm_metrics_slurm_conf": str(tmp_path / "slurm.conf"),
                                                                     # the front (its bundle check) is
                                                                     # test_slurm_metrics_front.py's
                                                                     "slurm_metrics_security": False})],
                            capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                                     # the preflight's tasks run outside the role: its filters as the role has them
                                     ANSIBLE_FILTER_PLUGINS="%s:%s" % (REPO / "playbooks" / "filter_plugins",
                                                                       ROLE / "filter_plugins")))
    if result.returncode != 0:
        return None, result.stdout + result.stderr
    return json.loads(out.read_text()), result.stdout


JWT = "AuthAltTypes=auth/jwt\n"


@pytest.mark.parametrize("version,conf,on", [
    ("26.05.5", GPU_CONF, True),
    ("25.11.7", "", True),                                           # no GPUs: nothing to count
    ("24.11.5", GPU_CONF, False),                                    # too old: the collector serves everything
    ("22.05.8", "", False),
    ("26.05.5", GPU_CONF + "PrivateData=jobs\n", False),             # slurmctld would ask for a token
    ("26.05.5", GPU_CONF + "PrivateData=jobs\nMetricsParameters=ignore_private_data\n", True),
    ("26.05.5", GPU_CONF + "MetricsAuthUsers=prometheus\n", False),  # a token, but slurmctld takes no JWT
    ("26.05.5", GPU_CONF + "PrivateData=jobs\n" + JWT, False),      # a token of root or SlurmUser: never minted
    ("26.05.5", "GresTypes=gpu\n", False),                           # GPUs not tracked as TRES: gauges stay 0
    ("26.05.5", "GresTypes=gpu\n# AccountingStorageTRES=gres/gpu\n", False),
])
def test_auto_uses_native_metrics_only_where_they_work(tmp_path, version, conf, on):
    decision, log = decide(tmp_path, version, conf, "auto")
    assert decision is not None, log[-3000:]
    assert decision == {"on": on, "version": version, "token": ""}


@pytest.mark.parametrize("conf,token_user,token", [
    (GPU_CONF + "MetricsAuthUsers=hpcobs-metrics,prometheus\n" + JWT, "", "hpcobs-metrics"),
    (GPU_CONF + "MetricsAuthUsers=hpcobs-metrics,prometheus\n" + JWT, "prometheus", "prometheus"),
    (GPU_CONF + "PrivateData=jobs\nMetricsAuthUsers=prometheus\nAuthAltTypes=auth/munge,auth/jwt\n", "", "prometheus"),
])
def test_auto_reads_native_metrics_with_a_token_of_a_metrics_auth_user(tmp_path, conf, token_user, token):
    decision, log = decide(tmp_path, "26.05.5", conf, "auto", token_user)
    assert decision == {"on": True, "version": "26.05.5", "token": token}, log[-3000:]


def test_without_slurmctlds_http_jwt_plugin_auto_keeps_the_collector(tmp_path):
    conf = GPU_CONF + "MetricsAuthUsers=hpcobs-metrics\n" + JWT
    decision, log = decide(tmp_path, "26.05.5", conf, "auto", "", http_jwt=False)
    assert decision == {"on": False, "version": "26.05.5", "token": ""}, log[-3000:]
    # slurm.conf's own PluginDir is where the plugin is looked for
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "http_auth_jwt.so").write_text("")
    decision, log = decide(tmp_path / "elsewhere", "26.05.5", conf + "PluginDir=%s\n" % (tmp_path / "elsewhere"),
                           "auto", "", http_jwt=False)
    assert decision == {"on": True, "version": "26.05.5", "token": "hpcobs-metrics"}, log[-3000:]


def test_a_token_user_outside_metrics_auth_users_is_refused(tmp_path):
    decision, log = decide(tmp_path, "26.05.5", GPU_CONF + "MetricsAuthUsers=prometheus\n" + JWT, "auto", "root")
    assert decision is None
    assert "slurm_metrics_token_user root is not in slurm.conf's MetricsAuthUsers=prometheus" in log, log[-3000:]
    assert "Nothing was changed." in log


def test_false_keeps_the_collector_on_26_05(tmp_path):
    decision, log = decide(tmp_path, "26.05.5", GPU_CONF, False)
    assert decision == {"on": False, "version": "26.05.5", "token": ""}, log[-3000:]


@pytest.mark.parametrize("version,conf,says", [
    ("24.11.5", GPU_CONF, "need Slurm 25.11 or newer"),
    ("26.05.5", GPU_CONF + "MetricsAuthUsers=prometheus\n", "asks for a token"),
    ("26.05.5", "GresTypes=gpu\n", "lacks it"),
])
def test_true_fails_before_any_change_where_they_would_not_work(tmp_path, version, conf, says):
    decision, log = decide(tmp_path, version, conf, True)
    assert decision is None, "true was accepted: %r" % decision
    assert says in log and "Nothing was changed." in log, log[-3000:]


def test_a_misspelt_mode_is_refused(tmp_path):
    decision, log = decide(tmp_path, "26.05.5", GPU_CONF, "yes")
    assert decision is None and "native auto, true or false" in log, log[-3000:]
