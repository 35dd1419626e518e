"""Unit tests of what the management-host benchmark (bench/mgmt.py) derives: its load generator's output, the job
schedule, the history it imports, the figures it reads from /proc, VictoriaMetrics, vmalert and Prometheus, its
percentiles and its report. No run: seconds, no binary started."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("bench_mgmt", REPO / "bench" / "mgmt.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_mgmt"] = module
    spec.loader.exec_module(module)
    return module


mgmt = _load()
REF = 1_790_000_000.0


@pytest.fixture(scope="module")
def generator():
    targets = [(job, mgmt.node_address(i), port, mgmt.node_name(i)) for i in range(3)
               for job, port in (("node", 9100), ("dcgm", 9400), ("ipmi", 9290), ("smartctl", 9633))]
    targets.append(("node", mgmt.MGMT, 9100, "mgmt01"))
    return mgmt.Generator(targets, 7, REF)


def test_addresses_stay_on_loopback_and_are_distinct():
    addresses = [mgmt.node_address(i) for i in range(2000)]
    assert len(set(addresses)) == 2000
    assert all(a.startswith("127.2.") and 1 <= int(a.rsplit(".", 1)[1]) <= 250 for a in addresses)
    assert mgmt.node_address(0) == "127.2.0.1" and mgmt.node_address(250) == "127.2.1.1"
    assert mgmt.MGMT.startswith("127.") and mgmt.PROMETHEUS_ADDRESS.startswith("127.")


def test_inventory_points_every_gpu_node_at_its_address():
    inv = mgmt.inventory(3)["all"]["children"]
    assert inv["gpu_nodes"]["hosts"] == {"gpu0001": {"hpcobs_address": "127.2.0.1"},
                                         "gpu0002": {"hpcobs_address": "127.2.0.2"},
                                         "gpu0003": {"hpcobs_address": "127.2.0.3"}}
    assert inv["management"]["hosts"] == {"mgmt01": {"hpcobs_address": mgmt.MGMT}}


def test_served_targets_come_from_the_rendered_target_files(tmp_path):
    (tmp_path / "node.json").write_text(json.dumps([{"targets": ["127.2.0.1:9100"], "labels": {"node": "gpu0001"}}]))
    (tmp_path / "dcgm.json").write_text(json.dumps([{"targets": ["127.2.0.1:9400"], "labels": {"node": "gpu0001"}}]))
    (tmp_path / "victoriametrics.json").write_text(json.dumps([{"targets": ["127.1.0.1:8428"],
                                                                "labels": {"node": "mgmt01"}}]))
    assert mgmt.served_targets(tmp_path) == [("node", "127.2.0.1", 9100, "gpu0001"),
                                             ("dcgm", "127.2.0.1", 9400, "gpu0001")]


def test_node_exporter_output_is_valid_text_with_a_realistic_series_count(generator):
    body = generator.body("node", "gpu0001", REF + 30)
    samples = mgmt.parse_exposition(body)
    jobs = generator.schedule.jobs_at("gpu0001", REF + 30)
    assert 600 <= len(samples) <= 900
    info = [labels for name, labels, _ in samples if name == "hpcobs_slurm_job_info"]
    assert len(info) == len(jobs)
    for labels in info:
        assert set(labels) == {"hpc_job", "user", "account", "partition"}
    families = {name for name, _, _ in samples}
    for needed in ("node_memory_MemAvailable_bytes", "node_memory_MemTotal_bytes", "node_vmstat_oom_kill",
                   "node_cpu_seconds_total", "node_systemd_unit_state", "node_filesystem_avail_bytes"):
        assert needed in families
    # one HELP and one TYPE per family, before its samples
    typed = [line.split()[2] for line in body.splitlines() if line.startswith("# TYPE ")]
    assert len(typed) == len(set(typed))
    # the management host's node_exporter runs no job
    assert not [n for n, _, _ in mgmt.parse_exposition(generator.body("node", "mgmt01", REF))
                if n == "hpcobs_slurm_job_info"]


def test_dcgm_output_is_the_simulators_with_the_job_label(generator):
    t = REF + 60
    body = generator.body("dcgm", "gpu0002", t)
    samples = mgmt.parse_exposition(body)
    gpus = {labels["gpu"] for _, labels, _ in samples}
    assert gpus == {str(g) for g in range(8)}
    fields = {name for name, _, _ in samples}
    assert len(samples) == len(fields) * 8  # one series per field and GPU (no MIG, one job per GPU at most)
    jobs = dict(generator.schedule.jobs_at("gpu0002", t))
    for _, labels, _ in samples:
        slot = int(labels["gpu"]) // 4
        assert labels.get("hpc_job") == jobs.get(slot)
        assert labels["Hostname"] == "gpu0002" and labels["UUID"].startswith("GPU-")


def test_counters_grow_and_gauges_move_between_scrapes(generator):
    first = {(n, tuple(sorted(l.items()))): v for n, l, v in mgmt.parse_exposition(generator.body("node", "gpu0003", REF))}
    later = {(n, tuple(sorted(l.items()))): v for n, l, v in
             mgmt.parse_exposition(generator.body("node", "gpu0003", REF + 15))}
    common = set(first) & set(later)
    cpu = [k for k in common if k[0] == "node_cpu_seconds_total" and ("mode", "user") in k[1]]
    assert cpu and all(later[k] > first[k] for k in cpu)
    assert any(later[k] != first[k] for k in common if k[0] == "node_memory_MemAvailable_bytes")
    assert all(later[k] == first[k] for k in common if k[0] == "node_memory_MemTotal_bytes")


def test_ipmi_and_smartctl_answer_what_the_hardware_rules_read(generator):
    ipmi = {n for n, _, _ in mgmt.parse_exposition(generator.body("ipmi", "gpu0001", REF))}
    smart = {n for n, _, _ in mgmt.parse_exposition(generator.body("smartctl", "gpu0001", REF))}
    assert {"ipmi_up", "ipmi_fan_speed_state", "ipmi_sensor_state"} <= ipmi
    assert {"smartctl_device_percentage_used", "smartctl_device_available_spare"} <= smart


def test_jobs_start_and_end():
    schedule = mgmt.Schedule(3, REF - 86400)
    segments = schedule.segments("gpu0042", 0, REF)
    assert segments[0][0] <= REF - 86400 and segments[-1][1] >= REF
    assert all(a[1] == b[0] for a, b in zip(segments, segments[1:]))  # no hole, no overlap
    jobs = [s for s in segments if s[2]]
    assert len(jobs) >= 2 and len({s[2] for s in jobs}) == len(jobs)
    assert all(3600 <= end - start <= 8 * 3600 for start, end, job in jobs)
    # deterministic: the generator process and the backfill see the same jobs
    assert mgmt.Schedule(3, REF - 86400).segments("gpu0042", 0, REF) == segments
    running = schedule.jobs_at("gpu0042", jobs[0][0] + 1)
    assert (0, jobs[0][2]) in running
    other = mgmt.Schedule(3, REF - 86400).segments("gpu0042", 1, REF)
    assert {s[2] for s in other if s[2]}.isdisjoint({s[2] for s in jobs})


def test_job_mapping_covers_the_slot_gpus():
    assert mgmt.mapping_of([(0, "11"), (1, "12")]) == {"0": ["11"], "1": ["11"], "2": ["11"], "3": ["11"],
                                                      "4": ["12"], "5": ["12"], "6": ["12"], "7": ["12"]}
    assert mgmt.mapping_of([]) == {}
    user, account = mgmt.job_labels("100123")
    assert user.startswith("user") and account in mgmt.ACCOUNTS


def test_value_model():
    assert mgmt.value_at("counter", 100.0, 2.0, 0, REF + 10, REF) == 120.0
    assert mgmt.value_at("counter", 100.0, 2.0, 0, REF - 1000, REF) == 0.0  # never below zero
    assert mgmt.value_at("const", 5.0, 0, 0, REF, REF) == 5.0
    assert abs(mgmt.value_at("gauge", 50.0, 0, 1, REF, REF) - 50.0) <= 50.0 * 0.05
    assert mgmt.format_value("gauge", 3.0, True) == "3"
    assert mgmt.format_value("counter", 1.005, False) in ("1.00", "1.01")


def test_backfill_lines_carry_the_scrape_labels_and_the_job_segments(generator):
    grid = [REF - 3600 + 600 * k for k in range(6)]
    lines = mgmt.backfill_node([("dcgm", "127.2.0.1", 9400), ("node", "127.2.0.1", 9100)], "gpu0001", generator,
                               grid, REF, {}, mgmt.dcgm_types())
    rows = [json.loads(line) for line in lines]
    for row in rows:
        assert len(row["values"]) == len(row["timestamps"]) >= 1
        assert row["metric"]["node"] == "gpu0001" and row["metric"]["job"] in ("dcgm", "node")
        assert row["metric"]["instance"] in ("127.2.0.1:9400", "127.2.0.1:9100")
        assert all(grid[0] * 1000 <= ts <= grid[-1] * 1000 for ts in row["timestamps"])
    ups = [r for r in rows if r["metric"]["__name__"] == "up"]
    assert len(ups) == 2 and all(r["values"] == [1] * 6 for r in ups)
    job_info = [r for r in rows if r["metric"]["__name__"] == "hpcobs_slurm_job_info"]
    dcgm_jobs = {r["metric"]["hpc_job"] for r in rows if r["metric"]["job"] == "dcgm" and "hpc_job" in r["metric"]}
    assert {r["metric"]["hpc_job"] for r in job_info} == dcgm_jobs
    energy = [r for r in rows if r["metric"]["__name__"] == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    assert energy and all(r["values"] == sorted(r["values"]) for r in energy)


def test_backfill_applies_the_jobs_relabelling_as_a_scrape_does(generator):
    sys.path.insert(0, str(REPO / "playbooks" / "filter_plugins"))
    import hpcobs_service

    fields = set(hpcobs_service.shared_fact("gpu_job_fields"))
    relabels = {"dcgm": hpcobs_service.job_label_relabel(sorted(fields)),
                "node": [{"source_labels": ["__name__"], "regex": "node_cpu_seconds_total", "action": "drop"}]}
    grid = [REF - 3 * 86400 + 3600 * k for k in range(72)]
    lines = mgmt.backfill_node([("dcgm", "127.2.0.1", 9400), ("node", "127.2.0.1", 9100)], "gpu0001", generator,
                               grid, REF, {}, mgmt.dcgm_types(), relabels)
    rows = [json.loads(line)["metric"] for line in lines]
    dcgm = [r for r in rows if r["job"] == "dcgm" and r["__name__"].startswith("DCGM_")]
    with_job = {r["__name__"] for r in dcgm if "hpc_job" in r}
    assert with_job == fields  # the schedule has jobs in these 3 days: every kept field carries them
    assert {r["__name__"] for r in dcgm} > fields
    assert not any(r["__name__"] == "node_cpu_seconds_total" for r in rows)
    assert any(r["__name__"] == "hpcobs_slurm_job_info" for r in rows)


def test_segment_indexes():
    grid = [0, 10, 20, 30]
    assert mgmt.segment_indexes(grid, 5, 25) == (1, 3)
    assert mgmt.segment_indexes(grid, -5, 100) == (0, 4)
    assert mgmt.segment_indexes(grid, 11, 19) == (2, 2)


def test_proc_figures_of_this_process():
    sampler = mgmt.Sampler({"self": os.getpid()}, interval=0.05)
    first = sampler.sample()
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    second = sampler.sample()
    assert second["self"]["cpu"] > first["self"]["cpu"] and second["self"]["rss"] > 10 * 2 ** 20


def test_usage_cores_and_rss():
    samples = [{"t": 0.0, "a": {"cpu": 10.0, "rss": 100 * 2 ** 20}, "b": {"cpu": 0.0, "rss": 50 * 2 ** 20}},
               {"t": 50.0, "a": {"cpu": 20.0, "rss": 300 * 2 ** 20}, "b": {"cpu": 5.0, "rss": 50 * 2 ** 20}},
               {"t": 100.0, "a": {"cpu": 30.0, "rss": 200 * 2 ** 20}, "b": {"cpu": 10.0, "rss": 60 * 2 ** 20}}]
    out = mgmt.usage(samples, ["a", "b"])
    assert out["a"] == {"cores": 0.2, "rss_mib": 200.0, "peak_rss_mib": 300.0}
    assert out["b"]["cores"] == 0.1
    assert out["together"] == {"cores": 0.3, "rss_mib": 260.0, "peak_rss_mib": 350.0} and out["load1_median"] == 0.0


def test_percentile_nearest_rank():
    values = list(range(1, 101))
    assert mgmt.percentile(values, 50) == 50 and mgmt.percentile(values, 99) == 99
    assert mgmt.percentile(values, 100) == 100 and mgmt.percentile([7.0], 95) == 7.0
    assert mgmt.percentile([3, 1, 2], 95) == 3


VM_METRICS = """\
# HELP vm_data_size_bytes x
vm_data_size_bytes{type="storage/small"} 1000
vm_data_size_bytes{type="storage/big"} 3000
vm_data_size_bytes{type="indexdb/file"} 1000
vm_rows{type="storage/small"} 4000
vm_rows{type="storage/big"} 1000
vm_rows{type="indexdb/file"} 777
vm_cache_entries{type="storage/hour_metric_ids"} 1234
"""


def test_storage_figures():
    assert mgmt.storage_figures(VM_METRICS) == {"data_bytes": 5000, "rows": 5000, "bytes_per_sample": 1.0,
                                                "active_series": 1234}
    assert mgmt.storage_figures("")["bytes_per_sample"] is None


VMALERT_METRICS = """\
vmalert_iteration_duration_seconds{group="hpcobs-gpu",file="/r/hpcobs-gpu.yml",quantile="0.5"} 0.2
vmalert_iteration_duration_seconds{group="hpcobs-gpu",file="/r/hpcobs-gpu.yml",quantile="0.99"} 0.9
vmalert_iteration_duration_seconds_sum{group="hpcobs-gpu",file="/r/hpcobs-gpu.yml"} 3
vmalert_iteration_duration_seconds_count{group="hpcobs-gpu",file="/r/hpcobs-gpu.yml"} 10
vmalert_iteration_duration_seconds_sum{group="hpcobs-node",file="/r/hpcobs-node.yml"} 0
vmalert_iteration_duration_seconds_count{group="hpcobs-node",file="/r/hpcobs-node.yml"} 0
vmalert_iteration_total{group="hpcobs-gpu"} 10
"""


def test_vmalert_group_durations():
    groups = mgmt.vmalert_groups(VMALERT_METRICS)
    assert groups["hpcobs-gpu"] == {"mean_s": 0.3, "p99_s": 0.9, "iterations": 10}
    assert groups["hpcobs-node"] == {"mean_s": None, "p99_s": None, "iterations": 0}
    assert set(groups) == {"hpcobs-gpu", "hpcobs-node"}


def test_vmalert_rule_figures_are_sorted_costliest_first():
    api = json.dumps({"data": {"groups": [
        {"name": "g1", "rules": [{"name": "cheap", "evaluationTime": 0.01, "lastSeriesFetched": 3, "lastSamples": 1},
                                 {"name": "never", "duration": 600}]},
        {"name": "g2", "rules": [{"name": "costly", "evaluationTime": 0.5, "lastSeriesFetched": 9000,
                                  "lastSamples": 0, "duration": 60}]}]}}).encode()
    rows = mgmt.vmalert_rules(api)
    assert [r["rule"] for r in rows] == ["costly", "cheap", "never"]
    # "duration" is the rule's `for:`, not its evaluation time
    assert rows[0] == {"group": "g2", "rule": "costly", "seconds": 0.5, "series_fetched": 9000, "samples": 0,
                       "error": ""}
    assert rows[2]["seconds"] == 0.0


def test_smoke_problems_name_what_makes_a_run_meaningless(tmp_path):
    (tmp_path / "a.yml").write_text("groups:\n  - name: g1\n    rules: []\n  - name: g2\n    rules: []\n")
    groups = mgmt.rendered_groups(tmp_path)
    assert groups == ["g1", "g2"]
    good = {"rule_groups": {"g1": {"iterations": 2}, "g2": {"iterations": 1}},
            "rules": [{"group": "g1", "rule": "r", "error": ""}],
            "panels": [{"dashboard": "d", "panel": "p", "ref": "A", "error": ""}],
            "scrape": {job: {"scrapes": 3} for job in mgmt.SERVED_JOBS}, "storage": {"live_rows": 10},
            "prometheus": {"rules": {"kept": ["g1"]}}}
    assert mgmt.smoke_problems(good, groups) == []
    bad = dict(good, rule_groups={"g1": {"iterations": 2}, "g2": {"iterations": 0}},
               rules=[{"group": "g1", "rule": "r", "error": "duplicate series"}],
               panels=[{"dashboard": "d", "panel": "p", "ref": "A", "error": "timeout"}],
               scrape={"node": {"scrapes": 3}}, storage={"live_rows": 0}, prometheus={"rules": {"kept": []}})
    problems = mgmt.smoke_problems(bad, groups)
    assert "rule group g2 never evaluated" in problems
    assert "rule g1 / r: duplicate series" in problems
    assert "panel d / p (A): timeout" in problems
    assert "job dcgm was never scraped" in problems and "job node was never scraped" not in problems
    assert "nothing was stored during the live phase" in problems
    assert "Prometheus ran without any rule group" in problems
    assert mgmt.smoke_problems(dict(good, prometheus=None), groups) == []


def test_prometheus_group_durations():
    page = ('prometheus_rule_group_last_duration_seconds{rule_group="/w/prom-rules/hpcobs-gpu.yml;hpcobs-gpu"} 0.25\n'
            'prometheus_rule_group_interval_seconds{rule_group="/w/prom-rules/hpcobs-gpu.yml;hpcobs-gpu"} 30\n')
    assert mgmt.prometheus_groups(page) == {"hpcobs-gpu": 0.25}


def test_prometheus_rules_keep_only_the_keys_prometheus_knows(tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "a.yml").write_text("groups:\n  - name: ok\n    interval: 30s\n    eval_offset: 5s\n    rules:\n"
                                 "      - record: a:b:c\n        expr: sum(up)\n        debug: true\n"
                                 "  - name: metricsql\n    rules:\n      - record: a:b:d\n"
                                 "        expr: integrate(up[1h])\n")
    promtool = tmp_path / "promtool"
    promtool.write_text("#!/bin/sh\ngrep -q integrate \"$3\" && { echo 'unknown function integrate' >&2; exit 1; }\n"
                        "exit 0\n")
    promtool.chmod(0o755)
    result = mgmt.prometheus_rules(rules, tmp_path / "out", promtool)
    assert result["kept"] == ["ok"] and "unknown function" in result["refused"]["metricsql"]
    kept = (tmp_path / "out" / "ok.yml").read_text()
    assert "eval_offset" not in kept and "debug" not in kept and "interval: 30s" in kept
    assert not (tmp_path / "out" / "metricsql.yml").exists()


def test_with_share_overlays_usr_share_only_inside_the_command():
    command = mgmt.with_share(Path("/x/usr/share"), ["/bin/alertmanager", "--flag"])
    assert command[:4] == ["unshare", "-m", "--propagation", "private"]
    assert command[-3:] == ["/x/usr/share", "/bin/alertmanager", "--flag"]
    assert 'exec "$@"' in command[6]


RESULTS = [{"nodes": 20, "run": 1, "ok": True,
            "usage": {n: {"cores": c, "rss_mib": r, "peak_rss_mib": r} for n, c, r in
                      (("victoriametrics", 0.2, 300.0), ("vmalert", 0.05, 40.0), ("alertmanager", 0.0, 30.0),
                       ("together", 0.25, 370.0))},
            "storage": {"bytes_per_sample": 2.0, "live_bytes_per_sample": 0.8, "active_series": 10},
            "rule_groups": {"hpcobs-gpu": {"mean_s": 0.3, "p99_s": 0.5, "iterations": 4}},
            "rules": [{"group": "hpcobs-gpu", "rule": "HpcobsGpuXidCritical", "seconds": 0.25, "series_fetched": 7,
                       "samples": 0}],
            "scrape": {"dcgm": {"p99_ms": 9.0}, "node": {"p99_ms": 12.0}},
            "backfill": {"step_s": 60, "seconds": 10.0, "points_per_series": 60, "series_lines": 5},
            "panels": [{"dashboard": "d", "panel": "p", "ref": "A", "p50_ms": 100.0, "p95_ms": 400.0,
                        "series": 1, "error": ""}],
            "prometheus": {"version": "3.5.3", "usage": {"cores": 0.3, "rss_mib": 500.0, "peak_rss_mib": 510.0},
                           "rule_groups_max_s": {"hpcobs-gpu": 0.2}, "rules": {"kept": ["hpcobs-gpu"],
                                                                                "refused": {}}}}]


def test_report_tables_and_plots(tmp_path):
    text = mgmt.report_tables(RESULTS)
    assert "| 20 | 1 |" in text and "hpcobs-gpu" in text and "400" in text
    assert "d / p" in text  # the panel over the goal is listed
    assert "| hpcobs-gpu / HpcobsGpuXidCritical | 0.25 | 7 |" in text
    pngs = mgmt.plots(RESULTS, tmp_path)
    assert pngs and all(p.exists() and p.stat().st_size > 1000 for p in pngs)


def test_vm_args_take_a_list_of_flags():
    assert mgmt.vm_flags('["-memory.allowedBytes=512MiB", "-search.noStaleMarkers"]') == [
        "-memory.allowedBytes=512MiB", "-search.noStaleMarkers"]
    assert mgmt.vm_flags("[]") == []
    for bad in ('"-memory.allowedBytes=1"', '["memory.allowedBytes=1"]', '[1]', '{"a": 1}', '["-"]'):
        with pytest.raises(argparse.ArgumentTypeError, match="JSON list of flags"):
            mgmt.vm_flags(bad)
