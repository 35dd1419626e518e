"""The shipped inventories and the site-wide preflight checks."""
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")


def inventory(path):
    out = subprocess.run(["ansible-inventory", "-i", path, "--list"], cwd=ROOT, env=ENV, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)


def hosts_of(data, group):
    found = set(data.get(group, {}).get("hosts", []))
    for child in data.get(group, {}).get("children", []):
        found |= hosts_of(data, child)
    return found


def test_example_inventory_is_a_500_host_site():
    data = inventory("inventories/example")
    gpu, ctl, mgmt = (hosts_of(data, g) for g in ("gpu_nodes", "slurm_controllers", "management"))
    assert len(gpu) == 496 and len(ctl) == 2 and len(mgmt) == 2
    assert len(data["_meta"]["hostvars"]) == 500
    assert not mgmt & gpu, "a management host must never be a GPU node"


def test_lab_inventory_matches_the_lab_containers():
    data = inventory("inventories/lab")
    assert hosts_of(data, "lab") == {"mgmt01", "slurmctl01", "gpu01", "gpu02"}
    assert hosts_of(data, "gpu_nodes") == {"gpu01", "gpu02"}
    for host, hostvars in data["_meta"]["hostvars"].items():
        assert hostvars["ansible_host"] == "hpcobs-lab-" + host


def run_preflight(tmp_path, inventory_text, *extra):
    inv = tmp_path / "hosts.yml"
    inv.write_text(inventory_text)
    cmd = ["ansible-playbook", "-i", str(inv), "playbooks/preflight.yml", "--check"] + list(extra)
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)


LOCAL = """
all:
  vars: {ansible_connection: local, ansible_python_interpreter: "{{ ansible_playbook_python }}"}
  children:
    management: {hosts: {obs01: {}}}
    gpu_nodes: {hosts: {obs01: {}, gpu01: {}}}
"""


def test_preflight_refuses_a_management_host_that_is_a_gpu_node(tmp_path):
    proc = run_preflight(tmp_path, LOCAL)
    assert proc.returncode != 0
    assert "obs01 is in both management and gpu_nodes" in proc.stdout
    assert "hpcobs_allow_management_on_gpu_nodes" in proc.stdout


def test_preflight_refuses_unknown_disabled_components(tmp_path):
    inv = LOCAL.replace("gpu_nodes: {hosts: {obs01: {}, gpu01: {}}}", "gpu_nodes: {hosts: {gpu01: {}}}")
    proc = run_preflight(tmp_path, inv, "-e", '{"hpcobs_components_disabled": ["grafana", "nagios"]}')
    assert proc.returncode != 0
    assert "unknown component(s) nagios" in proc.stdout


def test_example_group_vars_document_every_setting_of_every_role():
    """Every variable a role declares (meta/argument_specs.yml) appears in the example inventory's group_vars."""
    import glob
    import yaml
    check = subprocess.run(["python3", "scripts/gen-example-vars.py", "--check"], cwd=ROOT, capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stderr
    text = "".join(open(p, encoding="utf-8").read()
                   for p in glob.glob(os.path.join(ROOT, "inventories", "example", "group_vars", "*.yml")))
    roles = ["node_exporter", "dcgm_exporter", "ipmi_exporter", "smartctl_exporter", "promtail", "alloy", "slurm_hooks",
             "victoriametrics", "alertmanager", "vmalert", "loki", "grafana"]
    undocumented = []
    for role in roles:
        with open(os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml"), encoding="utf-8") as handle:
            specs = yaml.safe_load(handle)["argument_specs"]
        for entry in specs.values():
            for name in entry.get("options", {}):
                if not name.startswith("_") and "%s:" % name not in text:
                    undocumented.append(name)
    assert undocumented == [], "settings missing from inventories/example/group_vars: %s" % undocumented
