"""Every unit written through roles/service, rendered as its role configures it (role defaults, role vars, the
values its tasks give the shared template), accepted by `systemd-analyze verify` and rated by `systemd-analyze
security` no worse than the role's own unit template was before it moved to the shared one.
"""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SERVICE = REPO / "roles" / "service"

# systemd 252 (Debian 12) --offline exposure of the role's unit before the shared template, with its defaults.
BEFORE = {"node_exporter": 3.5, "ipmi_exporter": 3.2, "smartctl_exporter": 3.2, "dcgm_exporter": 2.0, "promtail": 3.2,
          "alloy": 3.3, "loki": 3.2, "victoriametrics": 3.2, "vmalert": 3.2, "alertmanager": 3.2, "grafana": 1.7,
          "slurm_metrics": 3.2}
# Units a role writes beside its own: no worse than the unit of the role they serve.
BEFORE["ipmi_exporter-front"] = BEFORE["ipmi_exporter"]
BEFORE["loki-front"] = BEFORE["loki"]
BEFORE["victoriametrics-reader"] = BEFORE["victoriametrics"]
BEFORE["vmagent"] = BEFORE["victoriametrics"]
BEFORE["hpcobs-slurm-metrics-front"] = BEFORE["slurm_metrics"]


def _front_unit_vars():
    """The values roles/service tasks_from: vmauth_front gives the unit template (its import of unit.yml, in the
    tasks it includes for a wanted front)."""
    tasks = yaml.safe_load((SERVICE / "tasks" / "vmauth_front_present.yml").read_text())
    [inner] = [t for t in tasks if t.get("ansible.builtin.import_tasks") == "unit.yml"]
    return inner["vars"]


def unit_calls(role):
    """[(task file, vars)] of the role's tasks that write a unit through roles/service."""
    calls = []
    for path in sorted((REPO / "roles" / role / "tasks").glob("*.yml")):
        for task in yaml.safe_load(path.read_text()) or []:
            call = task.get("ansible.builtin.import_role") or {}
            if call.get("name") == "service" and call.get("tasks_from") == "unit":
                calls.append((path.name, task.get("vars") or {}))
            elif call.get("name") == "service" and call.get("tasks_from") == "vmauth_front":
                given = task.get("vars") or {}
                calls.append((path.name, dict(given, **dict(_front_unit_vars(),
                                                            service_unit="%s.service" % given["service_name"]))))
    return calls


CONVERTED = sorted({path.parent.parent.name for path in (REPO / "roles").glob("*/tasks/*.yml")
                    if unit_calls(path.parent.parent.name)})
# (role, unit name without .service) of every unit written through roles/service
UNITS = sorted((role, str(unit_vars.get("service_unit", role + ".service")).replace(".service", ""))
               for role in CONVERTED for _, unit_vars in unit_calls(role))


def test_the_converted_roles_are_found():
    assert {"node_exporter"} <= set(CONVERTED)
    assert set(CONVERTED) <= set(BEFORE), "record the score of a newly converted role's old unit in BEFORE"
    assert {unit for _, unit in UNITS} <= set(BEFORE), "give a new unit the score of the unit it serves in BEFORE"


