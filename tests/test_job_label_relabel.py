"""The Slurm job label kept only on the GPU fields read per job (filter hpcobs_job_label_relabel, the shared fact
gpu_job_fields, the victoriametrics role's dcgm job): the relabelling the filter builds, its errors, and what the real
victoria-metrics stores when it scrapes dcgm-exporter text with it; the management benchmark's history goes through
the same rules (bench/mgmt.py relabel) and must give the same series."""
from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from tooling import REPO, exposition_server, victoriametrics

sys.path.insert(0, str(REPO / "playbooks" / "filter_plugins"))
import hpcobs_service as svc  # noqa: E402


def _bench():
    spec = importlib.util.spec_from_file_location("bench_mgmt_relabel", REPO / "bench" / "mgmt.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


JOB_FIELDS = svc.shared_fact("gpu_job_fields")

# dcgm-exporter's text for three GPUs (labels as its HPC job mapping gives them): GPU 0 shared by two jobs (one copy
# of every field per job), GPU 1 held by one job, GPU 2 held by none.
EXPOSITION = "".join(
    '%s{gpu="%d",UUID="GPU-%d",device="nvidia%d",modelName="H100",Hostname="gpu01"%s} %s\n'
    % (field, gpu, gpu, gpu, ',hpc_job="%s"' % job if job else "", value)
    for field, value in (("DCGM_FI_DEV_GPU_TEMP", 40), ("DCGM_FI_DEV_POWER_USAGE", 300.5),
                         ("DCGM_FI_DEV_XID_ERRORS", 0), ("DCGM_FI_DEV_PCIE_LINK_GEN", 5))
    for gpu, job in ((0, "101"), (0, "102"), (1, "103"), (2, ""))
)


def test_the_shared_fields_are_what_the_rules_dashboards_and_jobstats_read_per_job():
    """Every DCGM field a shipped rule, dashboard or hpcobs-jobstats selects by hpc_job keeps the label (else the
    query finds nothing), and every kept field is read so (else it costs series for nothing)."""
    texts = [path.read_text() for path in sorted((REPO / "roles" / "vmalert" / "templates" / "rules").glob("*.j2"))]
    texts += [path.read_text() for path in sorted((REPO / "roles" / "grafana" / "files" / "dashboards").glob("*.json"))]
    read = set()
    for text in texts:
        read |= set(re.findall(r'(DCGM_FI_[A-Z0-9_]+)\{[^}]*hpc_job', text))
    jobstats = (REPO / "roles" / "slurm_metrics" / "files" / "hpcobs-jobstats").read_text()
    assert '"%s{hpc_job=%s}" % (metric' in jobstats  # it reads its SERIES by hpc_job
    block = jobstats.split("SERIES = {", 1)[1].split("}", 1)[0]
    read |= set(re.findall(r'"(DCGM_FI_[A-Z0-9_]+)"', block))
    assert read, "no query reads a DCGM field by hpc_job: the check above lost its pattern"
    assert read <= set(JOB_FIELDS), "read by hpc_job but not kept: %s" % sorted(read - set(JOB_FIELDS))
    assert set(JOB_FIELDS) <= read, "kept but never read by hpc_job: %s" % sorted(set(JOB_FIELDS) - read)


def test_the_relabelling_marks_the_kept_fields_and_empties_the_label_elsewhere():
    rules = svc.job_label_relabel(["B_FIELD", "A_FIELD", "B_FIELD"])
    assert rules == [
        {"source_labels": ["__name__"], "regex": "A_FIELD|B_FIELD", "target_label": svc.JOB_LABEL_MARK,
         "replacement": "1"},
        {"source_labels": [svc.JOB_LABEL_MARK], "regex": "", "target_label": "hpc_job", "replacement": ""},
        {"action": "labeldrop", "regex": svc.JOB_LABEL_MARK},
    ]
    assert svc.job_label_relabel(["X"], label="job_id")[1]["target_label"] == "job_id"


@pytest.mark.parametrize("fields, message", [
    ([], "non-empty list"),
    ("DCGM_FI_DEV_GPU_TEMP", "non-empty list"),
    (None, "non-empty list"),
    (["DCGM_FI_DEV_GPU_TEMP", "DCGM FI"], "not a metric name"),
    (["DCGM_FI_DEV_GPU_TEMP|.*"], "not a metric name"),
    ([3], "not a metric name"),
])
def test_bad_fields_are_refused_with_the_offending_value(fields, message):
    with pytest.raises(AnsibleFilterError, match=message):
        svc.job_label_relabel(fields)


def test_a_reserved_label_is_refused():
    with pytest.raises(AnsibleFilterError, match="not a label name"):
        svc.job_label_relabel(["X"], label="__name__")


def test_the_benchmark_history_applies_the_same_rules():
    bench = _bench()
    rules = svc.job_label_relabel(JOB_FIELDS)
    assert bench.relabel("DCGM_FI_DEV_XID_ERRORS", {"gpu": "0", "hpc_job": "7"}, rules) == (
        "DCGM_FI_DEV_XID_ERRORS", {"gpu": "0"})
    assert bench.relabel("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0", "hpc_job": "7"}, rules) == (
        "DCGM_FI_DEV_GPU_TEMP", {"gpu": "0", "hpc_job": "7"})
    assert bench.relabel("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0"}, rules) == ("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0"})
    drop = [{"source_labels": ["__name__", "mode"], "regex": "cpu;(user|system)", "action": "drop"}]
    assert bench.relabel("cpu", {"mode": "user"}, drop) is None
    assert bench.relabel("cpu", {"mode": "idle"}, drop) == ("cpu", {"mode": "idle"})
    copy = [{"source_labels": ["a"], "regex": "(x)(y)", "target_label": "b", "replacement": "${2}-$1"}]
    assert bench.relabel("m", {"a": "xy"}, copy) == ("m", {"a": "xy", "b": "y-x"})
    with pytest.raises(ValueError, match="hashmod"):
        bench.relabel("m", {}, [{"action": "hashmod", "source_labels": ["a"], "modulus": 2, "target_label": "b"}])


