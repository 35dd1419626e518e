"""VictoriaMetrics as converged by the role on both management hosts."""
import json

import pytest
import yaml

from hostchecks import assert_runs_as_its_own_user, cmdline
from mgmt import MANAGEMENT, REMOTE_WRITER, VM, VM_AUTH, get_json, http, query, scraper
from polling import wait_for

testinfra_hosts = ["management"]

SCRAPED_JOBS = {"node", "victoriametrics", "vmalert", "alertmanager"}


def test_service_runs_as_its_own_user(host):
    assert_runs_as_its_own_user(host, "victoriametrics", "victoriametrics")


@pytest.mark.parametrize("setting,expected", [
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "yes"),
    ("PrivateTmp", "yes"),
    ("CapabilityBoundingSet", ""),
    ("ReadWritePaths", "/var/lib/victoriametrics"),
    ("LimitNOFILE", "16384"),
])
def test_unit_is_hardened(host, setting, expected):
    assert host.check_output("systemctl show -p %s --value victoriametrics" % setting).strip() == expected


def test_storage_flags(host):
    args = cmdline(host, "victoriametrics")
    assert args[0] == "/usr/local/bin/victoria-metrics"
    assert "-storageDataPath=/var/lib/victoriametrics" in args
    assert "-retentionPeriod=400d" in args
    assert "-storage.minFreeDiskSpaceBytes=10GiB" in args
    if host.check_output("hostname") == REMOTE_WRITER:
        # vmagent scrapes there (test_vmagent.py): VictoriaMetrics only stores, nothing is scraped twice
        assert not [arg for arg in args if arg.startswith("-promscrape.")]
    else:
        assert "-promscrape.config=/etc/victoriametrics/scrape.yml" in args
        assert "-promscrape.fileSDCheckInterval=5s" in args


def test_security_flags_name_files_never_secrets(host):
    """TLS, basic auth and every admin endpoint's key, each secret read from a file (-flag=file://)."""
    args = cmdline(host, "victoriametrics")
    tls = "/etc/victoriametrics/tls"
    for flag in ("-tls", "-tlsCertFile=%s/server.crt" % tls, "-tlsKeyFile=%s/server.key" % tls,
                 "-tlsMinVersion=TLS12", "-httpAuth.username=hpcobs",
                 "-httpAuth.password=file://%s/victoriametrics-client" % tls):
        assert flag in args
    for name in ("deleteAuthKey", "snapshotAuthKey", "forceMergeAuthKey", "forceFlushAuthKey",
                 "search.resetCacheAuthKey", "pprofAuthKey", "flagsAuthKey", "configAuthKey", "reloadAuthKey",
                 "logNewSeriesAuthKey", "metricNamesStatsResetAuthKey"):
        assert "-%s=file://%s/victoriametrics-admin" % (name, tls) in args
    secrets = [host.file("%s/%s" % (tls, name)).content_string.strip()
               for name in ("victoriametrics-client", "victoriametrics-admin")]
    assert len(set(secrets)) == 2 and all(len(value) >= 32 for value in secrets)
    unit = host.file("/etc/systemd/system/victoriametrics.service").content_string
    for value in secrets:
        assert value not in " ".join(args) and value not in unit
        assert value not in host.check_output("systemctl show -p Environment --value victoriametrics")
    for name, mode in (("ca.crt", 0o644), ("server.crt", 0o644), ("server.key", 0o640),
                       ("victoriametrics-client", 0o640), ("victoriametrics-admin", 0o640)):
        info = host.file("%s/%s" % (tls, name))
        assert (info.user, info.group, info.mode) == ("root", "victoriametrics", mode), name
    assert host.file(tls).mode == 0o750


def test_data_dir_belongs_to_the_service(host):
    data = host.file("/var/lib/victoriametrics")
    assert data.is_directory and data.user == "victoriametrics" and data.mode == 0o750
    # VictoriaMetrics has created its storage layout in it
    assert host.file("/var/lib/victoriametrics/data").is_directory


def test_health(host):
    # /health answers without credentials (readiness probes), over HTTPS from the site CA only
    status, body = http(host.check_output("hostname"), VM + "/health", ca=VM_AUTH["ca"])
    assert (status, body) == (200, "OK")


