"""The slurm_metrics role: argument_specs list every default, and the unit it writes is hardened and runs the
collector in the mode the settings ask for (rendered by the shared unit template of roles/service on localhost)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tooling import SERVICE_ROLE, service_unit_vars

REPO = Path(__file__).resolve().parents[1]
ROLE = REPO / "roles" / "slurm_metrics"
TEMPLATED = {"slurm_metrics_native", "slurm_metrics_vm_url"}  # defaults computed from globals and the inventory


def test_argument_specs_match_the_defaults():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    options = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert sorted(options) == sorted(defaults)
    for name, spec in options.items():
        assert spec.get("description"), name
        if name not in TEMPLATED:
            assert spec["default"] == defaults[name], name


# With the security switch (the default) the collector listens on loopback behind its front.
@pytest.mark.parametrize("native,mode,security,listen", [(False, "full", True, "127.0.0.1:9342"),
                                                         (True, "extras", True, "127.0.0.1:9342"),
                                                         (False, "full", False, "0.0.0.0:9341")])
def test_unit_is_hardened_and_runs_the_right_mode(tmp_path, native, mode, security, listen):
    out = tmp_path / "unit"
    given = tmp_path / "unit-vars.yml"
    given.write_text(yaml.safe_dump(service_unit_vars(ROLE)))
    playbook = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
                 "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml"), str(given)],
                 "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
                 "tasks": [{"name": "Unit", "ansible.builtin.template": {
                     "src": str(SERVICE_ROLE / "templates" / "service.service.j2"), "dest": str(out),
                     "mode": "0644"}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(playbook))
    beside = Path(sys.executable).parent / "ansible-playbook"
    result = subprocess.run([str(beside) if beside.exists() else "ansible-playbook", "-i", "localhost,",
                             str(tmp_path / "play.yml"), "-e", json.dumps({"_slurm_metrics_native_on": native,
                                                                           "hpcobs_security": security})],
                            capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1"))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    unit = out.read_text()
    assert "--mode=%s" % mode in unit
    assert "User=hpcobs-slurm-metrics" in unit and "--interval=30" in unit and "--listen=%s" % listen in unit
    for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                 "CapabilityBoundingSet=\n", "MemoryDenyWriteExecute=yes"):
        assert line in unit, line
