"""Loki on the management host, as converged by the loki role (the binary is the test bundle's stand-in)."""
import os
import subprocess

import pytest
import yaml

from helpers import LOKI_LOCAL, MGMT, REPO, bundle_binary_sha256, http, http_json, read_yaml, reader
from hostchecks import assert_runs_as_its_own_user, unit_property

testinfra_hosts = [MGMT]


def test_service_runs_as_its_own_unprivileged_user(host):
    assert_runs_as_its_own_user(host, "loki", "loki")


@pytest.mark.parametrize("setting,expected", [
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "yes"),
    ("PrivateTmp", "yes"),
    ("PrivateDevices", "yes"),
    ("CapabilityBoundingSet", ""),
    ("User", "loki"),
    ("ReadWritePaths", "/var/lib/loki"),
    ("WorkingDirectory", "/var/lib/loki"),
    ("LimitNOFILE", "16384"),
])
def test_unit_is_hardened(host, setting, expected):
    assert unit_property(host, "loki", setting) == expected


def test_unit_passes_config_and_target(host):
    exec_start = unit_property(host, "loki", "ExecStart")
    assert "/usr/local/bin/loki" in exec_start
    assert "-config.file=/etc/loki/loki.yml" in exec_start
    assert "-target=all" in exec_start


def test_binary_is_the_bundled_artifact(host):
    binary = host.file("/usr/local/bin/loki")
    assert binary.user == "root" and binary.mode == 0o755
    assert binary.sha256sum == bundle_binary_sha256("loki", "loki")


def test_config_file_permissions(host):
    config = host.file("/etc/loki/loki.yml")
    assert config.user == "root" and config.group == "loki" and config.mode == 0o640
    assert host.file("/etc/loki").mode == 0o750


def test_config_key_fields(host):
    config = read_yaml(host, "/etc/loki/loki.yml")
    assert config["auth_enabled"] is False
    # hpcobs_security: Loki on loopback, its front (vmauth) on the public port
    assert (config["server"]["http_listen_address"], config["server"]["http_listen_port"]) == ("127.0.0.1", 3101)
    assert config["server"]["grpc_listen_address"] == "127.0.0.1"
    assert config["common"]["path_prefix"] == "/var/lib/loki"
    assert config["common"]["storage"]["filesystem"]["chunks_directory"] == "/var/lib/loki/chunks"
    assert config["common"]["ring"]["kvstore"]["store"] == "inmemory"
    (schema,) = config["schema_config"]["configs"]
    assert (schema["store"], schema["schema"], schema["object_store"]) == ("tsdb", "v13", "filesystem")
    assert schema["from"] == "2025-01-01"
    assert config["compactor"]["retention_enabled"] is True
    assert config["compactor"]["delete_request_store"] == "filesystem"
    assert config["compactor"]["working_directory"].startswith("/var/lib/loki/")
    assert config["limits_config"]["retention_period"] == "744h"
    assert config["limits_config"]["max_global_streams_per_user"] == 100000
    ruler = config["ruler"]
    assert ruler["storage"] == {"type": "local", "local": {"directory": "/etc/loki/rules"}}
    assert ruler["rule_path"].startswith("/var/lib/loki/")
    assert ruler["wal"]["dir"].startswith("/var/lib/loki/")
    # default: port 9093 of every host of the inventory group management, over https (the switch is on in this
    # scenario and Alertmanager is secured)
    assert ruler["alertmanager_url"] == "https://%s:9093" % MGMT
    assert ruler["enable_api"] is True
    assert config["analytics"]["reporting_enabled"] is False


def test_installed_binary_accepts_the_deployed_config(host):
    result = host.run("/usr/local/bin/loki -config.file=/etc/loki/loki.yml -verify-config")
    assert result.rc == 0, result.stderr


def test_rule_file_follows_the_alert_contract(host):
    path = "/etc/loki/rules/fake/hpcobs.yml"
    assert host.file(path).group == "loki" and host.file(path).mode == 0o640
    (group,) = read_yaml(host, path)["groups"]
    assert group["name"] == "hpcobs-kernel-log"
    rules = {rule["alert"]: rule for rule in group["rules"]}
    assert set(rules) == {"HpcobsGpuXidKernelLogCritical", "HpcobsGpuXidKernelLog"}
    assert rules["HpcobsGpuXidKernelLogCritical"]["labels"] == {"severity": "critical", "audience": "oncall"}
    assert rules["HpcobsGpuXidKernelLog"]["labels"] == {"severity": "warning", "audience": "ops"}
    for rule in rules.values():
        assert set(rule["annotations"]) == {"summary", "description", "runbook"}
        assert '{transport="kernel"} |= "NVRM: Xid"' in rule["expr"]
        assert rule["expr"].startswith("sum by (node, pci, xid) (count_over_time(")
        assert "{{ $labels.node }}" in rule["annotations"]["summary"]
    assert '| xid =~ "48|63|64|74|79|94|95"' in rules["HpcobsGpuXidKernelLogCritical"]["expr"]
    assert '| xid !~ "48|63|64|74|79|94|95"' in rules["HpcobsGpuXidKernelLog"]["expr"]


