"""Unit tests of the slurm_metrics collector (roles/slurm_metrics/files/hpcobs-slurm-metrics): its parsing of
scontrol/sdiag lines and its exposition format.

The tests against command output captured on the lab's real Slurm (22.05 and 24.11, written by the slurm scenario
into .cache/slurm-capture/<cluster>/) come with those captures in tests/data/slurm/<version>/.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
from tooling import tool

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "roles" / "slurm_metrics" / "files" / "hpcobs-slurm-metrics"


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


# Lines in the shape `scontrol --oneliner` and `sdiag` print them (shortened: fields the collector does not read left
# out). Not a capture: the tests against real captured output come with tests/data/slurm/.
NODES = (
    "NodeName=gpu1 Arch=x86_64 CoresPerSocket=4 CPUAlloc=1 CPUEfctv=8 CPUTot=8 CPULoad=0.10 Gres=gpu:4 "
    "RealMemory=15000 AllocMem=0 FreeMem=9000 State=MIXED Partitions=gpu CfgTRES=cpu=8,mem=15000M,billing=8,"
    "gres/gpu=4 AllocTRES=cpu=1,gres/gpu=3\n"
    "NodeName=gpu2 Arch=x86_64 CoresPerSocket=4 CPUAlloc=0 CPUEfctv=8 CPUTot=8 Gres=gpu:4 RealMemory=15000 "
    "AllocMem=0 FreeMem=N/A State=IDLE+DRAIN Partitions=gpu CfgTRES=cpu=8,mem=15000M,billing=8,gres/gpu=4 "
    "AllocTRES= Reason=GPU 1 XID 79 [root@2026-12-01T08:00:00]\n")
PARTITIONS = "PartitionName=gpu Default=YES State=UP TotalCPUs=16 TotalNodes=2 TRES=cpu=16,mem=30000M,node=2,gres/gpu=8\n"
JOBS = (
    "JobId=11 JobName=a UserId=alice(2101) GroupId=alice(2101) Priority=1 Account=physics JobState=RUNNING "
    "Reason=None Partition=gpu NodeList=gpu1 NumNodes=1 NumCPUs=1 TRES=cpu=1,mem=500M,node=1,billing=1,gres/gpu=3 "
    "Command=(null) WorkDir=/tmp\n"
    "JobId=12 JobName=b UserId=bob(2102) GroupId=bob(2102) Priority=1 Account=chemistry JobState=PENDING "
    "Reason=Resources Partition=gpu NumNodes=1 NumCPUs=1 TRES=cpu=1,node=1,billing=1,gres/gpu=2\n"
    "JobId=10 JobName=c UserId=alice(2101) Account=physics JobState=COMPLETED Reason=None Partition=gpu NumNodes=1 "
    "NumCPUs=1 TRES=cpu=1,node=1,billing=1,gres/gpu=1\n")
SDIAG = """*******************************************************
sdiag output at Tue Dec 01 08:00:00 2026 (1796112000)
*******************************************************
Server thread count:  3
Agent queue size:     0
DBD Agent queue size: 0

Jobs submitted: 7
Jobs started:   5

Main schedule statistics (microseconds):
\tLast cycle:   412
\tMax cycle:    2210
\tTotal cycles: 31
\tLast queue length: 1

Main scheduler exit:
\tEnd of job queue:31

