"""Unit tests of the loki role without a host: what it renders and what its preflight refuses.

One ansible-playbook run on localhost (connection local) renders the configuration and the rule file with the role's
own variable files and expressions, and runs the role's real preflight task file against a set of good and bad
inputs (facts of a Debian 12 systemd host are set, the bundle is a tiny one made here). Every case's outcome is
written to a JSON file the tests read.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from test_loki_standin import LOKI, load

REPO = Path(__file__).resolve().parents[1]
ROLE = REPO / "roles" / "loki"
loki = load(LOKI, "hpcobs_loki_standin_role")
logql = load(ROLE / "filter_plugins" / "hpcobs_logql.py", "hpcobs_logql_role")
# the XID regexp of the shipped rules (RE2 syntax; Python's re reads it alike)
XID_REGEXP = r"NVRM: Xid \((?:PCI:)?(?P<pci>[^)]+)\):\s*(?P<xid>\d+)"

FACTS = {"os_family": "Debian", "service_mgr": "systemd", "distribution": "Debian", "distribution_version": "12.8",
         "distribution_major_version": "12", "architecture": "x86_64"}
OOM_EXPR = 'sum by (node) (count_over_time({transport="kernel"} |= "Out of memory" [5m])) > 0'
GOOD_GROUPS = [{"name": "site", "rules": [{"alert": "SiteOomKiller", "expr": OOM_EXPR,
                                            "labels": {"severity": "warning", "audience": "ops"},
                                            "annotations": {"summary": "s", "description": "d", "runbook": "r"}}]}]
# case name -> variables; "good*" cases must pass, every other one must fail with the given text in the message
PREFLIGHT_CASES = {
    "good_defaults": ({}, None),
    "good_site_rules": ({"loki_rule_groups": GOOD_GROUPS, "loki_retention_period": "90d",
                         "loki_alertmanager_urls": ["https://am1.example.org:9093", "http://10.0.0.2:9093/prefix"]},
                        None),
    "retention_short": ({"loki_retention_period": "12h"}, "whole number of days of at least 24h"),
    "retention_hours": ({"loki_retention_period": "30h"}, "whole number of days of at least 24h"),
    "data_dir_system": ({"loki_data_dir": "/var/lib"}, "not a system directory"),
    "data_dir_relative": ({"loki_data_dir": "loki-data"}, "must be absolute paths"),
    "same_ports": ({"loki_grpc_listen_port": 3100}, "two different ports"),
    "tenant_without_auth": ({"loki_rules_tenant": "site"}, '"fake" while loki_auth_enabled is false'),
    "am_not_url": ({"loki_alertmanager_urls": ["mgmt01:9093"]}, "list of http(s) base URLs"),
    "am_string": ({"loki_alertmanager_urls": "http://mgmt01:9093"}, "list of http(s) base URLs"),
    # a secured Alertmanager (hpcobs_security) refuses plain HTTP: the ruler must reach it at https://
    # (Loki's own front stays off here: its vmauth is not in this test's bundle)
    "good_am_secured": ({"loki_alertmanager_security": True, "loki_security": False,
                         "loki_alertmanager_urls": ["https://mgmt01:9093"]}, None),
    "am_http_secured": ({"loki_alertmanager_security": True, "loki_security": False,
                         "loki_alertmanager_urls": ["https://a:9093", "http://mgmt01:9093"]},
                        "all https:// with hpcobs_security on"),
    "schema_unsorted": ({"loki_schema_configs": [{"from": "2026-01-01"}, {"from": "2025-01-01"}]},
                        "increasing date order"),
    "bad_severity": ({"loki_rule_groups": [{"name": "g", "rules": [dict(GOOD_GROUPS[0]["rules"][0],
                                                                        labels={"severity": "page", "audience": "ops"})]}]},
                     "g/SiteOomKiller: severity must be critical, warning or info"),
    "missing_runbook": ({"loki_rule_groups": [{"name": "g", "rules": [dict(GOOD_GROUPS[0]["rules"][0],
                                                                           annotations={"summary": "s",
                                                                                        "description": "d"})]}]},
                        "g/SiteOomKiller: annotation runbook missing"),
    "promql_expr": ({"loki_rule_groups": [{"name": "g", "rules": [dict(GOOD_GROUPS[0]["rules"][0], expr="up == 0")]}]},
                    "g/SiteOomKiller: expr is not valid LogQL"),
    # a log query loads in Loki but never fires ("rule result is not a vector or scalar")
    "log_query_alert": ({"loki_rule_groups": [{"name": "g", "rules": [dict(GOOD_GROUPS[0]["rules"][0],
                                                                           expr='{unit="kernel"} |= "Out of memory"')]}]},
                        "g/SiteOomKiller: expr is a log query"),
    # one expression Loki cannot parse makes its ruler load no group at all: refused, whatever else is there
    "syntax_error_beside_good": ({"loki_rule_groups": GOOD_GROUPS + [{"name": "broken", "rules": [dict(
        GOOD_GROUPS[0]["rules"][0], expr=OOM_EXPR.replace(" [5m]))", " [5m])"))]}]},
        "broken/SiteOomKiller: expr is not valid LogQL (parse error at line 1, col"),
    "duplicate_group": ({"loki_rule_groups": GOOD_GROUPS + GOOD_GROUPS}, "group site: name used twice"),
    "gpu_node": ({"_case_host_in_gpu_nodes": True}, "is in the group gpu_nodes"),
    "gpu_node_allowed": ({"_case_host_in_gpu_nodes": True, "loki_allow_on_gpu_node": True}, None),
}

PLAYBOOK = """
- name: Render and check the loki role
  hosts: mgmt01:both01
  connection: local
  gather_facts: false
  vars_files:
    - {role}/defaults/main.yml
    - {role}/vars/main.yml
  vars:
    ansible_python_interpreter: "{{{{ ansible_playbook_python }}}}"
    artifact_bundle_dir: {bundle}
    artifact_cache_dir: {out}/cache
  tasks:
    - name: Pretend to be a Debian 12 systemd host
      hpcobs_test_facts:
        facts: {facts}
    - name: Render the configuration as the role writes it
      ansible.builtin.copy:
        dest: {out}/loki.yml
        content: "{{{{ _loki_config | combine(loki_config_overrides, recursive=True) | to_nice_yaml(indent=2, width=1000) }}}}"
      when: inventory_hostname == 'mgmt01'
    - name: Render the rule file as the role writes it
      ansible.builtin.copy:
        dest: {out}/rules.yml
        content: "{{{{ {{'groups': loki_rule_groups}} | to_nice_yaml(indent=2, width=1000) }}}}"
      when: inventory_hostname == 'mgmt01'
    - name: Render with site settings
      ansible.builtin.copy:
        dest: {out}/loki-site.yml
        content: "{{{{ _loki_config | combine(loki_config_overrides, recursive=True) | to_nice_yaml(indent=2, width=1000) }}}}"
      vars:
        loki_auth_enabled: true
        loki_alertmanager_urls: [http://am1:9093, http://am2:9093]
        loki_retention_period: 90d
        loki_config_overrides: {{query_range: {{max_retries: 3}}, limits_config: {{ingestion_rate_mb: 50}}}}
      when: inventory_hostname == 'mgmt01'
"""

# One block per case: the role's preflight with the case's variables, its outcome appended to results.jsonl.
CASE = """
    - name: Case {name}
      when: inventory_hostname == {host}
      block:
        - name: Preflight of case {name}
          ansible.builtin.include_tasks: {role}/tasks/preflight.yml
          vars: {values}
        - name: Record a pass
          ansible.builtin.lineinfile:
            path: {out}/results.jsonl
            line: "{{{{ {{'case': '{name}', 'ok': true}} | to_json }}}}"
            create: true
            mode: "0644"
      rescue:
        - name: Record the failure
          ansible.builtin.lineinfile:
            path: {out}/results.jsonl
            line: "{{{{ {{'case': '{name}', 'ok': false, 'msg': ansible_failed_result.msg | default('')}} | to_json }}}}"
            create: true
            mode: "0644"
"""


# A module that returns the facts it is given (set_fact does not fill ansible_facts).
FACTS_MODULE = """#!/usr/bin/python
from ansible.module_utils.basic import AnsibleModule
module = AnsibleModule(argument_spec={"facts": {"type": "dict", "required": True}}, supports_check_mode=True)
module.exit_json(changed=False, ansible_facts=module.params["facts"])
"""


def make_bundle(directory: Path, component: str = "loki") -> None:
    """A bundle holding one amd64 archive of component, enough for roles/artifact's verify step."""
    directory.mkdir()
    inner = "%s-linux-amd64" % component
    archive = directory / "artifacts" / component / "0" / (inner + ".zip")
    archive.parent.mkdir(parents=True)
    with zipfile.ZipFile(archive, "w") as handle:
        handle.writestr(inner, "#!/bin/sh\n")
    manifest = {"format": 1, "created": "test", "components": {component: {"version": "0", "files": {"amd64": {
        "path": str(archive.relative_to(directory)), "sha256": hashlib.sha256(archive.read_bytes()).hexdigest(),
        "archive_root": "", "binaries": {component: inner}, "install_tree": False}}}}}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    # signed by a key made here; run_playbook trusts it (<out>/signing/allowed_signers)
    tool = str(REPO / "scripts" / "bundle-tool.py")
    key = directory.parent / "signing" / "key"
    line = subprocess.run([sys.executable, tool, "keygen", str(key)], check=True, capture_output=True, text=True)
    (key.parent / "allowed_signers").write_text(line.stdout)
    subprocess.run([sys.executable, tool, "seal", str(directory), "--key", str(key)], check=True, capture_output=True)


def run_playbook(out: Path, play: str, inventory: dict) -> dict:
    """Run play (text) against inventory on localhost; return the case outcomes of results.jsonl by name."""
    (out / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (out / "play.yml").write_text(play)
    (out / "library").mkdir()
    (out / "library" / "hpcobs_test_facts.py").write_text(FACTS_MODULE)
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(REPO / "roles"), ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_FILTER_PLUGINS=os.pathsep.join([str(ROLE / "filter_plugins"),
                                                       str(REPO / "playbooks" / "filter_plugins")]),
               ANSIBLE_LIBRARY=str(out / "library"), ANSIBLE_NOCOLOR="1",
               HPCOBS_BUNDLE_ALLOWED_SIGNERS=str(out / "signing" / "allowed_signers"))
    run = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(out / "hosts.yml"),
                          str(out / "play.yml")], capture_output=True, text=True, env=env, cwd=REPO)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    results = {}
    for line in (out / "results.jsonl").read_text().splitlines():
        item = json.loads(line)
        results[item["case"]] = item
    return results


