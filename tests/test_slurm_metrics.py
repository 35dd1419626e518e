"""Unit tests of the slurm_metrics collector (roles/slurm_metrics/files/hpcobs-slurm-metrics).

tests/data/slurm/<version>/ holds the output of the collector's commands captured on the lab's real controllers
(Slurm 22.05 on Debian 12, 24.11 on Debian 13; `molecule/slurm/tests/test_slurm_metrics.py` writes them, run as the
collector's user) while one job ran with 3 GPUs, one waited for GPUs and a node was drained with a reason, together
with sinfo's and squeue's own view of that moment (sinfo.txt, squeue.txt). The collector's rendering of the captured
output is compared with that view, and checked by the real `promtool check metrics`.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from tooling import tool

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "roles" / "slurm_metrics" / "files" / "hpcobs-slurm-metrics"
DATA = REPO / "tests" / "data" / "slurm"
VERSIONS = sorted(p.name for p in DATA.iterdir() if p.is_dir())
COMMAND_FILES = ["nodes", "partitions", "jobs", "sdiag", "ping"]


def load_collector():
    loader = importlib.machinery.SourceFileLoader("hpcobs_slurm_metrics", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


collector = load_collector()


def parse_exposition(text):
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
        assert match, line
        labels = tuple(sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or "")))
        key = (match.group(1), labels)
        assert key not in samples, "duplicate series %s" % (key,)
        samples[key] = float(match.group(3))
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


def captured(version):
    return {key: (DATA / version / ("%s.txt" % key)).read_text() for key in COMMAND_FILES}


def sinfo_view(version):
    nodes = {}
    for line in (DATA / version / "sinfo.txt").read_text().splitlines():
        name, state, gres, reason = line.split("|", 3)
        # sinfo prints "none" for a node without a reason
        reason = "" if reason.strip() == "none" else reason.strip()
        nodes[name] = {"state": state.rstrip("*~#!%$@^-"), "gres": gres, "reason": reason}
    return nodes


def squeue_view(version):
    jobs = []
    for line in (DATA / version / "squeue.txt").read_text().splitlines():
        job, state, user, account, partition, tres, cpus, nodes = line.split("|")
        gpus = re.search(r"gpu:(?:[^:,]+:)?(\d+)", tres)
        jobs.append({"job": job, "state": state, "user": user, "account": account, "partition": partition,
                     "gpus": int(gpus.group(1)) if gpus else 0, "cpus": int(cpus), "nodes": int(nodes)})
    return jobs


@pytest.fixture(scope="module", params=VERSIONS)
def version(request):
    return request.param


@pytest.fixture(scope="module")
def rendered(version):
    return collector.render(captured(version), "full")


def test_captures_cover_both_lab_versions():
    assert VERSIONS == ["22.05", "24.11"]
    for version in VERSIONS:
        assert (DATA / version / "version.txt").read_text().split()[1].startswith(version)


def test_output_passes_promtool(rendered):
    result = subprocess.run([str(tool("promtool")), "check", "metrics"], input=rendered, capture_output=True,
                            text=True, timeout=60)
    # promtool's lint only complains about naming (counters without _total, units); names are Slurm's own
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if line.strip() and "counter metrics should have" not in line and "should have" not in line]
    assert result.returncode in (0, 3) and not problems, result.stdout + result.stderr


def test_every_command_counts_as_working(rendered):
    samples = parse_exposition(rendered)
    for key in COMMAND_FILES:
        assert value(samples, "hpcobs_slurm_collector_success", command=key) == 1, key


def test_node_state_reason_and_gpus_match_sinfo(version, rendered):
    samples = parse_exposition(rendered)
    view = sinfo_view(version)
    assert value(samples, "slurm_nodes") == len(view) == 2
    states = Counter()
    for name, node in view.items():
        assert value(samples, "hpcobs_slurm_node_state_info", node=name, state=node["state"],
                     reason=node["reason"]) == 1, (name, node)
        assert [k for k in samples if k[0] == "hpcobs_slurm_node_state_info" and ("node", name) in k[1]], name
        gpus = re.search(r"gpu:(?:[^:,(]+:)?(\d+)", node["gres"])
        assert value(samples, "slurm_node_gpus", node=name) == int(gpus.group(1))
        states[node["state"]] += 1
    # the capture has one drained node, with the reason the test set
    assert states["drained"] == 1
    drained = [n for n in view.values() if n["state"] == "drained"][0]
    assert drained["reason"] == "hpcobs capture: GPU 1 XID 79"
    assert value(samples, "slurm_nodes_drain") == 1
    assert value(samples, "slurm_nodes_drained") == 1
    assert value(samples, "slurm_nodes_draining") == 0
    assert value(samples, "slurm_nodes_mixed") == states["mixed"] == 1


def test_job_counts_and_gpu_allocation_match_squeue(version, rendered):
    samples = parse_exposition(rendered)
    jobs = squeue_view(version)
    by_state = Counter(j["state"] for j in jobs)
    assert value(samples, "slurm_jobs") == len(jobs)
    assert value(samples, "slurm_jobs_running") == by_state["RUNNING"] >= 1
    assert value(samples, "slurm_jobs_pending") == by_state["PENDING"] >= 1
    running = [j for j in jobs if j["state"] == "RUNNING"]
    assert value(samples, "slurm_jobs_gpus_alloc") == sum(j["gpus"] for j in running) == 3
    assert value(samples, "slurm_jobs_cpus_alloc") == sum(j["cpus"] for j in running)
    assert value(samples, "slurm_jobs_nodes_alloc") == sum(j["nodes"] for j in running)
    for account in {j["account"] for j in jobs}:
        mine = [j for j in jobs if j["account"] == account]
        assert value(samples, "slurm_account_jobs", account=account) == len(mine)
        assert value(samples, "slurm_account_jobs_pending", account=account) == sum(
            j["state"] == "PENDING" for j in mine)
        assert value(samples, "slurm_account_jobs_gpus_alloc", account=account) == sum(
            j["gpus"] for j in mine if j["state"] == "RUNNING")
    for user in {j["user"] for j in jobs}:
        mine = [j for j in jobs if j["user"] == user]
        assert value(samples, "slurm_user_jobs_running", username=user) == sum(j["state"] == "RUNNING" for j in mine)
    # per node: the running job's GPUs are on the node squeue names
    assert sum(v for k, v in samples.items() if k[0] == "slurm_node_gpus_alloc") == 3
    assert value(samples, "slurm_partition_jobs_gpus_alloc", partition="gpu") == 3
    assert value(samples, "slurm_partition_jobs_pending", partition="gpu") == by_state["PENDING"]
    assert value(samples, "slurm_partition_gpus", partition="gpu") == 8


def test_scheduler_statistics_match_sdiag(version, rendered):
    samples = parse_exposition(rendered)
    text = captured(version)["sdiag"]
    main = text.split("Main schedule statistics", 1)[1].split("Backfilling stats", 1)[0]
    backfill = text.split("Backfilling stats", 1)[1]

    def field(section, label):
        return int(re.search(r"^\s+%s:\s+(\d+)" % re.escape(label), section, re.M).group(1))
    assert value(samples, "slurm_schedule_cycle_cnt") == field(main, "Total cycles") >= 1
    assert value(samples, "slurm_schedule_cycle_last") == field(main, "Last cycle")
    assert value(samples, "slurm_schedule_cycle_max") == field(main, "Max cycle")
    assert value(samples, "slurm_bf_cycle_cnt") == field(backfill, "Total cycles")
    assert value(samples, "slurm_server_thread_cnt") == int(re.search(r"^Server thread count:\s+(\d+)", text,
                                                                      re.M).group(1))
    assert value(samples, "slurm_sdiag_jobs_submitted") == int(re.search(r"^Jobs submitted:\s+(\d+)", text,
                                                                         re.M).group(1))


def test_controller_ping(version, rendered):
    samples = parse_exposition(rendered)
    controller = re.search(r"Slurmctld\(primary\) at (\S+) is UP", captured(version)["ping"]).group(1)
    assert value(samples, "hpcobs_slurm_controller_up", controller=controller, role="primary") == 1


def test_extras_mode_serves_only_hpcobs_series(version):
    samples = parse_exposition(collector.render(captured(version), "extras"))
    names = {k[0] for k in samples}
    assert names and all(name.startswith("hpcobs_slurm_") for name in names)
    assert "hpcobs_slurm_node_state_info" in names and "hpcobs_slurm_controller_up" in names
    assert value(samples, "hpcobs_slurm_collector_success", command="jobs") is None


def test_a_failed_command_is_reported_and_the_rest_kept(version):
    outputs = captured(version)
    outputs["jobs"] = None
    samples = parse_exposition(collector.render(outputs, "full"))
    assert value(samples, "hpcobs_slurm_collector_success", command="jobs") == 0
    assert value(samples, "slurm_nodes") == 2
    assert value(samples, "slurm_jobs") is None


def test_cli_parse_renders_the_same_as_the_library(version, tmp_path):
    args = ["parse"]
    for key in COMMAND_FILES:
        args += ["--%s" % key, str(DATA / version / ("%s.txt" % key))]
    result = subprocess.run(["python3", str(SCRIPT)] + args, capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout == collector.render(captured(version), "full")


# --- parsing details, on literal lines ---------------------------------------------------------------------------

def test_oneliner_values_with_spaces_and_no_records():
    records = collector.parse_oneliner(
        "NodeName=n1 Arch=x86_64 State=DOWN+DRAIN+NOT_RESPONDING OS=Linux 6.1.0 #1 SMP "
        "CfgTRES=cpu=4,gres/gpu=2 Reason=fan failed, replace [root@2026-12-01T08:00:00]\n")
    assert records == [{"NodeName": "n1", "Arch": "x86_64", "State": "DOWN+DRAIN+NOT_RESPONDING",
                        "OS": "Linux 6.1.0 #1 SMP", "CfgTRES": "cpu=4,gres/gpu=2",
                        "Reason": "fan failed, replace [root@2026-12-01T08:00:00]"}]
    assert collector.parse_oneliner("No jobs in the system\n") == []


@pytest.mark.parametrize("raw,expected", [
    ("IDLE", "idle"), ("MIXED", "mixed"), ("ALLOCATED", "allocated"), ("IDLE+DRAIN", "drained"),
    ("MIXED+DRAIN", "draining"), ("DOWN+DRAIN", "down"), ("IDLE+FAIL", "fail"), ("ALLOCATED+FAIL", "failing"),
    ("DOWN*", "down"), ("IDLE+COMPLETING+DRAIN", "draining"), ("IDLE+MAINTENANCE+RESERVED", "maint"),
])
def test_state_words_as_sinfo_spells_them(raw, expected):
    assert collector.sinfo_state(*collector.node_state(raw)) == expected


def test_tres_units_and_typed_gpus():
    tres = collector.parse_tres("cpu=8,mem=16G,node=1,billing=8,gres/gpu=4,gres/gpu:a100=4")
    assert tres["mem"] == 16 << 30 and tres["gres/gpu"] == 4 and tres["gres/gpu:a100"] == 4
    assert collector.parse_tres("mem=500M")["mem"] == 500 << 20
    assert collector.parse_tres("") == {}


def test_ping_with_a_backup_down():
    text = "Slurmctld(primary) at ctl1 is UP\nSlurmctld(backup) at ctl2 is DOWN\n"
    assert collector.parse_ping(text) == [("ctl1", "primary", 1), ("ctl2", "backup", 0)]


def test_label_values_are_escaped():
    text = collector.render({"nodes": 'NodeName=n1 State=IDLE+DRAIN Reason=say "hi" \\ bye [a@b]\n'}, "extras")
    assert 'reason="say \\"hi\\" \\\\ bye"' in text