def test_scrape_config_has_one_file_sd_per_enabled_job(host):
    config = host.file("/etc/victoriametrics/scrape.yml")
    # a scrape job's password may be in it: root and the service only
    assert (config.user, config.group, config.mode) == ("root", "victoriametrics", 0o640)
    jobs = {"alertmanager", "dcgm", "ipmi", "node", "smartctl", "victoriametrics", "vmalert"}
    content = config.content_string
    for job in jobs:
        assert "- job_name: %s\n" % job in content
        assert "/etc/victoriametrics/file_sd/%s.json" % job in content
    # disabled in this scenario: no job, no target file
    for job in ("loki", "grafana", "promtail"):
        assert "job_name: %s\n" % job not in content
        assert not host.file("/etc/victoriametrics/file_sd/%s.json" % job).exists
    assert "scrape_interval: 15s" in content
    # node_exporter serves HTTPS with basic auth under the switch (files/components.yml tls: true): its job trusts the
    # site CA and presents the credential node-exporter-client, from files only root and the service read
    jobs = {job["job_name"]: job for job in yaml.safe_load(content)["scrape_configs"]}
    tls = "/etc/victoriametrics/tls"
    assert jobs["node"]["scheme"] == "https"
    assert jobs["node"]["tls_config"] == {"ca_file": tls + "/ca.crt"}
    assert jobs["node"]["basic_auth"] == {"username": "hpcobs", "password_file": tls + "/node-exporter-client"}
    credential = host.file(tls + "/node-exporter-client")
    assert (credential.user, credential.group, credential.mode) == ("root", "victoriametrics", 0o640)
    assert credential.content_string.strip() not in content
    # the real binary accepts the file as deployed
    assert host.run("/usr/local/bin/victoria-metrics -promscrape.config=/etc/victoriametrics/scrape.yml "
                    "-promscrape.config.dryRun -loggerLevel=ERROR").rc == 0


def test_targets_come_from_the_inventory_with_short_node_names(host):
    node = json.loads(host.file("/etc/victoriametrics/file_sd/node.json").content_string)
    assert node == [{"targets": ["%s:9100" % name], "labels": {"node": name}} for name in MANAGEMENT]
    alertmanager = json.loads(host.file("/etc/victoriametrics/file_sd/alertmanager.json").content_string)
    assert [t["targets"] for t in alertmanager] == [["%s:9093" % name] for name in MANAGEMENT]
    # no host in gpu_nodes here: an empty list, ready for the first GPU node without touching scrape.yml
    assert json.loads(host.file("/etc/victoriametrics/file_sd/ipmi.json").content_string) == []
    # a host added by name (not in the inventory) gets the short name as `node`
    dcgm = json.loads(host.file("/etc/victoriametrics/file_sd/dcgm.json").content_string)
    assert {"targets": ["gpu-spare01.cluster.example:9400"], "labels": {"node": "gpu-spare01"}} in dcgm


def test_every_target_is_scraped_with_a_node_label(host):
    name = host.check_output("hostname")

    def all_up():
        targets = get_json(name, scraper(name) + "/api/v1/targets")["data"]["activeTargets"]
        seen = {(t["labels"]["job"], t["labels"].get("node"), t["health"]) for t in targets}
        wanted = {(job, mgmt, "up") for job in SCRAPED_JOBS for mgmt in MANAGEMENT}
        return wanted <= seen and all(t["labels"].get("node") for t in targets) and seen
    seen = wait_for("every management target up", all_up, timeout=90)
    # the spare GPU node does not exist: its target is there, and down
    assert ("dcgm", "gpu-spare01", "down") in seen
    # node_exporter is up over HTTPS (the switch is on in this scenario), by the name the certificate carries
    targets = get_json(name, scraper(name) + "/api/v1/targets")["data"]["activeTargets"]
    node = sorted(t["scrapeUrl"] for t in targets if t["labels"]["job"] == "node" and t["health"] == "up")
    assert node == ["https://%s:9100/metrics" % mgmt for mgmt in MANAGEMENT]
    for mgmt in MANAGEMENT:
        up = wait_for("up of node_exporter on %s" % mgmt,
                      lambda m=mgmt: query(name, 'up{job="node",node="%s"}' % m), 30)
        assert [value for _, value in up] == [1.0], up


def test_series_of_different_jobs_join_on_node(host):
    name = host.check_output("hostname")
    # node_exporter and vmalert series of the same host, joined on `node` only
    result = wait_for("a join on node", lambda: query(
        name, 'node_uname_info * on (node) group_left () max by (node) (vmalert_config_last_reload_successful)'), 60)
    assert {labels["node"] for labels, _ in result} == set(MANAGEMENT)


def test_memory_footprint(host):
    pid = host.check_output("systemctl show -p MainPID --value victoriametrics")
    rss_kib = int(host.check_output("awk '/^VmRSS/ {print $2}' /proc/%s/status" % pid))
    print("victoria-metrics VmRSS on %s: %d MiB" % (host.check_output("hostname"), rss_kib // 1024))
    assert rss_kib < 1024 * 1024