def check_case(result, expected):
    if expected is None:
        assert result["ok"], result.get("msg")
    else:
        assert not result["ok"], "preflight accepted the case"
        assert expected in " ".join(result["msg"].split()), result["msg"]
        assert "Nothing was changed." in result["msg"]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("loki-role")
    make_bundle(out / "bundle")
    # the gpu_node cases run on both01, a host of both management and gpu_nodes
    # a site that opts out of the security switch (on by default): Loki without its front (vmauth is not in this
    # test's bundle; the front runs in the logs scenario and tests/test_loki_front.py)
    inventory = {"all": {"vars": {"hpcobs_security": False},
                         "children": {"management": {"hosts": {"mgmt01": {}, "both01": {}}},
                                      "gpu_nodes": {"hosts": {"gpu01": {}, "both01": {}}}}}}
    play = PLAYBOOK.format(role=ROLE, out=out, bundle=out / "bundle", facts=json.dumps(FACTS))
    for name, (values, _) in sorted(PREFLIGHT_CASES.items()):
        values = dict(values)
        host = "both01" if values.pop("_case_host_in_gpu_nodes", False) else "mgmt01"
        play += CASE.format(name=name, host=json.dumps(host), role=ROLE, out=out, values=json.dumps(values))
    return out, run_playbook(out, play, inventory)


