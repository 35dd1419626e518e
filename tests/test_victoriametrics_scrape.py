"""The victoriametrics role's scrape configuration for a 500-node site, rendered by the role's own templates.

The role's templates (file_sd.json.j2, scrape.yml.j2) are rendered on localhost with the role's defaults and
internal variables, for an inventory of 500 GPU nodes, a Slurm controller and two management hosts. The generated
scrape.yml is checked by the real `victoria-metrics -promscrape.config.dryRun`.

Tools: HPCOBS_TOOLS_BIN (a directory) if set, else <repo>/.cache/tools/bin, else PATH. A missing tool fails.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tooling import render_scrape_config, tool

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "playbooks" / "filter_plugins"))
import hpcobs_service  # noqa: E402
ROLE = REPO / "roles" / "victoriametrics"
GPU_NODES = ["gpu%03d.cluster.example" % i for i in range(1, 501)]

INVENTORY = {"all": {"children": {
    "gpu_nodes": {"hosts": {"gpu[001:500].cluster.example": None}},
    "slurm_controllers": {"hosts": {
        "slurmctl01.cluster.example": {"hpcobs_address": "fd00::5"},
        # hpcobs_slurm_native_metrics auto (the default): what slurm_metrics recorded on the host in an earlier run,
        # overridden by what it decided in this run; true scrapes before slurm_metrics ran; false never does.
        # ... behind MetricsAuthUsers: VictoriaMetrics presents the Slurm JWT of that user to every slurmctld job
        "slurmctl02.cluster.example": {"ansible_local": {"hpcobs_slurm_metrics": {"native": True,
                                                                                  "token_user": "hpcobs-metrics"}}},
        "slurmctl03.cluster.example": {"ansible_local": {"hpcobs_slurm_metrics": {"native": True}},
                                       "slurm_metrics_native_active": False},
        "slurmctl04.cluster.example": {"hpcobs_slurm_native_metrics": True},
        "slurmctl05.cluster.example": {"hpcobs_slurm_native_metrics": False, "slurm_metrics_native_active": True,
                                       "ansible_local": {"hpcobs_slurm_metrics": {"native": True}}},
    }},
    "management": {"hosts": {"mgmt01.cluster.example": None, "mgmt02.cluster.example": {"hpcobs_address": "10.1.2.3"}}},
}}}

OVERRIDES = {
    "ipmi": {"enabled": False},
    "dcgm": {"hosts": ["gpu-spare01.cluster.example"]},
    "grafana": {"scheme": "https", "config": {"tls_config": {"insecure_skip_verify": False}}},
    "sitejob": {"port": 8080, "groups": ["slurm_controllers"], "scrape_interval": "1m", "metrics_path": "/x/metrics"},
    "nothere": {"port": 1234, "groups": ["no_such_group"]},
}


def render(tmp_path_factory, extra=None):
    return render_scrape_config(tmp_path_factory.mktemp("victoriametrics"), INVENTORY,
                                {"victoriametrics_scrape_jobs_overrides": OVERRIDES,
                                 "hpcobs_components_disabled": ["promtail"], **(extra or {})})


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """A site that opts out of the security switch (on by default): plain HTTP, no credentials."""
    return render(tmp_path_factory, {"hpcobs_security": False})


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """The same site with the security switch on (grafana's job keeps its own scheme) and a field more that keeps
    the Slurm job label."""
    return render(tmp_path_factory, {"hpcobs_security": True,
                                     "victoriametrics_dcgm_job_fields_extra": ["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]})


def targets(rendered: Path, job: str) -> list[dict]:
    return json.loads((rendered / "file_sd" / ("%s.json" % job)).read_text())


def test_one_target_file_per_enabled_job(rendered):
    names = sorted(p.stem for p in (rendered / "file_sd").glob("*.json"))
    assert names == sorted(["node", "dcgm", "smartctl", "victoriametrics", "vmalert", "alertmanager", "loki",
                            "grafana", "slurm", "sitejob", "nothere", "slurmctld_nodes", "slurmctld_jobs",
                            "slurmctld_partitions", "slurmctld_scheduler", "slurmctld_accounts"])


def test_slurmctld_jobs_scrape_only_the_controllers_serving_native_metrics(rendered):
    for job, path in [("slurmctld_nodes", "/metrics/nodes"), ("slurmctld_jobs", "/metrics/jobs"),
                      ("slurmctld_partitions", "/metrics/partitions"), ("slurmctld_scheduler", "/metrics/scheduler"),
                      ("slurmctld_accounts", "/metrics/jobs-users-accts")]:
        assert targets(rendered, job) == [
            {"targets": ["slurmctl02.cluster.example:6817"], "labels": {"node": "slurmctl02"}},
            {"targets": ["slurmctl04.cluster.example:6817"], "labels": {"node": "slurmctl04"}}], job
        scrape = {j["job_name"]: j for j in yaml.safe_load((rendered / "scrape.yml").read_text())["scrape_configs"]}
        assert scrape[job]["metrics_path"] == path
        assert scrape[job]["scrape_interval"] == "60s" and scrape[job]["honor_labels"] is True
        assert scrape[job]["authorization"] == {"type": "Bearer",
                                                "credentials_file": str(rendered / "slurmctld.token")}
    # the collector stays on every controller (all slurm_* series, or only its hpcobs_slurm_* ones), without a token
    assert len(targets(rendered, "slurm")) == 5
    assert "authorization" not in scrape["slurm"]


def test_every_target_carries_its_short_host_name(rendered):
    node = targets(rendered, "node")
    assert len(node) == 500 + 5 + 2
    for entry in node:
        assert len(entry["targets"]) == 1 and set(entry["labels"]) == {"node"}
    assert node[0] == {"targets": ["gpu001.cluster.example:9100"], "labels": {"node": "gpu001"}}
    assert [e["labels"]["node"] for e in node[:500]] == [h.split(".")[0] for h in GPU_NODES]
    by_node = {e["labels"]["node"]: e["targets"][0] for e in node}
    # hpcobs_address wins over the inventory name; an IPv6 address is bracketed
    assert by_node["slurmctl01"] == "[fd00::5]:9100"
    assert by_node["mgmt02"] == "10.1.2.3:9100"
    assert by_node["mgmt01"] == "mgmt01.cluster.example:9100"


def test_gpu_jobs_cover_the_gpu_nodes_plus_extra_hosts(rendered):
    dcgm = targets(rendered, "dcgm")
    assert [e["targets"][0] for e in dcgm] == ["%s:9400" % h for h in GPU_NODES] + ["gpu-spare01.cluster.example:9400"]
    assert dcgm[-1]["labels"] == {"node": "gpu-spare01"}
    assert len(targets(rendered, "smartctl")) == 500
    # 500 nodes stay one small file per job
    assert (rendered / "file_sd" / "dcgm.json").stat().st_size < 64 * 1024


def test_management_jobs_and_empty_groups(rendered):
    assert [e["targets"][0] for e in targets(rendered, "victoriametrics")] == [
        "mgmt01.cluster.example:8428", "10.1.2.3:8428"]
    assert [e["targets"][0] for e in targets(rendered, "alertmanager")] == [
        "mgmt01.cluster.example:9093", "10.1.2.3:9093"]
    assert targets(rendered, "nothere") == []


def test_scrape_config_points_at_the_target_files(rendered):
    config = yaml.safe_load((rendered / "scrape.yml").read_text())
    assert config["global"] == {"scrape_interval": "15s", "scrape_timeout": "10s"}
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert "ipmi" not in jobs
    # a component the site does not deploy is not scraped; a site's own job (no component) always is
    assert "promtail" not in jobs and "sitejob" in jobs
    for name, job in jobs.items():
        assert job["file_sd_configs"] == [{"files": [str(rendered / "file_sd" / ("%s.json" % name))]}]
        assert "static_configs" not in job
    assert jobs["sitejob"]["scrape_interval"] == "1m" and jobs["sitejob"]["metrics_path"] == "/x/metrics"
    assert jobs["grafana"]["scheme"] == "https"
    assert jobs["grafana"]["tls_config"] == {"insecure_skip_verify": False}


def test_scrape_config_passes_victoria_metrics_dry_run(rendered):
    result = subprocess.run([str(tool("victoria-metrics")), "-promscrape.config=%s" % (rendered / "scrape.yml"),
                             "-promscrape.config.dryRun", "-loggerLevel=ERROR"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr


def test_gpu_node_jobs_drop_at_scrape_time_what_nothing_reads(rendered):
    """The node, ipmi and smartctl jobs carry the role's metric_relabel_configs (the real binary's dry run above
    accepts them); the dcgm job keeps every field of its counters CSV, with the Slurm job label only on the shared
    gpu_job_fields and the site's extra ones (tests/test_job_label_relabel.py: what the real binary stores)."""
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["victoriametrics_scrape_jobs"]
    scrape = {j["job_name"]: j for j in yaml.safe_load((rendered / "scrape.yml").read_text())["scrape_configs"]}
    for job in ("node", "smartctl"):
        assert scrape[job]["metric_relabel_configs"] == defaults[job]["config"]["metric_relabel_configs"], job
        assert all(rule["action"] == "drop" for rule in scrape[job]["metric_relabel_configs"])
    fields = hpcobs_service.shared_fact("gpu_job_fields")
    assert scrape["dcgm"]["metric_relabel_configs"] == hpcobs_service.job_label_relabel(fields)
    assert not any(rule.get("action") == "drop" for rule in scrape["dcgm"]["metric_relabel_configs"])


