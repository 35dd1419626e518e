"""Verify node_exporter as converged by the role, on every test host."""
import hashlib
import json
import os
import re
import subprocess
import time

import pytest

from hostchecks import assert_runs_as_its_own_user, unit_property
from nodeexp import SECURED, is_secured, scrape

SCENARIO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT = os.path.dirname(os.path.dirname(SCENARIO))
UNIT = "/etc/systemd/system/node_exporter.service"


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
    # the systemd collector is enabled by the role's defaults, for the listed units only
    assert 'node_systemd_unit_state{name="node_exporter.service"' in body
    units = set(re.findall(r'^node_systemd_unit_state\{name="([^"]+)"', body, re.M))
    assert "systemd-journald.service" not in units and all(not u.endswith(".socket") for u in units), units
    # the cardinality defaults: no per-CPU collector nothing reads, no exporter self-metrics
    for family in ("node_cpu_guest_seconds_total", "node_softnet_", "node_schedstat_", "node_cpu_scaling_",
                   "go_goroutines", "process_start_time_seconds", "promhttp_"):
        assert not re.search(r"^%s" % family, body, re.M), family


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


def playbook(host, play, extra):
    """Run a playbook of the project against this test host only, with extra vars; (rc, output)."""
    inventory = os.environ.get("MOLECULE_INVENTORY_FILE")
    assert inventory and os.path.exists(inventory), "run through molecule verify (MOLECULE_INVENTORY_FILE)"
    env = dict(os.environ, ANSIBLE_ROLES_PATH=os.path.join(PROJECT, "roles"),
               ANSIBLE_FILTER_PLUGINS=os.path.join(PROJECT, "playbooks", "filter_plugins"))
    env.setdefault("ANSIBLE_CONFIG", os.path.join(PROJECT, "ansible.cfg"))
    result = subprocess.run(["ansible-playbook", "-i", inventory, play, "--limit", host.backend.name,
                             "-e", json.dumps(extra)], capture_output=True, text=True, timeout=600, check=False,
                            env=env, cwd=PROJECT)
    return result.returncode, result.stdout + result.stderr


def unit_state(host):
    """sha256 and mtime of the unit file, and the unit systemd has loaded."""
    return (hashlib.sha256(host.file(UNIT).content).hexdigest(), host.file(UNIT).mtime,
            host.check_output("systemctl cat node_exporter.service"))


def test_control_character_in_extra_args_is_refused_before_anything_changes(host):
    """A line feed in an extra argument would end ExecStart= and add `User=root` to the unit: the role's run (not
    check mode) fails in its first task, naming the setting and the position, and the unit stays byte-identical."""
    before = unit_state(host)
    rc, output = playbook(host, os.path.join(SCENARIO, "converge.yml"),
                          {"node_exporter_extra_args": ["--collector.x\nUser=root"]})
    assert rc != 0, output[-3000:]
    assert "node_exporter_extra_args[0] has a control character, line feed (U+000A), at position 14" in output
    assert "Nothing was changed" in output
    assert re.search(r"changed=0 .*failed=1", output), output[-2000:]
    assert unit_state(host) == before
    assert "User=root" not in host.file(UNIT).content_string


def test_site_preflight_refuses_a_control_character_in_grafana_ini(host):
    """playbooks/preflight.yml checks every free-text setting of every role on every host before any role runs."""
    rc, output = playbook(host, os.path.join(PROJECT, "playbooks", "preflight.yml"),
                          {"grafana_ini": {"server": {"domain": "grafana.example\nadmin_password = x"}}})
    assert rc != 0, output[-3000:]
    # the callback shows the message as JSON: its quotes may be escaped
    assert re.search(r'grafana_ini\[\\?"server\\?"\]\[\\?"domain\\?"\] has a control character, line feed '
                     r'\(U\+000A\), at position 16', output), output[-3000:]
    assert "Verify the bundle" not in output  # stopped in the first play, before the bundle or any host is touched


PROBE_BANNER = "TASK [service : Wait until the service answers /metrics]"
START_BANNER = "TASK [service : Enable and start node_exporter.service]"


def test_rerun_probes_a_service_only_when_it_started_it(named_host):
    """A rerun on the converged host does not ask the untouched service again; with hpcobs_ready_check_every_run it
    does, and a service systemd still sees active but that no longer answers (SIGSTOP) fails the run, naming it. The
    failure is remembered on the controller: the next plain rerun asks again (and fails while the service still does
    not answer), the first that sees it answer forgets it, and the one after that does not ask (nor runs the task
    that enables and starts the unit: the unit task found it active and enabled). A service found stopped is started
    and probed; one found disabled is enabled. On the secured host: the probe asks over HTTPS with the credential."""
    host = named_host(SECURED)  # the secured host only: the probe there asks as a client must
    assert is_secured(host), SECURED
    converge = os.path.join(SCENARIO, "converge.yml")
    # the controller's memory of the failed probe (hpcobs_ready_state_dir: molecule.yml), <host>/<unit>_<path>
    marker = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "not-ready", SECURED,
                          "node_exporter.service_metrics")
    short = {"node_exporter_ready_timeout": 4, "service_ready_request_timeout": 2}
    rc, output = playbook(host, converge, {})
    assert rc == 0 and re.search(r"changed=0 .*failed=0", output), output[-3000:]
    assert PROBE_BANNER not in output, "a no-op rerun probed node_exporter"
    assert not os.path.exists(marker)

    host.check_output("systemctl kill -s SIGSTOP node_exporter.service")
    try:
        assert host.service("node_exporter").is_running
        rc, output = playbook(host, converge, dict(short, hpcobs_ready_check_every_run=True))
        assert rc != 0, output[-3000:]
        assert PROBE_BANNER in output
        assert "node_exporter on %s was not ready within 4 s" % SECURED in output, output[-3000:]
        assert os.path.isfile(marker), "the failed probe was not remembered"
        # a plain rerun, nothing (re)started: the remembered failure makes it ask again, and it still fails
        rc, output = playbook(host, converge, short)
        assert rc != 0 and PROBE_BANNER in output, output[-3000:]
        assert "node_exporter on %s was not ready within 4 s" % SECURED in output, output[-3000:]
    finally:
        host.check_output("systemctl kill -s SIGCONT node_exporter.service")
    rc, output = playbook(host, converge, {})
    assert rc == 0 and re.search(r"changed=0 .*failed=0", output), output[-3000:]
    assert PROBE_BANNER in output, "the rerun after a failed probe did not ask again"
    assert not os.path.exists(marker), "a successful probe left the failure remembered"
    rc, output = playbook(host, converge, {})
    assert rc == 0 and PROBE_BANNER not in output, output[-3000:]
    # the unit task found it active and enabled: no module run to enable and start it
    assert START_BANNER not in output, output[-3000:]  # skipped tasks are not shown (display_skipped_hosts)

    host.check_output("systemctl stop node_exporter.service")
    rc, output = playbook(host, converge, {})
    assert rc == 0 and re.search(r"changed=1 .*failed=0", output), output[-3000:]
    assert START_BANNER in output and PROBE_BANNER in output, "node_exporter was started but not probed"
    assert host.service("node_exporter").is_running
    scrape(host)

    # running but no longer enabled (it would not come back after a reboot): the rerun enables it
    host.check_output("systemctl disable node_exporter.service")
    rc, output = playbook(host, converge, {})
    assert rc == 0 and re.search(r"changed=1 .*failed=0", output), output[-3000:]
    assert host.service("node_exporter").is_enabled and host.service("node_exporter").is_running