def test_ruler_loaded_the_rules(host):
    groups = http_json(host, LOKI_LOCAL + "/prometheus/api/v1/rules")["data"]["groups"]
    loaded = {(g["name"], g["file"]): [r["name"] for r in g["rules"]] for g in groups}
    assert loaded == {("hpcobs-kernel-log", "hpcobs.yml"): ["HpcobsGpuXidKernelLogCritical",
                                                             "HpcobsGpuXidKernelLog"]}
    alert = groups[0]["rules"][0]
    assert alert["type"] == "alerting" and alert["labels"]["severity"] == "critical"


def test_ready_and_listening(host):
    assert http(host, LOKI_LOCAL + "/ready").strip() == "ready"
    assert host.socket("tcp://127.0.0.1:3101").is_listening
    assert not host.socket("tcp://0.0.0.0:3101").is_listening
    # the front (vmauth, Go's ":3100": every address, IPv4 and IPv6 on one socket, which ss shows as *:3100)
    listeners = host.check_output("ss -Htln 'sport = :3100'").split()
    assert "*:3100" in listeners or "0.0.0.0:3100" in listeners or "[::]:3100" in listeners, listeners
    # the scrape job loki's way in: through the front, as the reader
    assert "loki_build_info" in reader("/metrics")


def test_data_dir_kept_what_was_there(host):
    data = host.file("/var/lib/loki")
    assert data.is_directory and data.user == "loki" and data.group == "loki" and data.mode == 0o750
    # written by prepare.yml before the check, converge and idempotence runs
    assert host.file("/var/lib/loki/site-restore-marker").content_string == "restored from backup before hpcobs ran\n"


class _Unsafe(yaml.SafeDumper):
    """Dumps every string as !unsafe, so that Ansible leaves Loki's own {{ $labels }} templates alone."""


_Unsafe.add_representer(str, lambda dumper, value: dumper.represent_scalar("!unsafe", value))


def test_a_broken_site_rule_changes_nothing_and_the_xid_group_stays(host, tmp_path):
    """A site group whose expression Loki cannot parse would make the real ruler load no group at all: the role
    refuses it in preflight, before anything changes, and the XID group keeps being evaluated."""
    inventory = os.environ.get("MOLECULE_INVENTORY_FILE")
    assert inventory and os.path.exists(inventory), "run through molecule verify (MOLECULE_INVENTORY_FILE)"
    rules_file = "/etc/loki/rules/fake/hpcobs.yml"
    before = host.file(rules_file).sha256sum
    groups = read_yaml(host, rules_file)["groups"]
    broken = {"name": "site-oom", "rules": [{
        "alert": "SiteOomKiller",
        "expr": 'sum by (node) (count_over_time({transport="kernel"} |= "Out of memory" [5m]) > 0',
        "labels": {"severity": "warning", "audience": "ops"},
        "annotations": {"summary": "OOM on {{ $labels.node }}", "description": "d", "runbook": "r"}}]}
    extra = tmp_path / "site-rules.yml"
    extra.write_text(yaml.dump({"loki_rule_groups": groups + [broken]}, Dumper=_Unsafe))
    project = str(REPO)
    env = dict(os.environ, ANSIBLE_ROLES_PATH=os.path.join(project, "roles"))
    env.setdefault("ANSIBLE_CONFIG", os.path.join(project, "ansible.cfg"))
    result = subprocess.run(["ansible-playbook", "-i", inventory, str(REPO / "molecule" / "logs" / "converge.yml"),
                             "--limit", MGMT, "-e", "@%s" % extra], capture_output=True, text=True, timeout=600,
                            check=False, env=env, cwd=project)
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0, output[-3000:]
    assert "loki_rule_groups is refused" in output, output[-3000:]
    assert "site-oom/SiteOomKiller: expr is not valid LogQL (parse error at line 1" in output
    assert "Nothing was changed." in output
    assert host.file(rules_file).sha256sum == before
    names = [g["name"] for g in http_json(host, LOKI_LOCAL + "/prometheus/api/v1/rules")["data"]["groups"]]
    assert names == ["hpcobs-kernel-log"]