def _series(url: str) -> list[dict]:
    query = urllib.parse.urlencode({"match[]": '{job="dcgm"}'})
    with urllib.request.urlopen("%s/api/v1/series?%s" % (url, query), timeout=10) as answer:
        return json.load(answer)["data"]


def test_victoria_metrics_stores_the_job_label_only_on_the_kept_fields(tmp_path):
    """The real binary scrapes dcgm-exporter text with the role's dcgm job rules: the kept fields keep one series per
    job, the others one per GPU; the benchmark's own relabelling of the same text gives the same series."""
    rules = svc.job_label_relabel(JOB_FIELDS)
    kept = [("DCGM_FI_DEV_GPU_TEMP", "0", "101"), ("DCGM_FI_DEV_GPU_TEMP", "0", "102"),
            ("DCGM_FI_DEV_GPU_TEMP", "1", "103"), ("DCGM_FI_DEV_GPU_TEMP", "2", ""),
            ("DCGM_FI_DEV_POWER_USAGE", "0", "101"), ("DCGM_FI_DEV_POWER_USAGE", "0", "102"),
            ("DCGM_FI_DEV_POWER_USAGE", "1", "103"), ("DCGM_FI_DEV_POWER_USAGE", "2", "")]
    dropped = [(field, gpu, "") for field in ("DCGM_FI_DEV_PCIE_LINK_GEN", "DCGM_FI_DEV_XID_ERRORS")
               for gpu in ("0", "1", "2")]
    stored = []
    with exposition_server(EXPOSITION) as target:
        config = {"scrape_configs": [{"job_name": "dcgm", "scrape_interval": "1s", "metric_relabel_configs": rules,
                                      "static_configs": [{"targets": [target], "labels": {"node": "gpu01"}}]}]}
        (tmp_path / "scrape.yml").write_text(yaml.safe_dump(config))
        with victoriametrics(tmp_path / "data", [], ["-promscrape.config=%s" % (tmp_path / "scrape.yml")]) as url:
            deadline = time.monotonic() + 60
            while len(stored) < len(kept + dropped) and time.monotonic() < deadline:
                time.sleep(0.5)
                stored = [s for s in _series(url) if s["__name__"].startswith("DCGM_")]
    got = sorted((s["__name__"], s["gpu"], s.get("hpc_job", "")) for s in stored)
    assert got == sorted(kept + dropped)
    assert not any(svc.JOB_LABEL_MARK in s for s in stored)
    bench = _bench()
    simulated = set()
    for name, labels, _value in bench.parse_exposition(EXPOSITION):
        kept_name, kept_labels = bench.relabel(name, labels, rules)
        simulated.add((kept_name, kept_labels["gpu"], kept_labels.get("hpc_job", "")))
    assert sorted(simulated) == got
