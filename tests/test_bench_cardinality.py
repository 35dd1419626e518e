"""The cardinality benchmark's bookkeeping (bench/cardinality.py) and the shipped scrape-time drops it measures.

The benchmark itself deploys a node and runs victoria-metrics (make bench-cardinality); these tests check, on
recorded expositions, what it derives (series per exporter, the per-CPU/unit/disk/interface/sensor split, the
projection to the reference node), and that no metric a shipped rule, panel or scenario test reads is dropped by
the victoriametrics role's metric_relabel_configs or by the node_exporter role's collector flags.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


card = load("bench_cardinality", REPO / "bench" / "cardinality.py")

NODE = """# HELP node_cpu_seconds_total Seconds the CPUs spent in each mode.
# TYPE node_cpu_seconds_total counter
node_cpu_seconds_total{cpu="0",mode="idle"} 1
node_cpu_seconds_total{cpu="0",mode="user"} 1
node_cpu_seconds_total{cpu="1",mode="idle"} 1
node_cpu_seconds_total{cpu="1",mode="user"} 1
node_systemd_unit_state{name="slurmd.service",state="active",type="simple"} 1
node_systemd_unit_state{name="slurmd.service",state="failed",type="simple"} 0
node_systemd_units{state="active"} 30
node_disk_read_bytes_total{device="vda"} 5
node_network_up{device="eth0"} 1
node_network_up{device="lo"} 0
node_uname_info{machine="x86_64",release="6.1",sysname="Linux",version="#1 SMP \\"x\\", y"} 1
node_memory_MemTotal_bytes 1e+09

