"""Grafana Alloy on the second GPU node (hpcobs_log_shipper: alloy), as converged by the alloy role (the binary is
the test bundle's stand-in): the same label contract as Promtail's, credentials kept out of sight."""
import re
import time
import uuid

import pytest

from helpers import bundle_binary_sha256, pki_file, query, shipper
from hostchecks import assert_runs_as_its_own_user, cmdline, main_pid, unit_property
from polling import wait_for

ALLOY_NODE = "logs-gpu02"
testinfra_hosts = [ALLOY_NODE]
CREDENTIAL = "/etc/alloy/tls/loki-push-%s" % ALLOY_NODE
# an older driver's line: no "PCI:" prefix before the bus address
XID_LINE = "NVRM: Xid (0000:b1:00): 62, pid='<unknown>', name=<unknown>, 0000b9b6"


def test_runs_as_its_own_user_with_read_groups_only(host):
    user = assert_runs_as_its_own_user(host, "alloy", "alloy")
    assert user.groups == ["alloy"]
    status = host.file("/proc/%s/status" % main_pid(host, "alloy")).content_string
    groups = next(line.split()[1:] for line in status.splitlines() if line.startswith("Groups:"))
    wanted = {host.group(name).gid for name in ("systemd-journal", "adm")}
    assert wanted <= {int(g) for g in groups} <= wanted | {host.group("alloy").gid}


def test_promtail_is_not_installed_here(host):
    assert not host.file("/etc/systemd/system/promtail.service").exists
    assert not host.file("/usr/local/bin/promtail").exists


@pytest.mark.parametrize("setting,expected", [
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "yes"),
    ("PrivateTmp", "yes"),
    ("CapabilityBoundingSet", ""),
    ("User", "alloy"),
    ("SupplementaryGroups", "systemd-journal adm"),
    ("ReadWritePaths", "/var/lib/alloy"),
])
def test_unit_is_hardened(host, setting, expected):
    assert unit_property(host, "alloy", setting) == expected


def test_binary_is_the_bundled_artifact(host):
    binary = host.file("/usr/local/bin/alloy")
    assert binary.user == "root" and binary.mode == 0o755
    assert binary.sha256sum == bundle_binary_sha256("alloy", "alloy")


def test_command_line(host):
    argv = cmdline(host, "alloy")
    assert "run" in argv and "/etc/alloy/config.alloy" in argv
    assert "--server.http.listen-addr=0.0.0.0:12345" in argv and "--storage.path=/var/lib/alloy" in argv
    assert "--disable-reporting" in argv


def test_config_carries_the_label_contract(host):
    path = "/etc/alloy/config.alloy"
    config = host.file(path)
    assert config.user == "root" and config.group == "alloy" and config.mode == 0o640
    text = config.content_string
    assert 'loki.source.journal "journal"' in text and '"job" = "systemd-journal"' in text
    assert 'url = "https://logs-mgmt01:3100/loki/api/v1/push"' in text
    assert '"node" = "logs-gpu02"' in text
    for field, label in [("__journal__transport", "transport"), ("__journal_syslog_identifier", "syslog_identifier"),
                         ("__journal__systemd_unit", "unit"), ("__journal_priority_keyword", "priority"),
                         ("__journal__hostname", "host")]:
        assert re.search(r'"%s",\s*\]\s*target_label = "%s"' % (field, label), text), field
    assert '"__path__" = "/var/log/slurm/*.log"' in text
    # hpcobs_security: the host's own push credential and the site CA
    assert re.search(r'basic_auth \{\s*username = "%s"\s*password_file = "%s"\s*\}' % (ALLOY_NODE, CREDENTIAL), text)
    assert re.search(r'tls_config \{\s*ca_file = "/etc/alloy/tls/ca.crt"\s*\}', text)
    # its own HTTP server: HTTPS, a client certificate of the site CA required
    assert re.search(r'http \{\s*tls \{\s*cert_file = "/etc/alloy/tls/server.crt"\s*key_file = "/etc/alloy/tls/server.key"'
                     r'\s*client_ca_file = "/etc/alloy/tls/ca.crt"\s*client_auth_type = "RequireAndVerifyClientCert"'
                     r'\s*min_version = "TLS12"\s*\}\s*\}', text), text
    # its own HTTP server: HTTPS, a client certificate of the site CA required
    assert re.search(r'http \{\s*tls \{\s*cert_file = "/etc/alloy/tls/server.crt"\s*key_file = "/etc/alloy/tls/server.key"'
                     r'\s*client_ca_file = "/etc/alloy/tls/ca.crt"\s*client_auth_type = "RequireAndVerifyClientCert"'
                     r'\s*min_version = "TLS12"\s*\}\s*\}', text), text
    result = host.run("/usr/local/bin/alloy validate %s" % path)
    assert result.rc == 0, result.stderr


def test_password_only_in_its_file(host):
    secret = host.file(CREDENTIAL)
    assert secret.user == "root" and secret.group == "alloy" and secret.mode == 0o640
    password = pki_file("credentials/loki-push-%s" % ALLOY_NODE)
    assert secret.content_string.strip() == password and len(password) >= 16
    assert not host.file("/etc/alloy/loki-password").exists
    assert password not in host.file("/etc/alloy/config.alloy").content_string
    assert password not in host.file("/etc/systemd/system/alloy.service").content_string
    assert password not in " ".join(cmdline(host, "alloy"))
    environ = host.file("/proc/%s/environ" % main_pid(host, "alloy")).content_string
    assert password not in environ
    assert password not in host.check_output("journalctl -u alloy --no-pager -n 500")


def test_ready_and_the_journal_is_read(host):
    assert shipper(host, "alloy", "/-/ready").strip() == "Alloy is ready."
    metrics = shipper(host, "alloy", "/metrics")
    lines = re.search(r"^loki_source_journal_target_lines_total\{[^}]*\} (\S+)$", metrics, re.M)
    assert lines and float(lines.group(1)) > 0


def test_kernel_line_and_slurm_line_reach_loki_with_the_contract_labels(host):
    since = time.time_ns() - 10 ** 9
    host.check_output("logger -t kernel -p kern.err %s" % repr(XID_LINE))
    streams = wait_for("the XID line from the Alloy node in Loki", lambda: query(
        host, '{syslog_identifier="kernel", node="%s"} |= "NVRM: Xid"' % ALLOY_NODE, since), 30)
    (stream,) = streams
    labels = stream["stream"]
    assert [value[1] for value in stream["values"]] == [XID_LINE]
    assert (labels["node"], labels["job"], labels["syslog_identifier"], labels["priority"], labels["transport"],
            labels["host"]) == (ALLOY_NODE, "systemd-journal", "kernel", "error", "syslog", ALLOY_NODE)
    assert not [name for name in labels if name.startswith("__")]
    marker = "slurmd job 77 on alloy %s" % uuid.uuid4().hex
    host.check_output("printf '%%s\\n' %s >> /var/log/slurm/slurmd.log" % repr(marker))
    (slurm,) = wait_for("the Slurm line from the Alloy node in Loki", lambda: query(
        host, '{job="slurm", node="%s"} |= "%s"' % (ALLOY_NODE, marker), since), 30)
    labels = slurm["stream"]
    assert (labels["job"], labels["node"], labels["filename"]) == ("slurm", ALLOY_NODE, "/var/log/slurm/slurmd.log")
    assert not set(labels) - {"job", "node", "filename", "service_name", "detected_level"}, labels
