"""The alertmanager role's configuration and unit, rendered by the role's own templates and checked by amtool.

Rendered on localhost for two sites of an inventory: a cluster of three management hosts with receivers, secrets
in files, a team map and a site route (group_vars/management.yml, as a site would write them), and a single host
with the role's defaults. The role's defaults are the inventory's group_vars/all, so inventory settings override
them as they would override role defaults. Checks: `amtool check-config`, routing with `amtool config routes
test`, cluster flags of the unit.

Tools: HPCOBS_TOOLS_BIN (a directory) if set, else <repo>/.cache/tools/bin, else PATH. A missing tool fails.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tooling import PROJECT_FILTERS, SERVICE_ROLE, service_unit_vars, tool

REPO = Path(__file__).resolve().parents[1]
ROLE = REPO / "roles" / "alertmanager"
SECRET_VALUES = {"pager": "https://pager.example/hook?token=unit-test-token-1", "smtp": "unit-test-smtp-password-2"}

SITE = {
    "alertmanager_global": {"smtp_smarthost": "mail.example:587", "smtp_from": "gpu@example",
                            "smtp_auth_username": "gpu",
                            "smtp_auth_password_file": "{{ alertmanager_secrets_dir }}/smtp"},
    "alertmanager_secrets": SECRET_VALUES,
    "alertmanager_receivers": [
        {"name": "oncall", "webhook_configs": [{"url_file": "{{ alertmanager_secrets_dir }}/pager"}]},
        {"name": "ops", "email_configs": [{"to": "hpc-admins@example"}]},
        {"name": "physics-team", "email_configs": [{"to": "physics@example"}]},
        {"name": "chem-team", "email_configs": [{"to": "chem@example"}]},
        {"name": "research", "email_configs": [{"to": "research-computing@example"}]},
        {"name": "maintenance"},
    ],
    "alertmanager_team_receivers": {"physics": "physics-team", "astro": "physics-team", "chemistry": "chem-team",
                                    "bio \"lab\"": "chem-team"},
    "alertmanager_team_fallback_receiver": "research",
    "alertmanager_routes_extra": [{"matchers": ['maintenance="true"'], "receiver": "maintenance"}],
}

# A site that opts out of the security switch (on by default): the plain mode's flags (the secured unit, gossip TLS
# and web configuration included, runs in the management scenario).
INVENTORY = {"all": {"vars": {"hpcobs_security": False}, "children": {
    # _alertmanager_cluster_ip: what preflight resolves on the host (getent ahosts, kept if one of its own addresses)
    "management": {"hosts": {"mgmt01.example": {"_alertmanager_cluster_ip": "10.0.0.1"},
                             "mgmt02.example": {"alertmanager_listen_address": "[fd00::2]:9093",
                                                "_alertmanager_cluster_ip": "fd00::2"},
                             "mgmt03.example": {"hpcobs_address": "10.0.0.3"}}},
    "small_site": {"hosts": {"solo01.example": {"alertmanager_cluster_hosts": ["solo01.example"]}}},
}}}

ROUTES = [
    ("alertname=HpcobsGpuEccUncorrectable severity=critical audience=oncall node=gpu01 gpu=0 account=physics",
     "oncall"),
    # a fault killing a job pages on-call and tells the job's team; no job, or an account without a team: on-call
    ("alertname=HpcobsGpuXidCritical severity=critical audience=oncall node=gpu01 gpu=1 hpc_job=7 account=chemistry",
     "oncall,chem-team"),
    ("alertname=HpcobsGpuXidCritical severity=critical audience=oncall node=gpu01 gpu=1 hpc_job=8 account=geology",
     "oncall"),
    ("alertname=HpcobsGpuXidCritical severity=critical audience=oncall node=gpu01 gpu=1", "oncall"),
    ("alertname=HpcobsGpuHungJob audience=team account=physics hpc_job=1", "physics-team"),
    ("alertname=HpcobsGpuHungJob audience=team account=astro hpc_job=2", "physics-team"),
    ("alertname=HpcobsGpuHungJob audience=team account=chemistry hpc_job=3", "chem-team"),
    ("alertname=HpcobsGpuHungJob audience=team 'account=\"bio \\\"lab\\\"\"' hpc_job=4", "chem-team"),
    ("alertname=HpcobsAccountEnergyBudgetExceeded audience=team account=geology", "research"),
    ("alertname=HpcobsTargetDown audience=ops node=gpu01", "ops"),
    ("alertname=HpcobsGpuEccUncorrectable audience=oncall maintenance=true", "maintenance"),
    ("alertname=Unlabelled", "ops"),
]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    work = tmp_path_factory.mktemp("alertmanager")
    inventory = work / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text(yaml.safe_dump(INVENTORY))
    shutil.copy(ROLE / "defaults" / "main.yml", inventory / "group_vars" / "all.yml")
    (inventory / "group_vars" / "management.yml").write_text(yaml.safe_dump(SITE))
    out = work / "out"
    playbook = [{
        "name": "Render the alertmanager configuration and unit",
        "hosts": "mgmt01.example,mgmt02.example,solo01.example",
        "connection": "local",
        "gather_facts": False,
        "vars_files": [str(ROLE / "vars" / "main.yml")],
        "vars": dict(service_unit_vars(ROLE), ansible_python_interpreter="{{ ansible_playbook_python }}",
                     ansible_facts={"os_family": "Debian"}),
        "tasks": [
            {"name": "Directory", "ansible.builtin.file": {"path": str(out) + "/{{ inventory_hostname }}",
                                                           "state": "directory", "mode": "0755"}},
            {"name": "Files", "ansible.builtin.template": {
                "src": "{{ item.src }}", "dest": str(out) + "/{{ inventory_hostname }}/{{ item.dest }}", "mode": "0644"},
             "loop": [{"src": str(ROLE / "templates" / "alertmanager.yml.j2"), "dest": "alertmanager.yml"},
                      {"src": str(SERVICE_ROLE / "templates" / "service.service.j2"), "dest": "alertmanager.service"}]},
            {"name": "The address preflight resolves for gossip", "ansible.builtin.copy": {
                "content": "{{ _alertmanager_cluster_name }}\n", "mode": "0644",
                "dest": str(out) + "/{{ inventory_hostname }}/cluster-name"}},
        ],
    }]
    (work / "render.yml").write_text(yaml.safe_dump(playbook))
    beside = Path(sys.executable).parent / "ansible-playbook"
    command = [str(beside) if beside.exists() else "ansible-playbook", "-i", str(inventory), str(work / "render.yml")]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FILTER_PLUGINS=str(PROJECT_FILTERS))
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


@pytest.mark.parametrize("host", ["mgmt01.example", "solo01.example"])
def test_amtool_accepts_the_configuration(rendered, host):
    result = subprocess.run([str(tool("amtool")), "check-config", str(rendered / host / "alertmanager.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("labels,receiver", ROUTES)
def test_routing(rendered, labels, receiver):
    result = subprocess.run("%s config routes test --config.file=%s %s" % (
        tool("amtool"), rendered / "mgmt01.example" / "alertmanager.yml", labels), shell=True, capture_output=True,
        text=True, timeout=60)
    assert result.stdout.strip() == receiver, result.stdout + result.stderr


def test_secrets_are_referenced_never_written(rendered):
    config = (rendered / "mgmt01.example" / "alertmanager.yml").read_text()
    for value in SECRET_VALUES.values():
        assert value not in config
    parsed = yaml.safe_load(config)
    assert parsed["global"]["smtp_auth_password_file"] == "/etc/alertmanager/secrets/smtp"
    assert parsed["receivers"][0]["webhook_configs"][0]["url_file"] == "/etc/alertmanager/secrets/pager"


def test_one_bad_gpu_is_one_oncall_notification_and_team_alerts_go_per_job(rendered):
    routes = yaml.safe_load((rendered / "mgmt01.example" / "alertmanager.yml").read_text())["route"]["routes"]
    assert routes[0]["receiver"] == "maintenance"
    oncall = next(r for r in routes if r["matchers"] == ['audience="oncall"'])
    team = next(r for r in routes if r["matchers"] == ['audience="team"'])
    assert oncall["group_by"] == ["alertname", "node", "gpu"]
    assert team["group_by"] == ["alertname", "account", "hpc_job"]
    # the same fault also reaches the job's team, grouped per job: one notification each
    assert oncall["continue"] is True
    told = [r for r in routes if r["matchers"][:2] == ['audience="oncall"', 'hpc_job!=""']]
    assert {r["receiver"] for r in told} == {"physics-team", "chem-team"} and len(told) == 4
    assert all(r["group_by"] == ["alertname", "account", "hpc_job"] and "continue" not in r for r in told)


def test_a_cluster_host_peers_with_every_other_host(rendered):
    unit = (rendered / "mgmt01.example" / "alertmanager.service").read_text()
    assert "--cluster.peer=mgmt02.example:9094" in unit
    assert "--cluster.peer=10.0.0.3:9094" in unit
    assert "--cluster.peer=mgmt01.example" not in unit
    # gossip on the host's own address, advertised as such: never every address
    assert "--cluster.listen-address=10.0.0.1:9094" in unit and "0.0.0.0" not in unit
    assert "--cluster.advertise-address=10.0.0.1:9094" in unit
    # the name preflight resolves on the host: its inventory address, or the host of its listen address
    assert (rendered / "mgmt01.example" / "cluster-name").read_text() == "mgmt01.example\n"
    assert (rendered / "mgmt02.example" / "cluster-name").read_text() == "fd00::2\n"
    unit2 = (rendered / "mgmt02.example" / "alertmanager.service").read_text()
    assert "--cluster.listen-address=[fd00::2]:9094" in unit2 and "--cluster.advertise-address=[fd00::2]:9094" in unit2
    assert "--web.external-url=http://mgmt01.example:9093" in unit
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit


def test_a_single_host_runs_without_clustering(rendered):
    unit = (rendered / "solo01.example" / "alertmanager.service").read_text()
    assert "--cluster.peer" not in unit
    # empty: upstream's "Set to empty string to disable HA mode"; nothing listens on the cluster port
    assert "--cluster.listen-address=\n" in unit and "--cluster.advertise-address" not in unit
    assert (rendered / "solo01.example" / "alertmanager.yml").exists()
    config = yaml.safe_load((rendered / "solo01.example" / "alertmanager.yml").read_text())
    assert [r["name"] for r in config["receivers"]] == ["oncall", "ops"]
    assert config["route"]["receiver"] == "ops"


def test_argument_specs_match_the_defaults():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    options = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert sorted(options) == sorted(defaults)
    for name, spec in options.items():
        assert spec["default"] == defaults[name], name
        assert spec.get("description"), name
    assert options["alertmanager_secrets"].get("no_log") is True