def test_config_passes_the_standin_check(rendered):
    out, _ = rendered
    assert loki.check_rule_file(yaml.safe_load((out / "rules.yml").read_text()))[1] == []
    assert loki.verify_config(yaml.safe_load((out / "loki.yml").read_text())) == []
    assert loki.verify_config(yaml.safe_load((out / "loki-site.yml").read_text())) == []


def test_default_config(rendered):
    config = yaml.safe_load((rendered[0] / "loki.yml").read_text())
    assert config["auth_enabled"] is False
    assert config["server"] == {"http_listen_address": "", "http_listen_port": 3100, "grpc_listen_address": "127.0.0.1",
                                "grpc_listen_port": 9095, "log_level": "info"}
    assert config["compactor"]["retention_enabled"] is True
    assert config["compactor"]["delete_request_store"] == "filesystem"
    assert config["limits_config"]["retention_period"] == "744h"
    assert isinstance(config["limits_config"]["ingestion_rate_mb"], int)
    # every management host of the inventory (both01 is one too in this test)
    assert config["ruler"]["alertmanager_url"] == "http://both01:9093,http://mgmt01:9093"
    assert config["ruler"]["storage"]["local"]["directory"] == "/etc/loki/rules"
    assert config["analytics"] == {"reporting_enabled": False}
    for path in (config["common"]["path_prefix"], config["ruler"]["rule_path"], config["ruler"]["wal"]["dir"],
                 config["ingester"]["wal"]["dir"], config["compactor"]["working_directory"]):
        assert path.startswith("/var/lib/loki"), path


