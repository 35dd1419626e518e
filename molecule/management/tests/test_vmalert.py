"""vmalert as converged by the role on both management hosts."""
import pytest

from hostchecks import assert_runs_as_its_own_user, cmdline, unit_property
from mgmt import MANAGEMENT, VMALERT, VMALERT_AUTH, get_json, http
from polling import wait_for

testinfra_hosts = ["management"]

RULE_FILES = ["hpcobs-energy.yml", "hpcobs-fleet.yml", "hpcobs-gpu.yml", "hpcobs-monitoring.yml", "hpcobs-node.yml",
              "hpcobs-slurm.yml", "site-rules.yml"]


def test_service_runs_as_its_own_user(host):
    assert_runs_as_its_own_user(host, "vmalert", "vmalert")


@pytest.mark.parametrize("setting,expected", [
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "yes"),
    ("PrivateTmp", "yes"),
    ("CapabilityBoundingSet", ""),
])
def test_unit_is_hardened(host, setting, expected):
    assert unit_property(host, "vmalert", setting) == expected


def test_flags_point_at_victoriametrics_and_every_alertmanager(host):
    args = cmdline(host, "vmalert")
    name = host.check_output("hostname")
    assert "-rule=/etc/vmalert/rules/*.yml" in args
    # VictoriaMetrics over HTTPS (the site's security switch is on here), the CA and the credential from files
    for flag in ("-datasource", "-remoteWrite", "-remoteRead"):
        assert "%s.url=https://127.0.0.1:8428" % flag in args
        assert "%s.tlsCAFile=/etc/vmalert/tls/ca.crt" % flag in args
        assert "%s.basicAuth.username=hpcobs" % flag in args
        assert "%s.basicAuth.passwordFile=/etc/vmalert/tls/victoriametrics-client" % flag in args
    assert not [a for a in args if "basicAuth.password=" in a]
    # every Alertmanager over HTTPS too, each -notifier.url with the CA and the Alertmanager credential (array flags)
    assert sorted(a for a in args if a.startswith("-notifier.url=")) == [
        "-notifier.url=https://%s:9093" % mgmt for mgmt in MANAGEMENT]
    for flag in ("tlsCAFile=/etc/vmalert/tls/ca.crt", "basicAuth.username=hpcobs",
                 "basicAuth.passwordFile=/etc/vmalert/tls/alertmanager-client"):
        assert [a for a in args if a.startswith("-notifier.%s=" % flag.split("=")[0])] == [
            "-notifier." + flag] * len(MANAGEMENT)
    tls = {name: host.file("/etc/vmalert/tls/" + name) for name in ("alertmanager-client", "victoriametrics-client")}
    assert all((f.user, f.group, f.mode) == ("root", "vmalert", 0o640) for f in tls.values())
    assert "-external.url=https://%s:8880" % name in args
    # its own server: HTTPS with the host's certificate, basic auth whose password is read from its file
    for flag in ("-tls", "-tlsCertFile=/etc/vmalert/tls/server.crt", "-tlsKeyFile=/etc/vmalert/tls/server.key",
                 "-tlsMinVersion=TLS12", "-httpAuth.username=hpcobs",
                 "-httpAuth.password=file:///etc/vmalert/tls/vmalert-client"):
        assert flag in args
    own = {part: host.file("/etc/vmalert/tls/" + part) for part in ("vmalert-client", "server.key")}
    assert all((f.user, f.group, f.mode) == ("root", "vmalert", 0o640) for f in own.values())
    assert "-evaluationInterval=5s" in args


def test_rule_files_are_deployed_and_valid(host):
    found = sorted(host.check_output("ls /etc/vmalert/rules").split())
    assert found == RULE_FILES
    for name in RULE_FILES:
        rule_file = host.file("/etc/vmalert/rules/" + name)
        assert rule_file.user == "root" and rule_file.mode == 0o644
        assert host.run("/usr/local/bin/vmalert -dryRun -rule=/etc/vmalert/rules/%s" % name).rc == 0
    # the scenario's shortened timings reached the rendered rules
    gpu = host.file("/etc/vmalert/rules/hpcobs-gpu.yml").content_string
    assert "interval: 5s" in gpu
    assert "for: 15s" in gpu


def test_every_rule_is_loaded_and_evaluates_without_error(host):
    name = host.check_output("hostname")

    def evaluated():
        groups = get_json(name, VMALERT + "/api/v1/rules")["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        return groups if rules and all(rule.get("lastEvaluation", "").startswith("2") for rule in rules) else None
    groups = wait_for("every rule evaluated once", evaluated, timeout=60)
    names = {group["name"] for group in groups}
    assert {"hpcobs-gpu-owners", "hpcobs-gpu", "hpcobs-gpu-warnings", "hpcobs-gpu-links", "hpcobs-node",
            "hpcobs-energy", "hpcobs-monitoring", "hpcobs-fleet-health", "site-e2e"} <= names
    errors = [(group["name"], rule["name"], rule["lastError"]) for group in groups for rule in group["rules"]
              if rule["health"] != "ok"]
    assert errors == []


def test_health_and_reload_state(host):
    name = host.check_output("hostname")
    def metrics():
        status, text = http(name, VMALERT + "/metrics", **VMALERT_AUTH)
        return text if status == 200 else None
    assert "vmalert_config_last_reload_successful 1" in wait_for("vmalert metrics", metrics, 10).splitlines()
    assert get_json(name, VMALERT + "/api/v1/rules")["status"] == "success"
    assert http(name, VMALERT + "/health", ca=VMALERT_AUTH["ca"]) == (200, "OK")


def test_memory_footprint(host):
    pid = host.check_output("systemctl show -p MainPID --value vmalert")
    rss_kib = int(host.check_output("awk '/^VmRSS/ {print $2}' /proc/%s/status" % pid))
    print("vmalert VmRSS on %s: %d MiB" % (host.check_output("hostname"), rss_kib // 1024))
    assert rss_kib < 512 * 1024
