"""The deploy benchmark's bookkeeping (bench/deploy.py, bench/plot.py): what it reads from a run and what it reports.

The benchmark itself needs podman and minutes per node (make bench-deploy, make bench-deploy-smoke); these tests
check, on recorded output, the figures it derives: tasks per host and changed tasks from the recap, the inventory
it hands to ansible-playbook, and the table and plots of bench/plot.py.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def load(name):
    spec = importlib.util.spec_from_file_location("bench_" + name, REPO / "bench" / (name + ".py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


deploy = load("deploy")
plot = load("plot")

RECAP = """
PLAY RECAP *********************************************************************
bench-mgmt                 : ok=6    changed=0    unreachable=0    failed=0    skipped=0    rescued=0    ignored=0
gpu001                     : ok=238  changed=3    unreachable=0    failed=0    skipped=116  rescued=0    ignored=0
gpu002                     : ok=225  changed=0    unreachable=0    failed=1    skipped=128  rescued=0    ignored=0
gpu003                     : ok=12   changed=0    unreachable=1    failed=0    skipped=2    rescued=0    ignored=0
localhost                  : ok=40   changed=9    unreachable=0    failed=0    skipped=1    rescued=0    ignored=0
"""


def test_the_recap_gives_tasks_per_host_changed_tasks_and_failed_hosts_of_the_gpu_nodes_only():
    figures = deploy.recap_figures(RECAP, gpu_nodes=lambda name: name.startswith("gpu"))
    assert figures == {"hosts": 3, "tasks_per_host": 354, "ok_per_host": 238, "changed": 3,
                       "failed_hosts": ["gpu002", "gpu003"]}


def test_no_recap_is_no_hosts():
    assert deploy.recap_figures("ERROR! the playbook could not be read", gpu_nodes=lambda name: True)["hosts"] == 0


@pytest.mark.parametrize("connection", ["ssh", "nsenter"])
def test_the_inventory_reaches_the_nodes_as_asked_and_runs_the_simulator(tmp_path, connection):
    path = tmp_path / "inventory.json"
    deploy.write_inventory(path, {"gpu001": "10.89.0.2", "gpu002": "10.89.0.3"}, tmp_path / "key", connection,
                           tmp_path / "pki")
    inventory = json.loads(path.read_text())["all"]
    nodes = inventory["children"]["gpu_nodes"]["hosts"]
    assert sorted(nodes) == ["gpu001", "gpu002"]
    assert inventory["vars"]["lab_gpu_simulator_enabled"] is True
    assert inventory["vars"]["hpcobs_pki_dir"] == str(tmp_path / "pki")
    assert "management" in inventory["children"]  # the log shipper's Loki and the scrape side name one
    if connection == "ssh":
        assert nodes["gpu001"] == {"ansible_host": "10.89.0.2"}
        assert inventory["vars"]["ansible_ssh_private_key_file"] == str(tmp_path / "key")
        assert "ansible_connection" not in inventory["vars"]
    else:
        assert nodes["gpu001"] == {"ansible_host": deploy.PREFIX + "gpu001"}
        assert inventory["vars"]["ansible_connection"] == "hpcobs_nsenter"


def run_record(nodes, play, converge, rerun, rc=0, changed=0):
    figures = {"rc": rc, "cpu_s": 10.0 * nodes, "peak_rss_mib": 100, "tasks_per_host": 300, "changed": 0}
    return {"nodes": nodes, "connection": "ssh", "play": play, "run": 1,
            "converge": dict(figures, wall_s=converge), "rerun": dict(figures, wall_s=rerun, changed=changed),
            "rerun_ratio": round(rerun / converge, 2)}


def test_the_table_spreads_repeated_runs_and_leaves_out_failed_ones():
    results = [run_record(10, "full", 500, 400), run_record(10, "full", 520, 460), run_record(10, "full", 540, 450),
               run_record(10, "full", 530, 300, rc=2), run_record(10, "baseline", 60, 55)]
    grouped = plot.groups(results)
    assert len(grouped[("ssh", "full", 10)]) == 3
    table = plot.table(grouped).splitlines()
    full = next(line for line in table if "| full |" in line)
    assert "| 3 | 500 / 520 / 540 | 400 / 450 / 460 |" in full
    baseline = next(line for line in table if "| baseline |" in line)
    assert "| 1 | 60 | 55 | 0.92 |" in baseline


def test_the_plots_are_written_as_png(tmp_path):
    grouped = plot.groups([run_record(10, "full", 500, 400), run_record(50, "full", 900, 700),
                           run_record(10, "baseline", 60, 55)])
    written = plot.plot(grouped, tmp_path)
    assert [path.name for path in written] == ["deploy-wall.png", "deploy-controller.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


cardinality = load("cardinality")


def test_series_are_counted_per_metric_family_without_comments():
    text = ("# HELP node_cpu_seconds_total x\n# TYPE node_cpu_seconds_total counter\n"
            'node_cpu_seconds_total{cpu="0",mode="idle"} 1\nnode_cpu_seconds_total{cpu="1",mode="idle"} 2\n'
            "\nhpc_job_info 1 1700000000000\n"
            'go_gc_duration_seconds{quantile="0.5"} 0.1\ngo_gc_duration_seconds_sum 1\n')
    assert cardinality.families(text) == {"node_cpu_seconds_total": 2, "hpc_job_info": 1, "go_gc_duration_seconds": 1,
                                          "go_gc_duration_seconds_sum": 1}