def test_site_settings_and_overrides(rendered):
    config = yaml.safe_load((rendered[0] / "loki-site.yml").read_text())
    assert config["auth_enabled"] is True
    assert config["ruler"]["alertmanager_url"] == "http://am1:9093,http://am2:9093"
    assert config["limits_config"]["retention_period"] == "90d"
    assert config["limits_config"]["ingestion_rate_mb"] == 50
    assert config["limits_config"]["max_global_streams_per_user"] == 100000  # merged, not replaced
    assert config["query_range"] == {"max_retries": 3}


def test_xid_rules_follow_the_contract(rendered):
    groups = yaml.safe_load((rendered[0] / "rules.yml").read_text())["groups"]
    assert loki.check_rule_file({"groups": groups})[1] == []
    assert logql.rule_problems(groups) == []
    (group,) = groups
    critical, warning = group["rules"]
    assert critical["alert"] == "HpcobsGpuXidKernelLogCritical"
    assert critical["labels"] == {"severity": "critical", "audience": "oncall"}
    assert warning["alert"] == "HpcobsGpuXidKernelLog"
    assert warning["labels"] == {"severity": "warning", "audience": "ops"}
    for rule in (critical, warning):
        assert set(rule["annotations"]) == {"summary", "description", "runbook"}
        # Loki's own templates survive Ansible's templating
        assert "{{ $labels.xid }}" in rule["annotations"]["summary"]
        assert rule["expr"].startswith('sum by (node, pci, xid) (count_over_time({transport="kernel"} '
                                       '|= "NVRM: Xid" | regexp `' + XID_REGEXP + '`')
        assert rule["expr"].endswith("[5m])) > 0")
        assert "\n" not in rule["expr"]
    assert '| xid =~ "48|63|64|74|79|94|95"' in critical["expr"]
    assert '| xid !~ "48|63|64|74|79|94|95"' in warning["expr"]


@pytest.mark.parametrize("line,pci,xid", [
    ("kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", "0000:3b:00", "79"),
    ("NVRM: Xid (PCI:0000:b1:00): 62, pid='<unknown>', name=<unknown>, 0000b9b6", "0000:b1:00", "62"),
    # older drivers (and some distributions' builds) leave out the "PCI:" prefix
    ("NVRM: Xid (0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", "0000:3b:00", "79"),
    ("NVRM: Xid (PCI:0009:01:00):48, pid=77, name=python, Ch 00000008", "0009:01:00", "48"),
])
def test_the_xid_regexp_extracts_code_and_pci(line, pci, xid):
    # the LogQL regexp of the rules, in Python's dialect (named groups (?P<...>) are the same in RE2)
    import re
    match = re.search(XID_REGEXP, line)
    assert match and match.group("pci") == pci and match.group("xid") == xid


def test_the_rendered_xid_rules_carry_the_regexp(rendered):
    for rule in yaml.safe_load((rendered[0] / "rules.yml").read_text())["groups"][0]["rules"]:
        assert "| regexp `%s`" % XID_REGEXP in rule["expr"]


def test_a_broken_site_rule_beside_the_xid_group_is_refused(rendered):
    groups = yaml.safe_load((rendered[0] / "rules.yml").read_text())["groups"]
    broken = {"name": "site", "rules": [dict(GOOD_GROUPS[0]["rules"][0], expr='sum(count_over_time({a="b"} [5m])')]}
    (problem,) = logql.rule_problems(groups + [broken])
    assert problem.startswith("site/SiteOomKiller: expr is not valid LogQL (parse error")
    assert logql.rule_problems(groups + GOOD_GROUPS) == []


@pytest.mark.parametrize("case", sorted(PREFLIGHT_CASES))
def test_preflight(rendered, case):
    check_case(rendered[1][case], PREFLIGHT_CASES[case][1])


class DefaultsLoader(yaml.SafeLoader):
    """Reads defaults/main.yml, whose Loki templates are tagged !unsafe for Ansible."""


DefaultsLoader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


def read_defaults():
    return yaml.load((ROLE / "defaults" / "main.yml").read_text(), Loader=DefaultsLoader)


def test_argument_specs_match_defaults():
    defaults = read_defaults()
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert set(specs) == set(defaults)
    for name, spec in specs.items():
        if "default" in spec:
            assert spec["default"] == defaults[name], name
        else:
            assert "{{" in str(defaults[name]), "%s has a plain default but no default in argument_specs" % name


def test_readme_lists_every_variable():
    readme = (ROLE / "README.md").read_text()
    defaults = read_defaults()
    missing = [name for name in defaults if "`%s`" % name not in readme]
    assert not missing, missing
