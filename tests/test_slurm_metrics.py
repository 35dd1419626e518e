"""Unit tests of the slurm_metrics collector (roles/slurm_metrics/files/hpcobs-slurm-metrics), on command output
captured on the lab's real Slurm.

tests/data/slurm/<version>/ (22.05: Debian 12, 24.11: Debian 13) holds what the slurm scenario
(molecule/slurm/tests/test_slurm_metrics.py) saved on each real controller, run as the collector's user while one job
held 3 GPUs, one waited and a node was drained with a reason: the output of the collector's commands (nodes.txt,
partitions.txt, jobs.txt, sdiag.txt, ping.txt) and, from the same moment, Slurm's own views (sinfo.txt: `sinfo -h -N
-o '%N|%T|%G|%E'`, squeue.txt: `squeue -h -t all -o '%i|%T|%u|%a|%P|%b|%C|%D'`, version.txt). The expectations are
computed from sinfo's and squeue's views, never typed in. A few literal lines remain, each for a case no capture
shows (said at the test).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
from exposition import parse_exposition, value
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


# --- command output captured on the lab's real Slurm ------------------------------------------------------------

CAPTURES = REPO / "tests" / "data" / "slurm"
VERSIONS = sorted(p.name for p in CAPTURES.iterdir() if p.is_dir()) if CAPTURES.is_dir() else []


def test_captures_of_both_lab_versions_are_committed():
    assert VERSIONS == ["22.05", "24.11"]
    for version in VERSIONS:
        assert (CAPTURES / version / "version.txt").read_text().split()[1].startswith(version)


def captured(version):
    return {key: (CAPTURES / version / ("%s.txt" % key)).read_text(encoding="utf-8")
            for key in ("nodes", "partitions", "jobs", "sdiag", "ping", "sinfo", "squeue")}


def sinfo_view(text):
    """sinfo -N -o '%N|%T|%G|%E' -> {node: (state, gpus, reason)} (a node in several partitions: once)."""
    nodes = {}
    for line in text.splitlines():
        if line.strip():
            node, state, gres, reason = line.split("|", 3)
            gpus = sum(int(n) for n in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", gres))
            nodes[node] = (state.rstrip("*~#!%$@^-"), gpus, "" if reason == "none" else reason)
    return nodes


def squeue_view(text):
    """squeue -t all -o '%i|%T|%u|%a|%P|%b|%C|%D' -> [{id, state, user, account, partition, gpus, cpus, nodes}]
    (%b, the GPUs per node, spells gres/gpu:N in 24.11 and gpu:N in 22.05)."""
    jobs = []
    for line in text.splitlines():
        if line.strip():
            job, state, user, account, partition, per_node, cpus, nodes = line.split("|")
            per = sum(int(n) for n in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", per_node))
            jobs.append({"id": job, "state": state, "user": user, "account": account, "partition": partition,
                         "gpus": per * int(nodes), "cpus": int(cpus), "nodes": int(nodes)})
    return jobs


@pytest.fixture(params=VERSIONS)
def capture(request):
    outputs = captured(request.param)
    return {"version": request.param, "outputs": outputs,
            "samples": parse_exposition(collector.render(outputs, "full")),
            "sinfo": sinfo_view(outputs["sinfo"]), "squeue": squeue_view(outputs["squeue"])}


def test_capture_nodes_match_sinfo(capture):
    samples, sinfo = capture["samples"], capture["sinfo"]
    assert value(samples, "slurm_nodes") == len(sinfo) == 2
    states = {dict(k[1])["node"]: (dict(k[1])["state"], dict(k[1])["reason"])
              for k in samples if k[0] == "hpcobs_slurm_node_state_info"}
    assert states == {node: (state, reason) for node, (state, _, reason) in sinfo.items()}
    # the capture was taken with one node drained (with a reason) and a job on the other
    assert sorted(state for state, _ in states.values()) == ["drained", "mixed"]
    assert all(reason for state, reason in states.values() if state == "drained")
    for node, (state, gpus, _) in sinfo.items():
        assert value(samples, "slurm_node_gpus", node=node) == gpus == 4
    assert value(samples, "slurm_nodes_drain") == value(samples, "slurm_nodes_drained") == sum(
        1 for state, _, _ in sinfo.values() if state == "drained")
    assert value(samples, "slurm_nodes_mixed") == sum(1 for state, _, _ in sinfo.values() if state == "mixed")


def test_capture_jobs_match_squeue(capture):
    samples, jobs = capture["samples"], capture["squeue"]
    by_state = {}
    for job in jobs:
        by_state[job["state"]] = by_state.get(job["state"], 0) + 1
    assert value(samples, "slurm_jobs") == len(jobs)
    assert value(samples, "slurm_jobs_running") == by_state.get("RUNNING", 0) >= 1
    assert value(samples, "slurm_jobs_pending") == by_state.get("PENDING", 0) >= 1
    running = [j for j in jobs if j["state"] == "RUNNING"]
    assert value(samples, "slurm_jobs_gpus_alloc") == sum(j["gpus"] for j in running) >= 3
    assert value(samples, "slurm_jobs_cpus_alloc") == sum(j["cpus"] for j in running)
    for key, label, metric in (("account", "account", "slurm_account_jobs"), ("user", "username", "slurm_user_jobs")):
        for name in {j[key] for j in jobs}:
            mine = [j for j in jobs if j[key] == name]
            assert value(samples, metric, **{label: name}) == len(mine), (metric, name)
            assert value(samples, metric + "_running", **{label: name}) == sum(
                1 for j in mine if j["state"] == "RUNNING"), (metric, name)
            assert value(samples, metric + "_pending", **{label: name}) == sum(
                1 for j in mine if j["state"] == "PENDING"), (metric, name)
            assert value(samples, metric + "_gpus_alloc", **{label: name}) == sum(
                j["gpus"] for j in mine if j["state"] == "RUNNING"), (metric, name)
    for partition in {j["partition"] for j in jobs}:
        mine = [j for j in jobs if j["partition"] == partition]
        assert value(samples, "slurm_partition_jobs", partition=partition) == len(mine)
        assert value(samples, "slurm_partition_jobs_pending", partition=partition) == sum(
            1 for j in mine if j["state"] == "PENDING")
        assert value(samples, "slurm_partition_jobs_gpus_alloc", partition=partition) == sum(
            j["gpus"] for j in mine if j["state"] == "RUNNING")


def test_capture_gpus_allocated_per_node_add_up_to_the_running_jobs(capture):
    samples, sinfo = capture["samples"], capture["sinfo"]
    per_node = {node: value(samples, "slurm_node_gpus_alloc", node=node) for node in sinfo}
    running = [j for j in capture["squeue"] if j["state"] == "RUNNING"]
    assert sum(per_node.values()) == sum(j["gpus"] for j in running)
    # the drained node holds none, the mixed one all of them
    for node, (state, _, _) in sinfo.items():
        assert (per_node[node] > 0) == (state == "mixed"), (node, state, per_node)
    assert value(samples, "slurm_partition_gpus", partition="gpu") == sum(g for _, g, _ in sinfo.values())
    assert value(samples, "slurm_partition_nodes", partition="gpu") == len(sinfo)
    assert value(samples, "slurm_partition_nodes_drained", partition="gpu") == 1


def test_capture_scheduler_and_controller(capture):
    samples, outputs = capture["samples"], capture["outputs"]
    sdiag = outputs["sdiag"]
    for label, metric in (("Server thread count", "slurm_server_thread_cnt"),
                          ("Jobs submitted", "slurm_sdiag_jobs_submitted")):
        assert value(samples, metric) == int(re.search(r"^%s:\s+(\d+)" % label, sdiag, re.M).group(1))
    main = sdiag.split("Main schedule statistics")[1].split("\n\n")[0]
    assert value(samples, "slurm_schedule_cycle_cnt") == int(re.search(r"Total cycles:\s+(\d+)", main).group(1))
    assert value(samples, "slurm_schedule_cycle_last") == int(re.search(r"Last cycle:\s+(\d+)", main).group(1))
    controller = re.search(r"Slurmctld\(primary\) at (\S+) is UP", outputs["ping"]).group(1)
    assert value(samples, "hpcobs_slurm_controller_up", controller=controller, role="primary") == 1
    for key in ("nodes", "partitions", "jobs", "sdiag", "ping"):
        assert value(samples, "hpcobs_slurm_collector_success", command=key) == 1


def test_capture_renders_for_promtool_and_through_the_cli(capture, tmp_path):
    text = collector.render({k: capture["outputs"][k] for k in ("nodes", "partitions", "jobs", "sdiag", "ping")},
                            "full")
    result = subprocess.run([str(tool("promtool")), "check", "metrics"], input=text, capture_output=True, text=True,
                            timeout=60)
    # promtool's lint only objects to names (counters without _total): the names are Slurm's own
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()
                and "should have" not in line and "counter" not in line]
    assert result.returncode in (0, 3) and not problems, result.stdout + result.stderr
    args = ["parse"]
    for key in ("nodes", "partitions", "jobs", "sdiag", "ping"):
        args += ["--%s" % key, str(CAPTURES / capture["version"] / ("%s.txt" % key))]
    cli = subprocess.run(["python3", str(SCRIPT)] + args, capture_output=True, text=True, timeout=60, check=True)
    assert cli.stdout == text


def test_capture_extras_mode_keeps_only_the_hpcobs_series(capture):
    samples = parse_exposition(collector.render(capture["outputs"], "extras"))
    assert {k[0] for k in samples} == {"hpcobs_slurm_node_state_info", "hpcobs_slurm_controller_up",
                                       "hpcobs_slurm_collector_success"}
    assert len([k for k in samples if k[0] == "hpcobs_slurm_node_state_info"]) == len(capture["sinfo"])


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


def test_a_reason_only_for_a_node_out_of_service():
    # Literal: Slurm 24.11 keeps Reason= on a node resumed from a drain (seen on the slurm scenario's real Slurm);
    # sinfo -R lists no such node, and neither does the state series carry that reason
    nodes = ("NodeName=n1 State=IDLE Reason=old drain [root@2026-12-01T13:00:00]\n"
             "NodeName=n2 State=MIXED+DRAIN Reason=XID 79 [root@2026-12-01T13:00:00]\n"
             "NodeName=n3 State=DOWN* Reason=Not responding [slurm@2026-12-01T13:00:00]\n")
    samples = parse_exposition(collector.render({"nodes": nodes}, "extras"))
    assert value(samples, "hpcobs_slurm_node_state_info", node="n1", state="idle", reason="") == 1
    assert value(samples, "hpcobs_slurm_node_state_info", node="n2", state="draining", reason="XID 79") == 1
    assert value(samples, "hpcobs_slurm_node_state_info", node="n3", state="down", reason="Not responding") == 1


def test_free_memory_not_known_is_left_out():
    # Literal: every node of the captures reports FreeMem; a node whose slurmd has not reported yet says N/A
    samples = parse_exposition(collector.render(
        {"nodes": "NodeName=n1 State=IDLE RealMemory=15000 AllocMem=0 FreeMem=N/A CfgTRES=cpu=8\n"}, "full"))
    assert value(samples, "slurm_node_memory_bytes", node="n1") == 15000 << 20
    assert value(samples, "slurm_node_memory_free_bytes", node="n1") is None


@pytest.mark.parametrize("version", VERSIONS)
def test_a_failed_command_is_reported_and_its_series_left_out(version):
    outputs = captured(version)
    failed = parse_exposition(collector.render(dict(outputs, jobs=None), "full"))
    assert value(failed, "hpcobs_slurm_collector_success", command="jobs") == 0
    assert value(failed, "slurm_nodes") == 2 and value(failed, "slurm_jobs") is None
    assert value(failed, "hpcobs_slurm_collector_success", command="nodes") == 1


# Literal: the lab's captures have untyped GPUs, one-node jobs and no gres/gpu TRES; sites may have all three.
@pytest.mark.parametrize("text,gpus", [
    ("gpu:4", 4), ("gpu:a100:2(S:0-1),gpu:v100:2(S:1)", 4), ("gres/gpu:3", 3), ("gres:gpu:3", 3),
    ("gres/gpu:a100:8", 8), ("cpu=1", 0), ("(null)", 0), ("", 0), ("gres/mps:100", 0),
])
def test_gpus_in_gres_strings(text, gpus):
    assert collector.gres_gpus(text) == gpus


def test_hostlists_expand_as_slurm_prints_them():
    assert collector.expand_hostlist("gpu[01-03,7],login1") == ["gpu01", "gpu02", "gpu03", "gpu7", "login1"]
    assert collector.expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    assert collector.expand_hostlist("(null)") == [] and collector.expand_hostlist("") == []


def test_gpus_of_a_two_node_job_without_gres_tres_are_counted_on_both_nodes():
    nodes = ("NodeName=g1 Gres=gpu:4 State=ALLOCATED Partitions=gpu CfgTRES=cpu=8 AllocTRES=cpu=8\n"
             "NodeName=g2 Gres=gpu:4 State=MIXED Partitions=gpu CfgTRES=cpu=8 AllocTRES=cpu=2\n")
    jobs = ("JobId=7 UserId=alice(2101) Account=physics JobState=RUNNING Partition=gpu NodeList=g[1-2] NumNodes=2 "
            "NumCPUs=10 AllocTRES=cpu=10,node=2 TresPerNode=gres/gpu:2\n"
            "JobId=8 UserId=bob(2102) Account=chemistry JobState=RUNNING Partition=gpu NodeList=g1 NumNodes=1 "
            "NumCPUs=1 NumTasks=2 AllocTRES=cpu=1,node=1 TresPerTask=gres/gpu:1\n")
    samples = parse_exposition(collector.render(
        {"nodes": nodes, "jobs": jobs, "partitions": "PartitionName=gpu TotalNodes=2 TRES=cpu=16,node=2\n"}, "full"))
    assert value(samples, "slurm_node_gpus_alloc", node="g1") == 4 and value(
        samples, "slurm_node_gpus_alloc", node="g2") == 2
    assert value(samples, "slurm_jobs_gpus_alloc") == 6 and value(samples, "slurm_partition_gpus", partition="gpu") == 8
    assert value(samples, "slurm_account_jobs_gpus_alloc", account="chemistry") == 2
