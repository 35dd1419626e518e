"""hpcobs-jobstats and hpcobs-report (roles/slurm_metrics/files) against a real victoria-metrics.

The test loads raw series into a real victoria-metrics (/api/v1/import/prometheus): the GPU series of two jobs as
dcgm-exporter publishes them (copies labelled hpc_job, one GPU with an energy counter that resets once, one without a
counter), the hooks' hpcobs_slurm_job_info, an ALERTS series, and the vmalert role's per-account and per-job
recording rules. The tools' numbers are compared with sums computed here from the same raw samples.

Tools (victoria-metrics): HPCOBS_TOOLS_BIN, else .cache/tools/bin, else PATH. A missing tool fails.
"""
from __future__ import annotations

import csv
import datetime
import importlib.machinery
import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tooling import import_lines, tool, victoriametrics

REPO = Path(__file__).resolve().parents[1]
FILES = REPO / "roles" / "slurm_metrics" / "files"
STEP = 15
NOW = int(time.time())
JOB_START = NOW - 3000
JOB_SAMPLES = 160                    # 40 minutes at 15 s
# report period: two hours ending 5 minutes ago, on whole minutes
REPORT_END = (NOW - 300) // 60 * 60
REPORT_START = REPORT_END - 7200
REPORT_STEP = 30


