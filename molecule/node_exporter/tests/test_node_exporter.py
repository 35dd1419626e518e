"""Verify node_exporter as converged by the role, on every test host."""
import re
import time

import pytest

from hostchecks import assert_runs_as_its_own_user, unit_property

METRICS = "http://127.0.0.1:9100/metrics"


def scrape(host):
    return host.check_output("python3 -c \"import urllib.request,sys;"
                             "sys.stdout.write(urllib.request.urlopen('%s', timeout=10).read().decode())\"" % METRICS)


def test_service_runs_as_its_own_unprivileged_user(host):
    assert_runs_as_its_own_user(host, "node_exporter", "node_exporter")


@pytest.mark.parametrize("setting,expected", [
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "read-only"),
    ("PrivateTmp", "yes"),
    ("CapabilityBoundingSet", ""),
    ("User", "node_exporter"),
])
def test_unit_is_hardened(host, setting, expected):
    assert unit_property(host, "node_exporter", setting) == expected


def test_binary_is_the_bundled_release(host):
    out = host.run("/usr/local/bin/node_exporter --version")
    assert out.rc == 0
    assert "version 1.11.1" in out.stdout + out.stderr
    binary = host.file("/usr/local/bin/node_exporter")
    assert binary.user == "root" and binary.mode == 0o755


def test_serves_node_metrics(host):
    body = scrape(host)
    assert re.search(r"^node_uname_info\{.*\} 1$", body, re.M)
    assert re.search(r"^node_load1 [0-9.e+-]+$", body, re.M)
    assert "node_exporter_build_info{" in body
    # the systemd collector is enabled by the role's defaults
    assert 'node_systemd_unit_state{name="node_exporter.service"' in body


def test_textfile_dir_permissions(host):
    directory = host.file("/var/lib/node_exporter/textfile")
    assert directory.is_directory
    assert directory.user == "root"
    assert directory.group == "node_exporter"
    assert directory.mode == 0o755


def test_site_textfile_metric_survived_every_run(host):
    # written by prepare.yml before the role's check, converge and idempotence runs
    assert host.file("/var/lib/node_exporter/textfile/site_inventory.prom").exists
    assert 'site_rack_position{rack="r12"} 7' in scrape(host)


def test_new_textfile_metric_is_exported(host):
    path = "/var/lib/node_exporter/textfile/verify_probe.prom"
    host.check_output("printf '# TYPE hpcobs_verify_probe gauge\\nhpcobs_verify_probe{probe=\"x\"} 42\\n' > %s.tmp"
                      " && mv %s.tmp %s" % (path, path, path))
    try:
        deadline = time.time() + 10
        while 'hpcobs_verify_probe{probe="x"} 42' not in scrape(host):
            assert time.time() < deadline, "textfile metric never showed up"
            time.sleep(0.5)
    finally:
        host.check_output("rm -f %s" % path)


def test_no_textfile_errors(host):
    assert re.search(r"^node_textfile_scrape_error 0$", scrape(host), re.M)
