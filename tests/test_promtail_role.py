"""Unit tests of the promtail role without a host: what it renders and what its preflight refuses.

Same method as tests/test_loki_role.py: one ansible-playbook run on localhost renders the configuration with the
role's own template and variable files, and runs the role's real preflight task file for good and bad inputs.
"""
from __future__ import annotations

import json

import pytest
import yaml

from test_loki_role import CASE, FACTS, REPO, check_case, make_bundle, run_playbook
from test_loki_standin import PROMTAIL, load

ROLE = REPO / "roles" / "promtail"
promtail = load(PROMTAIL, "hpcobs_promtail_standin_role")

TARGET = {"job": "slurm", "paths": ["/var/log/slurm/*.log"]}
PREFLIGHT_CASES = {
    "good_defaults": ({}, None),
    "good_site": ({"promtail_file_targets": [TARGET, {"job": "nvidia", "paths": ["/var/log/nvidia*.log"],
                                                       "labels": {"component": "driver"}}],
                   "promtail_supplementary_groups": ["adm"],
                   "promtail_extra_scrape_configs": [{"job_name": "bmc-syslog",
                                                      "syslog": {"listen_address": "0.0.0.0:1514"}}]}, None),
    "no_loki": ({"promtail_loki_urls": []}, "needs the Loki base URL(s) to push to"),
    "loki_not_url": ({"promtail_loki_urls": ["mgmt01:3100"]}, "needs the Loki base URL(s) to push to"),
    "relative_path": ({"promtail_file_targets": [{"job": "x", "paths": ["var/log/x.log"]}]},
                      'job x: path "var/log/x.log" is not absolute'),
    "paths_string": ({"promtail_file_targets": [{"job": "x", "paths": "/var/log/x.log"}]},
                     "job x: paths must be a non-empty list"),
    "duplicate_job": ({"promtail_file_targets": [TARGET, TARGET]}, "job slurm is used twice"),
    "journal_job_name": ({"promtail_file_targets": [dict(TARGET, job="systemd-journal")]},
                         "job systemd-journal is used twice"),
    "unknown_target_key": ({"promtail_file_targets": [dict(TARGET, path="/x")]}, "job slurm: unknown key path"),
    "node_in_external": ({"promtail_external_labels": {"node": "x"}}, 'not "node"'),
    "journal_label_bad": ({"promtail_journal_labels": {"_SYSTEMD_UNIT": "unit"}}, "mapping of journal labels"),
    "journal_label_job": ({"promtail_journal_labels": {"__journal__comm": "job"}}, "other than node and job"),
    "missing_group": ({"promtail_supplementary_groups": ["systemd-journal", "hpcobs-no-such-group"]},
                      "the group(s) hpcobs-no-such-group of promtail_supplementary_groups do not exist"),
    "nothing_to_read": ({"promtail_journal_enabled": False, "promtail_file_targets": []}, "something must be read"),
    "positions_system": ({"promtail_positions_dir": "/var/lib"}, "absolute paths of their own"),
    "bad_port": ({"promtail_http_listen_port": 0}, "promtail_http_listen_port 1-65535"),
}

PLAYBOOK = """
- name: Render and check the promtail role
  hosts: gpu01
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
      ansible.builtin.template:
        src: {role}/templates/promtail.yml.j2
        dest: {out}/promtail.yml
        mode: "0644"
    - name: Render with the globals a site sets
      ansible.builtin.template:
        src: {role}/templates/promtail.yml.j2
        dest: {out}/promtail-site.yml
        mode: "0644"
      vars:
        hpcobs_loki_urls: [http://loki-a:3100/, https://loki-b.example.org]
        hpcobs_loki_tenant_id: hpc1
        hpcobs_log_external_labels: {{cluster: hpc1}}
        promtail_file_targets:
          - job: slurm
            paths: [/var/log/slurm/slurmd.log, /var/log/slurm/slurmctld.log]
            labels: {{component: slurm}}
        promtail_config_overrides: {{server: {{log_level: debug}}}}
"""


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("promtail-role")
    make_bundle(out / "bundle", "promtail")
    # the management host publishes another Loki port: the default URL follows it
    # a site that opts out of the security switch (on by default): plain pushes (the secured ones run in the logs
    # scenario and tests/test_promtail_standin.py)
    inventory = {"all": {"vars": {"hpcobs_security": False},
                         "children": {"management": {"hosts": {"mgmt01": {"loki_http_listen_port": 3200}}},
                                      "gpu_nodes": {"hosts": {"gpu01.cluster.example.org": {}}}}}}
    play = PLAYBOOK.replace("hosts: gpu01", "hosts: gpu01.cluster.example.org")
    play = play.format(role=ROLE, out=out, bundle=out / "bundle", facts=json.dumps(FACTS))
    for name, (values, _) in sorted(PREFLIGHT_CASES.items()):
        play += CASE.format(name=name, host=json.dumps("gpu01.cluster.example.org"), role=ROLE, out=out,
                            values=json.dumps(values))
    return out, run_playbook(out, play, inventory)