Backfilling stats
\tTotal backfilled jobs (since last slurm start): 2
\tTotal cycles: 9
\tLast cycle when: Tue Dec 01 07:59:30 2026 (1796111970)
\tLast cycle: 1500
\tMax cycle:  4100
"""
PING = "Slurmctld(primary) at ctl1 is UP\n"
OUTPUTS = {"nodes": NODES, "partitions": PARTITIONS, "jobs": JOBS, "sdiag": SDIAG, "ping": PING}


def test_rendering_of_nodes_jobs_partitions_and_scheduler():
    samples = parse_exposition(collector.render(OUTPUTS, "full"))
    assert value(samples, "slurm_nodes") == 2
    assert value(samples, "hpcobs_slurm_node_state_info", node="gpu2", state="drained", reason="GPU 1 XID 79") == 1
    assert value(samples, "hpcobs_slurm_node_state_info", node="gpu1", state="mixed", reason="") == 1
    assert (value(samples, "slurm_nodes_drain"), value(samples, "slurm_nodes_drained"),
            value(samples, "slurm_nodes_idle"), value(samples, "slurm_nodes_mixed")) == (1, 1, 1, 1)
    assert value(samples, "slurm_node_gpus_alloc", node="gpu1") == 3
    assert value(samples, "slurm_node_gpus", node="gpu2") == 4
    assert value(samples, "slurm_node_memory_bytes", node="gpu1") == 15000 << 20
    assert value(samples, "slurm_node_memory_free_bytes", node="gpu2") is None  # N/A
    assert value(samples, "slurm_node_cpus_idle", node="gpu1") == 7
    assert (value(samples, "slurm_jobs"), value(samples, "slurm_jobs_running"), value(samples, "slurm_jobs_pending"),
            value(samples, "slurm_jobs_completed"), value(samples, "slurm_jobs_finished")) == (3, 1, 1, 1, 1)
    # only jobs holding resources count as allocated
    assert value(samples, "slurm_jobs_gpus_alloc") == 3 and value(samples, "slurm_jobs_memory_alloc") == 500 << 20
    assert value(samples, "slurm_account_jobs_gpus_alloc", account="physics") == 3
    assert value(samples, "slurm_account_jobs_pending", account="chemistry") == 1
    assert value(samples, "slurm_user_jobs", username="alice") == 2
    assert value(samples, "slurm_partition_gpus", partition="gpu") == 8
    assert value(samples, "slurm_partition_jobs_gpus_alloc", partition="gpu") == 3
    assert value(samples, "slurm_partition_jobs_pending", partition="gpu") == 1
    assert value(samples, "slurm_partition_nodes_drained", partition="gpu") == 1
    assert (value(samples, "slurm_schedule_cycle_last"), value(samples, "slurm_schedule_cycle_max"),
            value(samples, "slurm_schedule_cycle_cnt"), value(samples, "slurm_schedule_queue_len")) == (412, 2210, 31, 1)
    assert (value(samples, "slurm_bf_cycle_last"), value(samples, "slurm_bf_cycle_cnt"),
            value(samples, "slurm_bf_when_last_cycle"), value(samples, "slurm_backfilled_jobs")) == (
        1500, 9, 1796111970, 2)
    assert value(samples, "slurm_server_thread_cnt") == 3 and value(samples, "slurm_sdiag_jobs_submitted") == 7
    assert value(samples, "hpcobs_slurm_controller_up", controller="ctl1", role="primary") == 1
    for key in OUTPUTS:
        assert value(samples, "hpcobs_slurm_collector_success", command=key) == 1


def test_rendering_passes_promtool():
    result = subprocess.run([str(tool("promtool")), "check", "metrics"], input=collector.render(OUTPUTS, "full"),
                            capture_output=True, text=True, timeout=60)
    # promtool's lint only objects to names (counters without _total): the names are Slurm's own
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()
                and "should have" not in line and "counter" not in line]
    assert result.returncode in (0, 3) and not problems, result.stdout + result.stderr


def test_extras_mode_and_a_failed_command():
    samples = parse_exposition(collector.render(OUTPUTS, "extras"))
    assert {k[0] for k in samples} <= {"hpcobs_slurm_node_state_info", "hpcobs_slurm_controller_up",
                                       "hpcobs_slurm_collector_success"}
    assert value(samples, "hpcobs_slurm_collector_success", command="jobs") is None
    failed = parse_exposition(collector.render(dict(OUTPUTS, jobs=None), "full"))
    assert value(failed, "hpcobs_slurm_collector_success", command="jobs") == 0
    assert value(failed, "slurm_nodes") == 2 and value(failed, "slurm_jobs") is None


def test_cli_parse_renders_the_same_as_the_library(tmp_path):
    args = ["parse"]
    for key, text in OUTPUTS.items():
        (tmp_path / key).write_text(text)
        args += ["--%s" % key, str(tmp_path / key)]
    result = subprocess.run(["python3", str(SCRIPT)] + args, capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout == collector.render(OUTPUTS, "full")