def test_the_dcgm_job_is_scraped_at_the_gpu_sample_interval(rendered, tmp_path_factory):
    """dcgm-exporter collects at the shared GPU sample interval (30s, the dcgm_exporter role's collect interval):
    scraped faster, each value would be stored twice. The global sets both."""
    scrape = {j["job_name"]: j for j in yaml.safe_load((rendered / "scrape.yml").read_text())["scrape_configs"]}
    assert hpcobs_service.shared_fact("gpu_sample_interval") == "30s"
    assert scrape["dcgm"]["scrape_interval"] == "30s"
    assert "scrape_interval" not in scrape["node"]  # the global 15s
    site = render(tmp_path_factory, {"hpcobs_gpu_sample_interval": "1m"})
    scrape = {j["job_name"]: j for j in yaml.safe_load((site / "scrape.yml").read_text())["scrape_configs"]}
    assert scrape["dcgm"]["scrape_interval"] == "1m"


def test_a_site_adds_fields_that_keep_the_job_label(secured):
    scrape = {j["job_name"]: j for j in yaml.safe_load((secured / "scrape.yml").read_text())["scrape_configs"]}
    fields = hpcobs_service.shared_fact("gpu_job_fields") + ["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]
    assert scrape["dcgm"]["metric_relabel_configs"] == hpcobs_service.job_label_relabel(fields)
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in scrape["dcgm"]["metric_relabel_configs"][0]["regex"].split("|")


def test_argument_specs_match_the_defaults():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    options = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert sorted(options) == sorted(defaults)
    for name, spec in options.items():
        assert spec["default"] == defaults[name], name
        assert spec.get("description"), name


def test_secured_components_are_scraped_with_the_site_ca_and_their_credential(rendered, secured):
    jobs = {job["job_name"]: job for job in yaml.safe_load((secured / "scrape.yml").read_text())["scrape_configs"]}
    tls = str(secured / "tls")
    assert jobs["victoriametrics"]["basic_auth"] == {"username": "hpcobs", "password_file": tls + "/victoriametrics-client"}
    # every other component marked tls: true in files/components.yml: the site CA and <component>-client
    assert jobs["alertmanager"]["scheme"] == "https"
    assert jobs["alertmanager"]["tls_config"] == {"ca_file": tls + "/ca.crt"}
    assert jobs["alertmanager"]["basic_auth"] == {"username": "hpcobs", "password_file": tls + "/alertmanager-client"}
    assert jobs["node"]["scheme"] == "https"
    assert jobs["node"]["tls_config"] == {"ca_file": tls + "/ca.crt"}
    assert jobs["node"]["basic_auth"] == {"username": "hpcobs", "password_file": tls + "/node-exporter-client"}
    assert jobs["dcgm"]["scheme"] == "https" and jobs["dcgm"]["tls_config"] == {"ca_file": tls + "/ca.crt"}
    assert jobs["dcgm"]["basic_auth"] == {"username": "hpcobs", "password_file": tls + "/dcgm-exporter-client"}
    assert jobs["vmalert"]["scheme"] == "https" and jobs["vmalert"]["tls_config"] == {"ca_file": tls + "/ca.crt"}
    assert jobs["vmalert"]["basic_auth"] == {"username": "hpcobs", "password_file": tls + "/vmalert-client"}
    assert jobs["loki"]["scheme"] == "https"
    assert jobs["loki"]["basic_auth"] == {"username": "hpcobs", "password_file": tls + "/loki-client"}
    assert jobs["smartctl"]["scheme"] == "https"
    assert jobs["smartctl"]["tls_config"] == {"ca_file": tls + "/ca.crt"}
    assert jobs["smartctl"]["basic_auth"] == {"username": "hpcobs", "password_file": tls + "/smartctl-exporter-client"}
    # grafana's job keeps the site's own scheme (an override of this test): no credential for it; the ipmi job is
    # switched off by this test's overrides: none for ipmi_exporter either
    assert json.loads((secured / "credentials.json").read_text()) == [
        "victoriametrics-client", "victoriametrics-admin", "alertmanager-client", "dcgm-exporter-client", "loki-client",
        "node-exporter-client", "slurm-metrics-client", "smartctl-exporter-client", "vmalert-client"]
    # switch off: no credential beyond VictoriaMetrics' own, no basic auth anywhere
    assert json.loads((rendered / "credentials.json").read_text()) == ["victoriametrics-client", "victoriametrics-admin"]
    assert not any("basic_auth" in job for job in
                   yaml.safe_load((rendered / "scrape.yml").read_text())["scrape_configs"])


def test_the_log_shippers_are_scraped_with_this_hosts_certificate_and_no_credential(tmp_path_factory):
    """Promtail takes no basic auth on its own server (files/components.yml auth: client_cert): under the switch
    its job presents the management host's own site certificate and key, and no promtail-client is installed."""
    out = render(tmp_path_factory, {"hpcobs_security": True, "hpcobs_components_disabled": []})
    jobs = {job["job_name"]: job for job in yaml.safe_load((out / "scrape.yml").read_text())["scrape_configs"]}
    tls = str(out / "tls")
    assert jobs["promtail"]["scheme"] == "https"
    assert jobs["promtail"]["tls_config"] == {"ca_file": tls + "/ca.crt", "cert_file": tls + "/server.crt",
                                              "key_file": tls + "/server.key"}
    assert "basic_auth" not in jobs["promtail"]
    assert "promtail-client" not in json.loads((out / "credentials.json").read_text())
    assert jobs["node"]["basic_auth"]["password_file"] == tls + "/node-exporter-client"