def test_config_passes_the_standin_check(rendered):
    for name in ("promtail.yml", "promtail-site.yml"):
        text = (rendered[0] / name).read_text()
        assert text.startswith("# Managed by hpcobs")
        assert promtail.check_config(yaml.safe_load(text)) == [], name


def test_default_config(rendered):
    config = yaml.safe_load((rendered[0] / "promtail.yml").read_text())
    assert config["clients"] == [{"url": "http://mgmt01:3200/loki/api/v1/push", "batchwait": "1s",
                                  "batchsize": 1048576, "external_labels": {"node": "gpu01"}}]
    assert config["positions"] == {"filename": "/var/lib/promtail/positions.yaml", "sync_period": "10s"}
    # Promtail always opens a gRPC server: port 0 is a random port, kept on loopback
    assert config["server"] == {"http_listen_address": "", "http_listen_port": 9080, "grpc_listen_address": "127.0.0.1",
                                "grpc_listen_port": 0, "log_level": "info"}
    journal, slurm = config["scrape_configs"]
    assert journal["job_name"] == "systemd-journal"
    assert journal["journal"] == {"json": False, "max_age": "12h", "labels": {"job": "systemd-journal"}}
    assert {r["source_labels"][0]: r["target_label"] for r in journal["relabel_configs"]} == {
        "__journal__transport": "transport", "__journal_syslog_identifier": "syslog_identifier",
        "__journal__systemd_unit": "unit", "__journal_priority_keyword": "priority", "__journal__hostname": "host"}
    assert slurm == {"job_name": "slurm", "static_configs": [
        {"targets": ["localhost"], "labels": {"job": "slurm", "__path__": "/var/log/slurm/*.log"}}]}


def test_globals_drive_urls_tenant_and_labels(rendered):
    config = yaml.safe_load((rendered[0] / "promtail-site.yml").read_text())
    assert [c["url"] for c in config["clients"]] == ["http://loki-a:3100/loki/api/v1/push",
                                                     "https://loki-b.example.org/loki/api/v1/push"]
    for client in config["clients"]:
        assert client["tenant_id"] == "hpc1"
        assert client["external_labels"] == {"cluster": "hpc1", "node": "gpu01"}
    slurm = config["scrape_configs"][1]
    assert [s["labels"]["__path__"] for s in slurm["static_configs"]] == ["/var/log/slurm/slurmd.log",
                                                                         "/var/log/slurm/slurmctld.log"]
    assert all(s["labels"]["component"] == "slurm" for s in slurm["static_configs"])
    assert config["server"]["log_level"] == "debug"


def test_relabelled_kernel_line_gets_the_contract_labels(rendered):
    # the rendered relabel rules applied by the stand-in's Prometheus-semantics relabelling to a kernel entry
    config = yaml.safe_load((rendered[0] / "promtail.yml").read_text())
    journal = config["scrape_configs"][0]
    entry = {"_TRANSPORT": "kernel", "SYSLOG_IDENTIFIER": "kernel", "PRIORITY": "3", "_HOSTNAME": "gpu01",
             "MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."}
    labels = promtail.relabel({**journal["journal"]["labels"], **promtail.journal_labels(entry)},
                              journal["relabel_configs"])
    assert promtail.public(labels) == {"job": "systemd-journal", "transport": "kernel", "syslog_identifier": "kernel",
                                       "priority": "error", "host": "gpu01"}


@pytest.mark.parametrize("case", sorted(PREFLIGHT_CASES))
def test_preflight(rendered, case):
    check_case(rendered[1][case], PREFLIGHT_CASES[case][1])


def test_argument_specs_match_defaults():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert set(specs) == set(defaults)
    for name, spec in specs.items():
        if "default" in spec:
            assert spec["default"] == defaults[name], name
        else:
            assert "{{" in str(defaults[name]), "%s has a plain default but no default in argument_specs" % name


def test_readme_lists_every_variable():
    readme = (ROLE / "README.md").read_text()
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    missing = [name for name in defaults if "`%s`" % name not in readme]
    assert not missing, missing
