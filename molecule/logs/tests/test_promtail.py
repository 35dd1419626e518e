"""Promtail on the GPU node, as converged by the promtail role (the binary is the test bundle's stand-in)."""
import re

import pytest

from helpers import LOKI, NODE, bundle_binary_sha256, read_yaml, shipper
from hostchecks import assert_runs_as_its_own_user, main_pid, unit_property

testinfra_hosts = [NODE]


def test_runs_as_its_own_user_with_read_groups_only(host):
    user = assert_runs_as_its_own_user(host, "promtail", "promtail")
    # read access comes from the unit, the account itself is in no extra group
    assert user.groups == ["promtail"]
    pid = main_pid(host, "promtail")
    status = host.file("/proc/%s/status" % pid).content_string
    groups = next(line.split()[1:] for line in status.splitlines() if line.startswith("Groups:"))
    wanted = {host.group(name).gid for name in ("systemd-journal", "adm")}
    assert wanted <= {int(g) for g in groups} <= wanted | {host.group("promtail").gid}


@pytest.mark.parametrize("setting,expected", [
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "yes"),
    ("PrivateTmp", "yes"),
    ("PrivateDevices", "yes"),
    ("CapabilityBoundingSet", ""),
    ("User", "promtail"),
    ("SupplementaryGroups", "systemd-journal adm"),
    ("ReadWritePaths", "/var/lib/promtail"),
])
def test_unit_is_hardened(host, setting, expected):
    assert unit_property(host, "promtail", setting) == expected


def test_binary_is_the_bundled_artifact(host):
    binary = host.file("/usr/local/bin/promtail")
    assert binary.user == "root" and binary.mode == 0o755
    assert binary.sha256sum == bundle_binary_sha256("promtail", "promtail")


def test_config_key_fields(host):
    path = "/etc/promtail/promtail.yml"
    assert host.file(path).group == "promtail" and host.file(path).mode == 0o640
    config = read_yaml(host, path)
    (client,) = config["clients"]
    assert client["url"] == LOKI + "/loki/api/v1/push"
    # hpcobs_security: the host's own push credential and the site CA, from files only
    assert client["basic_auth"] == {"username": NODE, "password_file": "/etc/promtail/tls/loki-push-%s" % NODE}
    assert client["tls_config"] == {"ca_file": "/etc/promtail/tls/ca.crt"}
    assert client["external_labels"] == {"node": NODE}
    assert config["positions"]["filename"] == "/var/lib/promtail/positions.yaml"
    assert config["server"]["http_listen_port"] == 9080
    # hpcobs_security: its own server over HTTPS, a client certificate of the site CA required
    assert config["server"]["http_tls_config"] == {
        "cert_file": "/etc/promtail/tls/server.crt", "key_file": "/etc/promtail/tls/server.key",
        "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": "/etc/promtail/tls/ca.crt"}
    assert config["server"]["tls_min_version"] == "VersionTLS12"
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"systemd-journal", "slurm"}
    journal = jobs["systemd-journal"]
    assert journal["journal"]["labels"] == {"job": "systemd-journal"}
    assert journal["journal"]["max_age"] == "12h"
    relabel = {tuple(r["source_labels"]): r["target_label"] for r in journal["relabel_configs"]}
    assert relabel == {
        ("__journal__transport",): "transport",
        ("__journal_syslog_identifier",): "syslog_identifier",
        ("__journal__systemd_unit",): "unit",
        ("__journal_priority_keyword",): "priority",
        ("__journal__hostname",): "host",
    }
    (static,) = jobs["slurm"]["static_configs"]
    assert static["labels"] == {"job": "slurm", "__path__": "/var/log/slurm/*.log"}


def test_installed_binary_accepts_the_deployed_config(host):
    result = host.run("/usr/local/bin/promtail -config.file=/etc/promtail/promtail.yml -check-syntax")
    assert result.rc == 0, result.stderr


def test_positions_dir(host):
    directory = host.file("/var/lib/promtail")
    assert directory.is_directory and directory.user == "promtail" and directory.mode == 0o750


def test_ready_and_metrics(host):
    assert shipper(host, "promtail", "/ready").strip() == "Ready"
    assert host.socket("tcp://0.0.0.0:9080").is_listening
    metrics = shipper(host, "promtail", "/metrics")
    assert 'promtail_sent_entries_total{host="%s:3100"}' % LOKI.split("//")[1].split(":")[0] in metrics
    # the journal is read, not only "ready" (the counter the role's readiness check waits for)
    lines = re.search(r"^promtail_journal_target_lines_total (\S+)$", metrics, re.M)
    assert lines and float(lines.group(1)) > 0


def test_grpc_listens_on_loopback_only(host):
    """Promtail always opens a gRPC server (grpc_listen_port 0: a random port); it must not be on the network."""
    pid = main_pid(host, "promtail")
    listening = host.check_output("ss -Hltnp")
    ours = [line.split()[3] for line in listening.splitlines() if "pid=%s," % pid in line]
    assert "0.0.0.0:9080" in ours or "*:9080" in ours, ours
    others = [address for address in ours if not address.endswith(":9080")]
    assert others and all(address.startswith("127.0.0.1:") for address in others), ours
    config = read_yaml(host, "/etc/promtail/promtail.yml")
    assert (config["server"]["grpc_listen_address"], config["server"]["grpc_listen_port"]) == ("127.0.0.1", 0)