# Units that change with the site's security switch (hpcobs_security), rendered both ways: (role, unit) -> what the
# secured unit must name (a file, never a secret).
SECURED = {
    ("victoriametrics", "victoriametrics"): "file:///etc/victoriametrics/tls/",
    # with victoriametrics_remote_write: vmagent's own endpoints and its write to the local VictoriaMetrics
    ("victoriametrics", "vmagent"): "-httpAuth.password=file:///etc/victoriametrics/tls/vmagent-client",
    ("vmalert", "vmalert"): "-httpAuth.password=file:///etc/vmalert/tls/vmalert-client",
    ("node_exporter", "node_exporter"): "--web.config.file=/etc/node_exporter/web.yml",
    ("smartctl_exporter", "smartctl_exporter"): "--web.config.file=/etc/smartctl_exporter/web.yml",
    # the local mode: the exporter serves TLS itself
    ("ipmi_exporter", "ipmi_exporter"): "--web.config.file=/etc/ipmi_exporter/web.yml",
    ("ipmi_exporter", "ipmi_exporter-front"): "-tlsKeyFile=/etc/ipmi_exporter/tls/server.key",
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    return render(tmp_path_factory.mktemp("units"), UNITS, {})


@pytest.fixture(scope="module")
def rendered_secured(tmp_path_factory):
    return render(tmp_path_factory.mktemp("units-secured"), list(SECURED), {"hpcobs_security": True})


def render(out, units, extra):
    """Render the (role, unit) pairs of `units` into `out`, with `extra` variables."""
    plays = []
    for role, unit in units:
        [unit_vars] = [v for _, v in unit_calls(role)
                       if str(v.get("service_unit", role + ".service")).replace(".service", "") == unit]
        # Later files win, as in a real run: the shared defaults, the role's defaults and vars, then what its task
        # gives the template. Read by Ansible itself (role files may hold !unsafe values).
        given = out / ("%s-unit-vars.yml" % unit)
        given.write_text(yaml.safe_dump(unit_vars))
        files = [SERVICE / "defaults" / "main.yml", REPO / "roles" / role / "defaults" / "main.yml",
                 *sorted((REPO / "roles" / role / "defaults" / "main").glob("*.yml")),
                 REPO / "roles" / role / "vars" / "main.yml", given]
        plays.append({
            "name": "Render the unit %s of %s" % (unit, role), "hosts": "localhost", "connection": "local",
            "gather_facts": False, "vars_files": [str(path) for path in files if path.exists()],
            "vars": dict({"ansible_python_interpreter": "{{ ansible_playbook_python }}",
                          "role_path": str(REPO / "roles" / role), "ansible_facts": {"os_family": "Debian"}}, **extra),
            "tasks": [{"name": "Render", "ansible.builtin.copy": {
                "dest": str(out / ("%s.service" % unit)), "mode": "0644",
                "content": "{{ lookup('ansible.builtin.template', '%s') }}" % (SERVICE / "templates" /
                                                                               "service.service.j2")}}],
        })
    playbook = out / "render.yml"
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
    # the project's filters and the roles' own (a role's are on the path when the role runs)
    filters = [REPO / "playbooks" / "filter_plugins"] + sorted((REPO / "roles").glob("*/filter_plugins"))
    env = {"ANSIBLE_FILTER_PLUGINS": ":".join(str(path) for path in filters), "PATH": str(Path(sys.executable).parent)
           + ":/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(out)}
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(playbook)],
                          capture_output=True, text=True, timeout=300, check=False, cwd=str(REPO), env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.mark.parametrize("role", [unit for _, unit in UNITS])
def test_systemd_accepts_the_unit(rendered, role, tmp_path):
    text = (rendered / ("%s.service" % role)).read_text()
    program = [line for line in text.splitlines() if line.startswith("ExecStart=")][0].split("=", 1)[1].split()[0]
    path = tmp_path / ("%s.service" % role)
    path.write_text(text.replace("ExecStart=%s " % program, "ExecStart=/bin/true ", 1))
    proc = subprocess.run([shutil.which("systemd-analyze"), "verify", "--man=no", str(path)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "%s.service:" % role not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize("role", [unit for _, unit in UNITS])
def test_exposure_is_no_worse_than_the_roles_own_unit_was(rendered, role):
    assert_exposure(rendered, role)


@pytest.mark.parametrize("role,unit", list(SECURED))
def test_the_secured_unit_is_no_worse_and_names_no_secret(rendered_secured, role, unit, tmp_path):
    text = (rendered_secured / ("%s.service" % unit)).read_text()
    assert SECURED[(role, unit)] in text, text
    assert "basicAuth.password=" not in text and "Environment" not in text
    test_systemd_accepts_the_unit(rendered_secured, unit, tmp_path)
    assert_exposure(rendered_secured, unit)


def assert_exposure(rendered, role):
    proc = subprocess.run([shutil.which("systemd-analyze"), "security", "--offline=true", "--no-pager",
                           str(rendered / ("%s.service" % role))], capture_output=True, text=True, check=False)
    line = [x for x in proc.stdout.splitlines() if "Overall exposure level" in x]
    assert line, proc.stdout + proc.stderr
    score = float(line[0].split(":")[1].split()[0])
    print("%s: exposure %.1f (before %.1f)" % (role, score, BEFORE[role]))
    assert score <= BEFORE[role], "\n".join(proc.stdout.splitlines()[-40:])