"""


def test_expositions_are_parsed_into_names_and_labels():
    series = card.parse(NODE)
    assert len(series) == 12
    assert series[0] == ("node_cpu_seconds_total", {"cpu": "0", "mode": "idle"})
    assert series[10][1]["version"] == '#1 SMP \\"x\\", y'
    assert series[-1] == ("node_memory_MemTotal_bytes", {})
    assert card.families(NODE)["node_cpu_seconds_total"] == 4


def test_series_are_split_by_what_grows_with_the_hardware():
    parts = card.breakdown("node_exporter", card.parse(NODE))
    assert parts == {"fixed": 4, "dims": {"cpu": [2, 4], "unit": [1, 2], "disk": [1, 1], "interface": [1, 1]}}
    ipmi = [("ipmi_up", {"collector": "ipmi"}), ("ipmi_sensor_state", {"id": "1", "name": "PS1", "type": "x"}),
            ("ipmi_sensor_value", {"id": "1", "name": "PS1", "type": "x"}), ("up", {"job": "ipmi"})]
    assert card.breakdown("ipmi_exporter", ipmi) == {"fixed": 2, "dims": {"sensor": [1, 2]}}


def test_the_projection_multiplies_measured_items_and_says_what_is_assumed():
    reference = {"cpu": 128, "unit": 11, "sensor": 150, "disk": 4, "interface": 10}
    total, how = card.project("node_exporter", card.breakdown("node_exporter", card.parse(NODE)), reference)
    assert total == 4 + 2 * 128 + 2 * 11 + 1 * 4 + 1 * 10
    assert how[0] == "2.0 per cpu measured x 128 cpu"
    total, how = card.project("ipmi_exporter", {"fixed": 7, "dims": {}}, reference)
    assert total == 7 + card.ASSUMED[("ipmi_exporter", "sensor")] * 150 and "ASSUMED" in how[0]
    assert card.project("dcgm_exporter", {"fixed": 312, "dims": {}}, reference) == (312, [])


def test_the_reference_units_follow_the_unit_include():
    assert card.reference_units("") == 250
    watched = card.reference_units(card.node_exporter_unit_include())
    assert watched == 11  # the stack's exporters, one shipper, Slurm, MUNGE and the NVIDIA services
    assert card.reference_units(r"slurmd\.service") == 1


def test_the_store_config_is_the_roles_jobs_with_the_site_ca_and_credentials(tmp_path):
    components = card.service.load_components()
    names = card.exporter_names(components)
    assert names == ["node_exporter", "dcgm_exporter", "ipmi_exporter", "smartctl_exporter"]
    config = card.store_config("10.0.0.2", names, components, tmp_path)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert sorted(jobs) == ["dcgm", "ipmi", "node", "smartctl"]
    defaults = yaml.safe_load((REPO / "roles" / "victoriametrics" / "defaults" / "main.yml").read_text())
    assert jobs["node"]["metric_relabel_configs"] == \
        defaults["victoriametrics_scrape_jobs"]["node"]["config"]["metric_relabel_configs"]
    assert jobs["node"]["static_configs"] == [{"targets": ["10.0.0.2:9100"]}]
    assert jobs["node"]["scheme"] == "https" and jobs["node"]["tls_config"] == {"ca_file": str(tmp_path / "ca.crt")}
    assert jobs["node"]["basic_auth"]["password_file"] == str(tmp_path / "credentials" / "node-exporter-client")


def test_figures_and_report_of_a_recorded_run(capsys):
    served = {"node_exporter": card.parse(NODE)}
    stored = {"node_exporter": [s for s in card.parse(NODE) if s[1].get("mode") != "user"] + [("up", {})]}
    result = card.figures(served, stored, "")
    row = result["exporters"]["node_exporter"]
    assert (row["served"], row["stored"], row["stored_meta"]) == (12, 11, 1)
    assert row["stored_projected"] < row["served_projected"]
    assert card.report(result, 8, 1500, 3) is True
    out = capsys.readouterr().out
    assert "PROJECTION" in out and "| **total** | **12** | **11** |" in out


# --- Nothing a shipped rule, panel or scenario reads is dropped ---------------------------------------------------

# the node_exporter scenario's test is not a reader: it checks that the cut families are absent
READERS = (list((REPO / "roles" / "vmalert" / "templates" / "rules").glob("*.j2"))
           + list((REPO / "roles" / "grafana" / "files" / "dashboards").glob("*.json"))
           + [path for path in REPO.glob("molecule/*/tests/*.py") if path.name != "test_node_exporter.py"]
           + list((REPO / "roles" / "slurm_metrics").rglob("*.py")))
EXPORTER_NAME = re.compile(r"\b((?:node|ipmi|smartctl|go|process|promhttp)_[a-zA-Z0-9_]+)")


def names_read():
    names = set()
    for path in READERS:
        names.update(EXPORTER_NAME.findall(path.read_text(encoding="utf-8")))
    return {n for n in names if not n.startswith(("node_exporter", "ipmi_exporter", "smartctl_exporter"))
            or n.endswith("_build_info")}


def drops():
    defaults = yaml.safe_load((REPO / "roles" / "victoriametrics" / "defaults" / "main.yml").read_text())
    for job, entry in defaults["victoriametrics_scrape_jobs"].items():
        rules = (entry.get("config") or {}).get("metric_relabel_configs", [])
        if isinstance(rules, str):  # the dcgm job's: the job label's rules drop no metric (test_job_label_relabel)
            assert job == "dcgm" and "hpcobs_job_label_relabel" in rules, (job, rules)
            continue
        for rule in rules:
            yield job, rule


def test_the_readers_are_found():
    read = names_read()
    for name in ["node_memory_MemAvailable_bytes", "node_vmstat_oom_kill", "ipmi_sensor_state",
                 "smartctl_device_percentage_used", "node_uname_info", "node_textfile_scrape_error"]:
        assert name in read


@pytest.mark.parametrize("job,rule", list(drops()), ids=lambda value: str(value)[:40])
def test_no_drop_removes_a_metric_that_is_read(job, rule):
    assert rule["action"] == "drop"
    pattern = re.compile(rule["regex"])
    if rule["source_labels"] == ["__name__"]:
        hit = sorted(name for name in names_read() if pattern.fullmatch(name))
        assert hit == [], "%s drops %s" % (job, hit)
    else:  # node_cpu_seconds_total by mode: idle stays
        assert rule["source_labels"] == ["__name__", "mode"]
        assert not pattern.fullmatch("node_cpu_seconds_total;idle")
        assert pattern.fullmatch("node_cpu_seconds_total;user")


def test_the_disabled_collectors_serve_nothing_that_is_read():
    # the families each collector or option serves (node_exporter 1.11's collector/*.go)
    served_by = {"cpufreq": ("node_cpu_frequency_", "node_cpu_scaling_"), "schedstat": ("node_schedstat_",),
                 "softnet": ("node_softnet_",), "cpu.guest": ("node_cpu_guest_seconds_total",)}
    defaults = yaml.safe_load((REPO / "roles" / "node_exporter" / "defaults" / "main.yml").read_text())
    for collector in defaults["node_exporter_collectors_disabled"]:
        assert [n for n in names_read() if n.startswith(served_by[collector])] == [], collector
    assert not defaults["node_exporter_exporter_metrics"]
    assert [n for n in names_read() if n.startswith(("go_", "process_", "promhttp_"))] == []


def test_the_store_scrapes_with_the_roles_relabelling_evaluated():
    """The dcgm job's relabelling is an expression of the role's defaults: the benchmark evaluates it, as Ansible
    does, instead of handing victoria-metrics the expression's text."""
    jobs = card.scrape_jobs()
    fields = card.service.shared_fact("gpu_job_fields")
    assert jobs["dcgm_exporter"]["config"]["metric_relabel_configs"] == card.service.job_label_relabel(fields)
    defaults = yaml.safe_load((REPO / "roles" / "victoriametrics" / "defaults" / "main.yml").read_text())
    node = defaults["victoriametrics_scrape_jobs"]["node"]["config"]
    assert jobs["node_exporter"]["config"] == node
    config = card.store_config("10.0.0.1", ["dcgm_exporter"], card.service.load_components(), Path("/pki"))
    assert isinstance(config["scrape_configs"][0]["metric_relabel_configs"], list)