def load(name):
    # the tools import hpcobs_vmclient from their own directory (first on sys.path when they run)
    if str(FILES) not in sys.path:
        sys.path.insert(0, str(FILES))
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(FILES / name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


jobstats = load("hpcobs-jobstats")
report = load("hpcobs-report")


def job_series():
    """{(metric, labels tuple): [(ts, value)]} of job 5001 (3 GPUs on two nodes) and job 5002 (elsewhere)."""
    series = {}

    def add(metric, labels, ts, value):
        series.setdefault((metric, tuple(sorted(labels.items()))), []).append((ts, value))

    energy = {"0": 1.0e9, "1": 5.0e8}
    for i in range(JOB_SAMPLES):
        ts = JOB_START + i * STEP
        for node, gpu in (("gpuA", "0"), ("gpuA", "1"), ("gpuB", "0")):
            labels = {"node": node, "gpu": gpu, "UUID": "GPU-%s-%s" % (node, gpu), "modelName": "NVIDIA H100",
                      "hpc_job": "5001"}
            if (node, gpu) == ("gpuA", "0"):
                util, power, fb = 80 + i % 11, 400.0 + (i % 7) * 10, 40000 + i
            elif (node, gpu) == ("gpuA", "1"):
                util, power, fb = 0, 70.0, 0
            else:
                util, power, fb = (0 if i < 128 else 50), (75.0 if i < 128 else 300.0), 500
            add("DCGM_FI_DEV_GPU_UTIL", labels, ts, util)
            add("DCGM_FI_DEV_POWER_USAGE", labels, ts, power)
            add("DCGM_FI_DEV_FB_USED", labels, ts, fb)
            if node == "gpuA":
                # mJ; the counter restarts from 0 once (exporter restart)
                energy[gpu] = (energy[gpu] + power * STEP * 1000) if i != 100 else power * STEP * 1000
                add("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", labels, ts, energy[gpu])
        for node in ("gpuA", "gpuB"):
            add("hpcobs_slurm_job_info", {"node": node, "hpc_job": "5001", "user": "alice", "account": "physics",
                                          "partition": "gpu"}, ts, 1)
        # another job on another node: never counted for 5001
        add("DCGM_FI_DEV_GPU_UTIL", {"node": "gpuC", "gpu": "0", "hpc_job": "5002"}, ts, 99)
        add("DCGM_FI_DEV_POWER_USAGE", {"node": "gpuC", "gpu": "0", "hpc_job": "5002"}, ts, 650.0)
        add("hpcobs_slurm_job_info", {"node": "gpuC", "hpc_job": "5002", "user": "bob", "account": "chemistry",
                                      "partition": "gpu"}, ts, 1)
        if 40 <= i < 90:
            add("ALERTS", {"alertname": "HpcobsGpuXidCritical", "alertstate": "firing", "node": "gpuA", "gpu": "1",
                           "hpc_job": "5001", "severity": "critical", "audience": "oncall"}, ts, 1)
    return series


def rule_series():
    """The recording rules over the report period: constant for half-hour stretches."""
    series = {}
    plan = {  # per half hour: (GPUs in use, watts)
        ("physics", "alice", "7001"): [(4, 1600.0), (4, 1500.0), (2, 800.0), (0, 0.0)],
        ("physics", "carol", "7002"): [(1, 300.0), (1, 320.0), (1, 310.0), (1, 305.0)],
        ("chemistry", "bob", "7003"): [(0, 0.0), (2, 900.0), (2, 950.0), (2, 940.0)],
    }
    for i in range(REPORT_START // REPORT_STEP, REPORT_END // REPORT_STEP + 1):
        ts = i * REPORT_STEP
        part = min(3, (ts - REPORT_START) // 1800)
        per_account = {}
        for (account, user, job), values in plan.items():
            gpus, watts = values[part]
            if gpus:
                labels = (("account", account), ("hpc_job", job), ("user", user))
                series.setdefault(("hpc_job:hpcobs_gpus_in_use:count", labels), []).append((ts, gpus))
                series.setdefault(("hpc_job:hpcobs_gpu_power_watts:sum", labels), []).append((ts, watts))
            acc = per_account.setdefault(account, [0, 0.0])
            acc[0] += gpus
            acc[1] += watts
        for account, (gpus, watts) in per_account.items():
            if gpus:
                series.setdefault(("account:hpcobs_gpus_in_use:count", (("account", account),)), []).append((ts, gpus))
                series.setdefault(("account:hpcobs_gpu_power_watts:sum", (("account", account),)), []).append(
                    (ts, watts))
    return series


JOB = job_series()
RULES = rule_series()


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    lines = import_lines(dict(list(JOB.items()) + list(RULES.items())))
    with victoriametrics(tmp_path_factory.mktemp("vm"), lines, ["-retentionPeriod=10y"]) as url:
        yield url


def points(metric, **labels):
    found = [p for (m, ls), p in JOB.items() if m == metric and all(dict(ls).get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (metric, labels)
    return found[0]


# ------------------------------------------------------------------------------------------------ jobstats
@pytest.fixture(scope="module")
def stats(vm):
    return jobstats.collect(jobstats.VictoriaMetrics(vm), "5001", 86400, now=NOW)


def test_jobstats_finds_the_job_its_owner_nodes_and_span(stats):
    assert (stats["user"], stats["account"], stats["partition"]) == ("alice", "physics", "gpu")
    assert stats["nodes"] == ["gpuA", "gpuB"]
    assert stats["start"] == JOB_START and stats["end"] == JOB_START + (JOB_SAMPLES - 1) * STEP
    assert not stats["running"]
    assert [(g["node"], g["gpu"]) for g in stats["gpus"]] == [("gpuA", "0"), ("gpuA", "1"), ("gpuB", "0")]


def test_jobstats_per_gpu_means_and_maxima_match_the_raw_samples(stats):
    for gpu in stats["gpus"]:
        for field, metric in (("utilisation_percent", "DCGM_FI_DEV_GPU_UTIL"), ("power_watts",
                                                                               "DCGM_FI_DEV_POWER_USAGE"),
                              ("memory_used_mib", "DCGM_FI_DEV_FB_USED")):
            values = [v for _, v in points(metric, node=gpu["node"], gpu=gpu["gpu"], hpc_job="5001")]
            assert gpu[field]["mean"] == pytest.approx(sum(values) / len(values)), (gpu["node"], gpu["gpu"], field)
            assert gpu[field]["max"] == max(values)


def test_jobstats_energy_and_gpu_hours_match_the_raw_samples(stats):
    expected_kwh = 0.0
    for node, gpu in (("gpuA", "0"), ("gpuA", "1")):
        counter = points("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", node=node, gpu=gpu)
        increase = sum((b - a) if b >= a else b for (_, a), (_, b) in zip(counter, counter[1:]))
        expected_kwh += increase / 1000 / 3.6e6
    power = points("DCGM_FI_DEV_POWER_USAGE", node="gpuB", gpu="0", hpc_job="5001")
    expected_kwh += sum((t2 - t1) * (a + b) / 2 for (t1, a), (t2, b) in zip(power, power[1:])) / 3.6e6
    assert stats["energy_kwh"] == pytest.approx(expected_kwh, rel=1e-9)
    assert [g["energy_source"] for g in stats["gpus"]] == ["energy counter", "energy counter", "power integral"]
    # the counter path and the power path agree for a GPU that has both (within one sample of the reset)
    gpu_a0 = stats["gpus"][0]
    by_power = jobstats.integrate(points("DCGM_FI_DEV_POWER_USAGE", node="gpuA", gpu="0", hpc_job="5001")) / 3.6e6
    assert gpu_a0["energy_kwh"] == pytest.approx(by_power, rel=0.02)
    assert stats["gpu_hours"] == pytest.approx(3 * (JOB_SAMPLES - 1) * STEP / 3600)


def test_jobstats_alerts_and_verdict(stats):
    assert [(a["alertname"], a["node"], a["gpu"], a["first_seen"]) for a in stats["alerts"]] == [
        ("HpcobsGpuXidCritical", "gpuA", "1", JOB_START + 40 * STEP)]
    idle = {(g["node"], g["gpu"]): g["idle_share"] for g in stats["gpus"]}
    assert idle == {("gpuA", "0"): 0.0, ("gpuA", "1"): 1.0, ("gpuB", "0"): 128 / JOB_SAMPLES}
    assert stats["verdict"].startswith("2 of 3 GPUs idle 90 % of the time (gpuA GPU 1, gpuB GPU 0)")
    assert "1 alert(s) fired during the job: HpcobsGpuXidCritical." in stats["verdict"]


def test_jobstats_command_line_text_json_and_unknown_job(vm):
    run = lambda *args: subprocess.run(["python3", str(FILES / "hpcobs-jobstats"), *args, "--url", vm,  # noqa: E731
                                        "--lookback", "1d"], capture_output=True, text=True, timeout=60)
    out = run("5001")
    assert out.returncode == 0, out.stderr
    assert "Job 5001  user alice  account physics  partition gpu" in out.stdout
    assert "Verdict: 2 of 3 GPUs idle 90 % of the time" in out.stdout
    print(out.stdout)
    as_json = run("5001", "--json")
    assert json.loads(as_json.stdout)["gpu_hours"] == pytest.approx(3 * (JOB_SAMPLES - 1) * STEP / 3600)
    missing = run("999999")
    assert missing.returncode == 2 and "not in the metrics" in missing.stderr
    assert run("1;drop").returncode == 2  # argparse refuses a job id that is not one
    down = subprocess.run(["python3", str(FILES / "hpcobs-jobstats"), "5001", "--url", "http://127.0.0.1:9"],
                          capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and "VictoriaMetrics at http://127.0.0.1:9" in down.stderr


# ------------------------------------------------------------------------------------------------ report
def expected_report():
    """GPU-hours and kWh per account and per user, summed here from the raw recording-rule samples (step x value)."""
    def total(metric, key_of):
        sums = {}
        for (name, labels), pts in RULES.items():
            if name != metric:
                continue
            key = key_of(dict(labels))
            sums[key] = sums.get(key, 0.0) + sum(v * REPORT_STEP for t, v in pts if t > REPORT_START)
        return sums
    return {
        "account_hours": {k: v / 3600 for k, v in total("account:hpcobs_gpus_in_use:count",
                                                        lambda ls: ls["account"]).items()},
        "account_kwh": {k: v / 3.6e6 for k, v in total("account:hpcobs_gpu_power_watts:sum",
                                                       lambda ls: ls["account"]).items()},
        "user_hours": {k: v / 3600 for k, v in total("hpc_job:hpcobs_gpus_in_use:count",
                                                     lambda ls: (ls["account"], ls["user"])).items()},
        "user_kwh": {k: v / 3.6e6 for k, v in total("hpc_job:hpcobs_gpu_power_watts:sum",
                                                    lambda ls: (ls["account"], ls["user"])).items()},
    }


@pytest.fixture(scope="module")
def built(vm):
    factors = {"price_kwh": 0.25, "price_gpu_hour": 1.5, "currency": "EUR", "co2_g_per_kwh": 350.0}
    return report.build(vm, REPORT_START, REPORT_END, factors)


def test_report_sums_match_the_raw_series(built):
    expected = expected_report()
    accounts = {r["account"]: r for r in built["rows"] if r["level"] == "account"}
    users = {(r["account"], r["user"]): r for r in built["rows"] if r["level"] == "user"}
    assert set(accounts) == {"physics", "chemistry"}
    assert set(users) == {("physics", "alice"), ("physics", "carol"), ("chemistry", "bob")}
    for account, row in accounts.items():
        # one sample step of tolerance at the period's edges (integrate's first interval)
        assert row["gpu_hours"] == pytest.approx(expected["account_hours"][account], rel=0.01), account
        assert row["energy_kwh"] == pytest.approx(expected["account_kwh"][account], rel=0.01), account
    for key, row in users.items():
        assert row["gpu_hours"] == pytest.approx(expected["user_hours"][key], rel=0.01), key
        assert row["energy_kwh"] == pytest.approx(expected["user_kwh"][key], rel=0.01), key
        assert row["jobs"] == 1
    # per-user sums add up to the account's
    for account, row in accounts.items():
        mine = [r for k, r in users.items() if k[0] == account]
        assert sum(r["gpu_hours"] for r in mine) == pytest.approx(row["gpu_hours"], rel=0.01)
    assert sum(r["share"] for r in accounts.values()) == pytest.approx(1.0)
    physics = accounts["physics"]
    assert physics["cost"] == pytest.approx(physics["energy_kwh"] * 0.25 + physics["gpu_hours"] * 1.5)
    assert physics["co2e_kg"] == pytest.approx(physics["energy_kwh"] * 0.35)
    # alice: 4 GPUs for 1 h, 2 GPUs for 0.5 h -> 5 GPU-hours
    assert users[("physics", "alice")]["gpu_hours"] == pytest.approx(5.0, rel=0.01)


def test_report_command_line_writes_csv_and_markdown(vm, tmp_path):
    start = datetime.datetime.fromtimestamp(REPORT_START, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M")
    end = datetime.datetime.fromtimestamp(REPORT_END, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M")
    out = subprocess.run(["python3", str(FILES / "hpcobs-report"), "--url", vm, "--start", start, "--end", end,
                          "--price-kwh", "0.25", "--co2-g-per-kwh", "350", "--out-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    print(out.stdout)
    files = sorted(p.name for p in tmp_path.iterdir())
    # the PNG chart is read back in tests/test_report_png.py
    assert len(files) == 3 and [f.rsplit(".", 1)[1] for f in files] == ["csv", "md", "png"]
    rows = list(csv.DictReader((tmp_path / files[0]).open()))
    assert {(r["level"], r["account"], r["user"]) for r in rows} == {
        ("account", "physics", ""), ("account", "chemistry", ""), ("user", "physics", "alice"),
        ("user", "physics", "carol"), ("user", "chemistry", "bob")}
    assert set(rows[0]) == {"level", "account", "user", "jobs", "gpu_hours", "energy_kwh", "share", "cost", "co2e_kg"}
    expected = expected_report()
    physics = next(r for r in rows if r["level"] == "account" and r["account"] == "physics")
    assert float(physics["gpu_hours"]) == pytest.approx(expected["account_hours"]["physics"], rel=0.01)
    markdown = (tmp_path / files[1]).read_text()
    assert markdown == out.stdout and "## Per account" in markdown and "| physics |" in markdown
    assert "CO2e = kWh x 350.0 g/kWh" in markdown


def test_report_refuses_bad_periods_and_factors(vm):
    bad = subprocess.run(["python3", str(FILES / "hpcobs-report"), "--url", vm, "--start", "2026-11-02",
                          "--end", "2026-11-01"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "ends before it starts" in bad.stderr
    negative = subprocess.run(["python3", str(FILES / "hpcobs-report"), "--url", vm, "--price-kwh", "-1"],
                              capture_output=True, text=True, timeout=60)
    assert negative.returncode == 2 and "must not be negative" in negative.stderr


# ------------------------------------------------------------------------------------------------ same sources
def test_the_executive_boards_energy_panel_and_the_report_integrate_the_same_recording_rules():
    """The executive board's accounts panel (its energy, i.e. cost, columns) reads account:hpcobs_gpu_energy_kwh:*,
    which the vmalert role records as integrate(account:hpcobs_gpu_power_watts:sum[w]) / 3.6e6: hpcobs-report's
    energy is that expression over its period, and its GPU-hours integrate the series the board's GPU column reads."""
    board = json.loads((REPO / "roles" / "grafana" / "files" / "dashboards" / "hpcobs-executive.json").read_text())
    panel = [p for p in board["panels"] if p["title"] == "Accounts: GPUs, power and energy"]
    assert len(panel) == 1
    exprs = [t["expr"] for t in panel[0]["targets"]]
    assert "sum by (account) (account:hpcobs_gpu_energy_kwh:increase24h)" in exprs
    assert "sum by (account) (account:hpcobs_gpus_in_use:count)" in exprs
    rules = (REPO / "roles" / "vmalert" / "templates" / "rules" / "hpcobs-energy.yml.j2").read_text()
    recorded = dict(re.findall(r"- record: (\S+)\n\s+expr: (.+)", rules))
    integrand = lambda expr: re.fullmatch(r"(?:sum by \(\w+(?:, \w+)*\) \()?integrate\(([a-z_:]+)\[[^]]+\]\)\)? / "
                                          r"(3\.6e6|3600)", expr).groups()  # noqa: E731
    for rule in ("account:hpcobs_gpu_energy_kwh:increase1h", "account:hpcobs_gpu_energy_kwh:increase24h"):
        assert integrand(recorded[rule]) == integrand(report.QUERIES["account_kwh"]) == (
            "account:hpcobs_gpu_power_watts:sum", "3.6e6")
    assert report.QUERIES["account_gpu_hours"] == \
        "sum by (account) (integrate(account:hpcobs_gpus_in_use:count[{w}s])) / 3600"
    # per job, the board's top-jobs table and the report's per-user rows read the same per-job rules
    assert recorded["hpc_job:hpcobs_gpu_hours:increase24h"] == "integrate(hpc_job:hpcobs_gpus_in_use:count[24h]) / 3600"
    assert "hpc_job:hpcobs_gpus_in_use:count[{w}s]" in report.QUERIES["user_gpu_hours"]
    assert "hpc_job:hpcobs_gpu_power_watts:sum[{w}s]" in report.QUERIES["user_kwh"]
