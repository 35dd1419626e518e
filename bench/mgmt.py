#!/usr/bin/env python3
"""Management host at scale: VictoriaMetrics, vmalert and Alertmanager against NODES simulated 8-GPU nodes.

One run, every process a plain process in a temporary directory, every address on loopback (127.1.0.1: the
management host, 127.2.x.y: the GPU nodes):
  render     the victoriametrics role's scrape.yml and target files for an inventory of NODES GPU nodes and one
             management host (tests/tooling.py render_scrape_config: the role's own templates and defaults; security
             switch off), every shipped rule file (tests/test_rules.py render: the vmalert role's task file, its
             defaults); the binaries from the offline bundle (files/artifacts.yml), Prometheus and promtool from
             Debian's packages (fetched into .cache, the system's apt state untouched)
  generator  one process (`bench/mgmt.py serve`) answering every node, dcgm, ipmi and smartctl target of the rendered
             target files: dcgm-exporter's text from the GPU simulator (roles/lab_gpu_simulator, one simulator per
             node, hpc_job labels from the job schedule), a node_exporter family mix with the Slurm hooks' job info
             metric (hpcobs_slurm_job_info) of the node's running jobs, jobs starting and ending; stops by itself
  backfill   --history of series (default 24 h) before the live phase, at --backfill-step, through
             /api/v1/import (JSON lines), the same series and labels the scrapes give
  live       VictoriaMetrics scraping with the rendered scrape.yml, vmalert with every rule, Alertmanager; after a
             warm-up, --live seconds measured: RSS and CPU of each process (/proc), bytes per sample
             (vm_data_size_bytes / vm_rows), each rule group's evaluation time (vmalert's own /metrics),
             scrape duration p99 per job (scrape_duration_seconds of the window)
  dashboards every panel query of every shipped dashboard over 24 h, --repeat times uncached: p50 / p95 per panel
  prometheus the same generator scraped by Prometheus with the same scrape.yml and the rules it accepts (live only,
             --prometheus-live seconds): RSS, CPU, rule group durations

  bench/mgmt.py --nodes 1000 [--runs 3]        results in .cache/bench/mgmt/results.json
  bench/mgmt.py report                         Markdown tables and the plots in docs/performance
  bench/mgmt.py --smoke                         20 nodes, 1 h of history, about 1 min live (under 2 min)
  bench/mgmt.py --rule-vars '{"vmalert_rules_concurrency": 1}' --out DIR   an A/B of a rule setting
  bench/mgmt.py --scrape-vars '{"victoriametrics_dcgm_job_fields_extra": [...]}' --out DIR   ... of a scrape setting
  bench/mgmt.py --vm-args '["-memory.allowedBytes=512MiB"]' --out DIR   ... of a victoria-metrics flag
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "tests"), str(REPO / "tests" / "dashboards"),
                str(REPO / "roles" / "lab_gpu_simulator" / "files")]

import deploy as bench_deploy  # noqa: E402  (proc_stat, rss_bytes, cpu_seconds)
import plot as deploy_plot  # noqa: E402  (spread)
from cardinality import load  # noqa: E402

OUT = REPO / ".cache" / "bench" / "mgmt"
BUNDLE = REPO / ".cache" / "bundle-local" / "bundle"
COUNTERS = REPO / "roles" / "dcgm_exporter" / "files" / "hpcobs-counters.csv"
MGMT = "127.1.0.1"
PROMETHEUS_ADDRESS = "127.1.0.2:9090"
PORTS = {"victoriametrics": 8428, "vmalert": 8880, "alertmanager": 9093}
SERVED_JOBS = ("node", "dcgm", "ipmi", "smartctl")
GPUS = 8
SLOW_QUERY_MS = 10000
ACCOUNTS = ["physics", "chemistry", "biology", "climate", "ml", "astro", "materials", "cfd"]


def say(message: str) -> None:
    print("bench-mgmt: %s" % message, flush=True)


# ------------------------------------------------------------------------------------------------- inventory
def node_address(index: int) -> str:
    """Loopback address of GPU node `index` (0-based): 127.2.0.1, 127.2.0.2, ... 250 to a /24."""
    return "127.2.%d.%d" % (index // 250, index % 250 + 1)


def node_name(index: int) -> str:
    return "gpu%04d" % (index + 1)


def inventory(nodes: int) -> dict:
    return {"all": {"children": {
        "gpu_nodes": {"hosts": {node_name(i): {"hpcobs_address": node_address(i)} for i in range(nodes)}},
        "management": {"hosts": {"mgmt01": {"hpcobs_address": MGMT}}},
    }}}


RENDER_VARS = {"hpcobs_security": False, "hpcobs_components_disabled": ["loki", "grafana", "promtail", "alloy"]}


def served_targets(file_sd: Path) -> list[tuple[str, str, int, str]]:
    """(job, host, port, node) of every target the generator answers, from the rendered target files."""
    out = []
    for job in SERVED_JOBS:
        path = file_sd / ("%s.json" % job)
        if not path.exists():
            continue
        for entry in json.loads(path.read_text()):
            for target in entry["targets"]:
                host, port = target.rsplit(":", 1)
                out.append((job, host, int(port), entry["labels"]["node"]))
    return out


# ---------------------------------------------------------------------------------------------------- jobs
class Schedule:
    """Slurm jobs on every node: two slots per node (GPUs 0-3 and 4-7), each alternating a job of 1 to 8 h and an
    idle gap of up to 30 min, from `start` on; deterministic from (seed, node, slot)."""

    def __init__(self, seed: int, start: float, min_s: float = 3600, max_s: float = 8 * 3600, gap_s: float = 1800):
        self.seed, self.start = seed, start
        self.min_s, self.max_s, self.gap_s = min_s, max_s, gap_s
        self._segments: dict[tuple[str, int], list[tuple[float, float, str | None]]] = {}

    def segments(self, node: str, slot: int, until: float) -> list[tuple[float, float, str | None]]:
        """[(start, end, job id or None)] covering start..until."""
        key = (node, slot)
        segs = self._segments.setdefault(key, [])
        if not segs or segs[-1][1] < until:
            rng = random.Random("%d:%s:%d:%d" % (self.seed, node, slot, len(segs)))
            t = segs[-1][1] if segs else self.start - rng.uniform(0, self.max_s)
            serial = len(segs)
            while t < until:
                if serial % 2 == 0:
                    job = str(100000 + (int(node[3:]) * 2 + slot) * 1000 + serial // 2) if node[3:].isdigit() \
                        else None
                    end = t + rng.uniform(self.min_s, self.max_s)
                else:
                    job, end = None, t + rng.uniform(60, self.gap_s)
                segs.append((t, end, job))
                t, serial = end, serial + 1
        return segs

    def jobs_at(self, node: str, t: float) -> list[tuple[int, str]]:
        """[(slot, job id)] running on the node at t."""
        out = []
        for slot in (0, 1):
            for start, end, job in reversed(self.segments(node, slot, t + 1)):
                if start <= t < end:
                    if job:
                        out.append((slot, job))
                    break
        return out


def job_labels(job: str) -> tuple[str, str]:
    """(user, account) of a job id, as sacct would name them."""
    number = int(job)
    return "user%02d" % (number * 7 % 40), ACCOUNTS[number * 13 % len(ACCOUNTS)]


def slot_gpus(slot: int) -> range:
    return range(slot * GPUS // 2, (slot + 1) * GPUS // 2)


def mapping_of(jobs: list[tuple[int, str]]) -> dict[str, list[str]]:
    """The simulator's HPC job mapping (GPU index -> job ids) of the running jobs."""
    return {str(gpu): [job] for slot, job in jobs for gpu in slot_gpus(slot)}


# ------------------------------------------------------------------------------------------------- series
# Per series: (kind, base, rate, phase); value_at gives its value at t. Counters grow by `rate` per second from
# `base` at REF (the start of the live phase), gauges wave around `base`, constants stay.
def value_at(kind: str, base: float, rate: float, phase: float, t: float, ref: float) -> float:
    if kind == "counter":
        return max(0.0, base + rate * (t - ref))
    if kind == "gauge":
        return base * (1.0 + 0.04 * math.sin(t / 900.0 + phase) + 0.01 * math.sin(t / 37.0 + 3 * phase))
    return base


def format_value(kind: str, value: float, integer: bool) -> str:
    if integer:
        return "%d" % value
    if kind == "counter":
        return "%.2f" % value
    return "%.6g" % value


def _series(name: str, labels: dict, kind: str, base: float, rate: float = 0.0, integer: bool = False):
    return (name, labels, kind, base, rate, integer)


def node_exporter_series(node: str, cpus: int = 32) -> list[tuple]:
    """A node_exporter 1.x family mix of a GPU node with its default collectors (about 800 series): per-CPU time,
    memory, file systems, disks, network, systemd units, pressure, hwmon, vmstat, netstat, its own process."""
    rng = random.Random(node)
    out = []
    modes = ["idle", "iowait", "irq", "nice", "softirq", "steal", "system", "user"]
    share = {"idle": 0.55, "iowait": 0.01, "irq": 0.0, "nice": 0.0, "softirq": 0.005, "steal": 0.0, "system": 0.06,
             "user": 0.37}
    for cpu in range(cpus):
        for mode in modes:
            out.append(_series("node_cpu_seconds_total", {"cpu": str(cpu), "mode": mode},
                               "counter" if share[mode] else "const", 86400 * 30 * share[mode], share[mode]))
        out.append(_series("node_cpu_scaling_frequency_hertz", {"cpu": str(cpu)}, "gauge", 2.6e9 + rng.random() * 8e8))
    total = 2 * 1024 ** 4
    for field, frac, kind in [("MemTotal", 1.0, "const"), ("MemFree", 0.2, "gauge"), ("MemAvailable", 0.55, "gauge"),
                              ("Buffers", 0.01, "gauge"), ("Cached", 0.3, "gauge"), ("SwapTotal", 0.0, "const"),
                              ("SwapFree", 0.0, "const"), ("Active", 0.3, "gauge"), ("Inactive", 0.2, "gauge"),
                              ("Dirty", 0.0001, "gauge"), ("Writeback", 0.0, "const"), ("AnonPages", 0.25, "gauge"),
                              ("Mapped", 0.02, "gauge"), ("Shmem", 0.01, "gauge"), ("Slab", 0.01, "gauge"),
                              ("SReclaimable", 0.006, "gauge"), ("SUnreclaim", 0.004, "gauge"),
                              ("KernelStack", 0.0001, "gauge"), ("PageTables", 0.001, "gauge"),
                              ("CommitLimit", 0.5, "const"), ("Committed_AS", 0.4, "gauge"),
                              ("VmallocTotal", 16.0, "const"), ("VmallocUsed", 0.0005, "gauge"),
                              ("HugePages_Total", 0.0, "const"), ("HugePages_Free", 0.0, "const"),
                              ("Hugepagesize", 2 * 1024 ** 2 / total, "const"), ("AnonHugePages", 0.05, "gauge"),
                              ("Mlocked", 0.0, "const"), ("Unevictable", 0.0, "const"), ("Percpu", 0.0002, "const"),
                              ("DirectMap4k", 0.001, "const"), ("DirectMap2M", 0.1, "const"),
                              ("DirectMap1G", 0.9, "const")]:
        out.append(_series("node_memory_%s_bytes" % field, {}, kind, total * frac, integer=True))
    mounts = [("/", "/dev/nvme0n1p2", "ext4", 400e9), ("/boot", "/dev/nvme0n1p1", "vfat", 1e9),
              ("/tmp", "/dev/nvme1n1p1", "xfs", 3.5e12), ("/home", "home:/export", "nfs4", 500e12),
              ("/run", "tmpfs", "tmpfs", 200e9)]
    for mount, device, fstype, size in mounts:
        labels = {"device": device, "fstype": fstype, "mountpoint": mount}
        for family, frac, kind in [("size_bytes", 1.0, "const"), ("avail_bytes", 0.4, "gauge"),
                                   ("free_bytes", 0.45, "gauge"), ("files", 1e-4, "const"),
                                   ("files_free", 0.8e-4, "gauge"), ("readonly", 0.0, "const"),
                                   ("device_error", 0.0, "const")]:
            out.append(_series("node_filesystem_%s" % family, labels, kind, size * frac, integer=True))
    for device in ["nvme0n1", "nvme1n1", "sda"]:
        for family, rate in [("reads_completed_total", 20), ("writes_completed_total", 40),
                             ("read_bytes_total", 2e6), ("written_bytes_total", 4e6), ("read_time_seconds_total", 0.01),
                             ("write_time_seconds_total", 0.03), ("io_time_seconds_total", 0.05),
                             ("io_time_weighted_seconds_total", 0.08), ("reads_merged_total", 1),
                             ("writes_merged_total", 3), ("discarded_sectors_total", 0.0),
                             ("io_now", 0.0)]:
            kind = "counter" if rate else "const"
            out.append(_series("node_disk_%s" % family, {"device": device}, kind, rate * 86400 * 10, rate))
    for device in ["lo", "eno1", "ib0", "ib1"]:
        for family, rate in [("receive_bytes_total", 5e6), ("transmit_bytes_total", 5e6),
                             ("receive_packets_total", 4e3), ("transmit_packets_total", 4e3),
                             ("receive_errs_total", 0), ("transmit_errs_total", 0), ("receive_drop_total", 0.01),
                             ("transmit_drop_total", 0), ("receive_multicast_total", 1),
                             ("receive_fifo_total", 0), ("transmit_fifo_total", 0), ("transmit_colls_total", 0)]:
            out.append(_series("node_network_%s" % family, {"device": device}, "counter" if rate else "const",
                               rate * 86400 * 10, rate))
        for family, value in [("up", 1), ("mtu_bytes", 65520 if device.startswith("ib") else 1500),
                              ("speed_bytes", 2.5e10), ("carrier", 1)]:
            out.append(_series("node_network_%s" % family, {"device": device}, "const", value, integer=True))
    units = (["hpcobs-node-exporter", "hpcobs-dcgm-exporter", "hpcobs-ipmi-exporter", "hpcobs-smartctl-exporter",
              "promtail", "slurmd", "munge", "nvidia-persistenced", "nvidia-fabricmanager", "sshd", "chronyd",
              "rsyslog", "systemd-journald", "systemd-logind", "systemd-udevd", "dbus", "cron", "getty@tty1",
              "lldpd", "rdma-ndd", "opensm", "nfs-client", "autofs", "irqbalance", "auditd", "postfix",
              "systemd-networkd", "systemd-resolved", "polkit", "containerd", "apparmor", "kmod-static-nodes",
              "systemd-tmpfiles-setup", "systemd-sysctl", "systemd-modules-load", "networking", "ssh",
              "unattended-upgrades", "fwupd", "smartd"])
    for unit in units:
        for state in ["activating", "active", "deactivating", "failed", "inactive"]:
            out.append(_series("node_systemd_unit_state", {"name": unit + ".service", "state": state,
                                                           "type": "simple"},
                               "const", 1 if state == "active" else 0, integer=True))
    for chip in range(4):
        for sensor in range(5):
            out.append(_series("node_hwmon_temp_celsius", {"chip": "platform_coretemp_%d" % chip,
                                                           "sensor": "temp%d" % (sensor + 1)},
                               "gauge", 45 + rng.random() * 20))
    for resource_name in ["cpu", "io", "memory"]:
        out.append(_series("node_pressure_%s_waiting_seconds_total" % resource_name, {}, "counter", 1e4, 0.01))
        if resource_name != "cpu":
            out.append(_series("node_pressure_%s_stalled_seconds_total" % resource_name, {}, "counter", 1e3, 0.001))
    for field, rate in [("pgfault", 1e4), ("pgmajfault", 1), ("pgpgin", 1e3), ("pgpgout", 2e3), ("pswpin", 0),
                        ("pswpout", 0), ("oom_kill", 0)]:
        out.append(_series("node_vmstat_%s" % field, {}, "counter" if rate else "const", rate * 1e6, rate,
                           integer=True))
    for field, rate in [("Tcp_ActiveOpens", 2), ("Tcp_PassiveOpens", 3), ("Tcp_CurrEstab", 0), ("Tcp_InErrs", 0),
                        ("Tcp_InSegs", 800), ("Tcp_OutSegs", 800), ("Tcp_RetransSegs", 0.5), ("Udp_InDatagrams", 50),
                        ("Udp_OutDatagrams", 50), ("Udp_InErrors", 0), ("Udp_NoPorts", 0.1), ("Ip_Forwarding", 0),
                        ("Icmp_InMsgs", 0.1), ("Icmp_OutMsgs", 0.1), ("TcpExt_ListenDrops", 0),
                        ("TcpExt_ListenOverflows", 0), ("TcpExt_SyncookiesSent", 0), ("TcpExt_TCPTimeouts", 0.01),
                        ("Ip6_InOctets", 10), ("Ip6_OutOctets", 10), ("IpExt_InOctets", 5e6),
                        ("IpExt_OutOctets", 5e6)]:
        out.append(_series("node_netstat_%s" % field, {}, "counter" if rate else "const", rate * 1e6, rate,
                           integer=True))
    for field, value in [("sockets_used", 900), ("TCP_inuse", 60), ("TCP_alloc", 80), ("TCP_tw", 20),
                         ("TCP_orphan", 0), ("TCP_mem", 50), ("TCP_mem_bytes", 204800), ("UDP_inuse", 10),
                         ("UDP_mem", 5), ("UDP_mem_bytes", 20480), ("FRAG_inuse", 0), ("RAW_inuse", 0),
                         ("TCP6_inuse", 10), ("UDP6_inuse", 4)]:
        out.append(_series("node_sockstat_%s" % field, {}, "gauge" if value else "const", value, integer=True))
    collectors = ["arp", "bcache", "bonding", "btrfs", "conntrack", "cpu", "cpufreq", "diskstats", "dmi", "edac",
                  "entropy", "fibrechannel", "filefd", "filesystem", "hwmon", "infiniband", "ipvs", "loadavg",
                  "mdadm", "meminfo", "netclass", "netdev", "netstat", "nfs", "nfsd", "nvme", "os", "powersupplyclass",
                  "pressure", "rapl", "schedstat", "selinux", "sockstat", "softnet", "stat", "systemd", "tapestats",
                  "textfile", "thermal_zone", "time", "timex", "udp_queues", "uname", "vmstat", "watchdog", "xfs",
                  "zfs"]
    for collector in collectors:
        out.append(_series("node_scrape_collector_duration_seconds", {"collector": collector}, "gauge",
                           0.0005 + rng.random() * 0.01))
        out.append(_series("node_scrape_collector_success", {"collector": collector}, "const", 1, integer=True))
    for name, kind, base, rate in [("node_load1", "gauge", 20, 0), ("node_load5", "gauge", 20, 0),
                                   ("node_load15", "gauge", 20, 0), ("node_boot_time_seconds", "const", 1.76e9, 0),
                                   ("node_time_seconds", "counter", 0, 1), ("node_context_switches_total", "counter",
                                                                          1e10, 5e4),
                                   ("node_intr_total", "counter", 1e10, 3e4), ("node_forks_total", "counter", 1e7, 5),
                                   ("node_procs_running", "gauge", 20, 0), ("node_procs_blocked", "const", 0, 0),
                                   ("node_entropy_available_bits", "const", 256, 0),
                                   ("node_filefd_allocated", "gauge", 12000, 0), ("node_filefd_maximum", "const",
                                                                                  9.2e18, 0),
                                   ("node_timex_offset_seconds", "gauge", 1e-5, 0),
                                   ("node_timex_sync_status", "const", 1, 0),
                                   ("node_textfile_scrape_error", "const", 0, 0),
                                   ("process_cpu_seconds_total", "counter", 5000, 0.02),
                                   ("process_resident_memory_bytes", "gauge", 2.5e7, 0),
                                   ("process_virtual_memory_bytes", "const", 1.3e9, 0),
                                   ("process_open_fds", "gauge", 12, 0), ("process_max_fds", "const", 1048576, 0),
                                   ("process_start_time_seconds", "const", 1.76e9, 0),
                                   ("go_goroutines", "gauge", 9, 0), ("go_threads", "const", 12, 0),
                                   ("go_memstats_alloc_bytes", "gauge", 4e6, 0),
                                   ("go_memstats_heap_inuse_bytes", "gauge", 6e6, 0),
                                   ("go_memstats_sys_bytes", "const", 2.2e7, 0),
                                   ("go_gc_duration_seconds_count", "counter", 1e5, 0.05),
                                   ("go_gc_duration_seconds_sum", "counter", 30, 1e-5),
                                   ("promhttp_metric_handler_requests_in_flight", "const", 1, 0)]:
        t_kind = "counter" if rate else kind
        if name == "node_time_seconds":
            out.append(_series(name, {}, "clock", 0))
            continue
        out.append(_series(name, {}, t_kind, base, rate))
    for code in ["200", "500", "503"]:
        out.append(_series("promhttp_metric_handler_requests_total", {"code": code},
                           "counter" if code == "200" else "const", 1e5 if code == "200" else 0,
                           1 / 15 if code == "200" else 0, integer=True))
    out.append(_series("node_uname_info", {"domainname": "(none)", "machine": "x86_64", "nodename": node,
                                           "release": "6.1.0-28-amd64", "sysname": "Linux",
                                           "version": "#1 SMP PREEMPT_DYNAMIC Debian 6.1.119-1"}, "const", 1,
                       integer=True))
    out.append(_series("node_os_info", {"id": "debian", "name": "Debian GNU/Linux", "pretty_name":
                                        "Debian GNU/Linux 12 (bookworm)", "version_id": "12"}, "const", 1,
                       integer=True))
    out.append(_series("node_exporter_build_info", {"version": "1.11.1", "goversion": "go1.24.4",
                                                    "branch": "HEAD", "revision": "unknown"}, "const", 1, integer=True))
    out.append(_series("node_textfile_mtime_seconds", {"file": "/var/lib/hpcobs/textfile/slurm_jobs.prom"}, "clock", 0))
    return out


def ipmi_series(node: str) -> list[tuple]:
    """ipmi_exporter of a GPU server's BMC: sensors, fans, PSUs, its own process."""
    rng = random.Random(node + "ipmi")
    out = [_series("ipmi_up", {"collector": c}, "const", 1, integer=True)
           for c in ["bmc", "chassis", "dcmi", "ipmi", "sel"]]
    for i in range(12):
        name = "FAN%d" % (i + 1)
        out.append(_series("ipmi_fan_speed_rpm", {"id": str(30 + i), "name": name}, "gauge", 9000 + rng.random() * 3000))
        out.append(_series("ipmi_fan_speed_state", {"id": str(30 + i), "name": name}, "const", 0, integer=True))
    for i in range(24):
        name = "Temp_%d" % i
        out.append(_series("ipmi_temperature_celsius", {"id": str(60 + i), "name": name}, "gauge",
                           35 + rng.random() * 30))
        out.append(_series("ipmi_temperature_state", {"id": str(60 + i), "name": name}, "const", 0, integer=True))
    for i in range(6):
        out.append(_series("ipmi_sensor_state", {"id": str(90 + i), "name": "PSU%d_Status" % (i + 1),
                                                 "type": "Power Supply"}, "const", 0, integer=True))
        out.append(_series("ipmi_power_watts", {"id": str(100 + i), "name": "PSU%d_Input" % (i + 1)}, "gauge",
                           900 + rng.random() * 300))
    out.append(_series("ipmi_dcmi_power_consumption_watts", {}, "gauge", 5200))
    out.append(_series("ipmi_chassis_power_state", {}, "const", 1, integer=True))
    out.append(_series("ipmi_sel_logs_count", {}, "const", 17, integer=True))
    return out


def smartctl_series(node: str) -> list[tuple]:
    """smartctl_exporter of two NVMe disks."""
    out = []
    for disk in ["nvme0", "nvme1"]:
        labels = {"device": disk}
        out.append(_series("smartctl_device_percentage_used", labels, "const", 3, integer=True))
        out.append(_series("smartctl_device_available_spare", labels, "const", 100, integer=True))
        out.append(_series("smartctl_device_temperature", dict(labels, temperature_type="current"), "gauge", 38))
        out.append(_series("smartctl_device_power_on_seconds", labels, "counter", 3e7, 1, integer=True))
        out.append(_series("smartctl_device_smart_status", labels, "const", 1, integer=True))
        out.append(_series("smartctl_device_critical_warning", labels, "const", 0, integer=True))
        out.append(_series("smartctl_device_media_errors", labels, "const", 0, integer=True))
        out.append(_series("smartctl_device_num_err_log_entries", labels, "const", 0, integer=True))
        out.append(_series("smartctl_device_bytes_read", labels, "counter", 1e14, 1e6, integer=True))
        out.append(_series("smartctl_device_bytes_written", labels, "counter", 2e14, 2e6, integer=True))
        out.append(_series("smartctl_device", dict(labels, model_name="SAMSUNG MZQL23T8HCLS-00A07",
                                                   serial_number="S64H%s%s" % (node[-4:], disk[-1]),
                                                   firmware_version="GDC5902Q", interface="nvme",
                                                   protocol="NVMe"), "const", 1, integer=True))
    out.append(_series("smartctl_devices", {}, "const", 2, integer=True))
    out.append(_series("smartctl_version", {"version": "7.3"}, "const", 1, integer=True))
    return out


def job_info_series(jobs: list[tuple[int, str]]) -> list[tuple]:
    """The Slurm hooks' textfile metric of the running jobs (roles/slurm_hooks, hpcobs-slurm-prolog)."""
    out = []
    for _slot, job in jobs:
        user, account = job_labels(job)
        out.append(_series("hpcobs_slurm_job_info", {"hpc_job": job, "user": user, "account": account,
                                                     "partition": "gpu"}, "const", 1, integer=True))
    return out


def label_text(labels: dict) -> str:
    return ",".join('%s="%s"' % (k, str(v).replace("\\", "\\\\").replace('"', '\\"')) for k, v in labels.items())


def exposition(series: list[tuple], t: float, ref: float) -> str:
    """Prometheus text of the series at time t: one HELP and TYPE per family."""
    lines, seen = [], set()
    for name, labels, kind, base, rate, integer in series:
        family = re.sub(r"_(count|sum)$", "", name) if name.startswith("go_gc_duration") else name
        if family not in seen:
            seen.add(family)
            ptype = "counter" if name.endswith("_total") else "gauge"
            lines.append("# HELP %s %s\n# TYPE %s %s\n" % (family, family.replace("_", " "), family, ptype))
        value = t if kind == "clock" else value_at(kind, base, rate, hash(name) % 7, t, ref)
        text = label_text(labels)
        lines.append("%s%s %s\n" % (name, "{%s}" % text if text else "", format_value(kind, value, integer)))
    return "".join(lines)


# ---------------------------------------------------------------------------------------------------- GPUs
def simulator(node: str, index: int):
    """The GPU simulator of one node (roles/lab_gpu_simulator), its counters CSV the dcgm_exporter role's."""
    from hpcobs_gpusim import cli, counters, model

    os.environ["HPCOBS_GPUSIM_CONFIG"] = "none"
    state = Path(tempfile.gettempdir()) / "hpcobs-bench-mgmt-gpusim"
    opts = cli.build_serve_parser().parse_args(["-f", str(COUNTERS), "--sim-gpus", str(GPUS), "--sim-hostname", node,
                                                "--sim-state-dir", str(state)])
    settings = cli.resolve_settings(opts)
    settings["seed"] = index
    sim = model.Simulator(settings)
    sim.load_state(str(state / "none.json"))
    return sim, counters.load_counters(str(COUNTERS)), settings["emulation"].hostname_label


def dcgm_body(sim, counter_list, hostname_label: str, node: str, jobs, t: float) -> str:
    from hpcobs_gpusim import render

    mapping = mapping_of(jobs)
    sim.tick(t, mapping, {})
    return render.render_metrics(counter_list, sim.visible_entities({}), mapping, node,
                                 hostname_label=hostname_label)


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text: str) -> list[tuple[str, dict, float]]:
    """(name, labels, value) of every sample of a Prometheus text exposition; raises ValueError on a bad line."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        if not match:
            raise ValueError("not a sample: %r" % line)
        labels = dict(LABEL.findall(match.group(2) or ""))
        out.append((match.group(1), labels, float(match.group(3))))
    return out


def dcgm_series(body: str, types: dict[str, str]) -> list[tuple]:
    """The simulator's samples as series of the value model: counters (energy) grow, gauges wave, zeros stay."""
    out = []
    for name, labels, value in parse_exposition(body):
        if types.get(name) == "counter":
            rate = 300_000.0 if name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" else 0.0
            out.append(_series(name, labels, "counter" if rate else "const", value, rate, integer=True))
        else:
            out.append(_series(name, labels, "gauge" if value else "const", value,
                               integer=float(value).is_integer()))
    return out


# ------------------------------------------------------------------------------------------------ generator
class Generator:
    """Every served target's /metrics, computed at the time of the request."""

    def __init__(self, targets, seed: int, ref: float):
        self.ref = ref
        self.schedule = Schedule(seed, ref - 2 * 86400)
        self.nodes = sorted({node for _job, _host, _port, node in targets})
        self.static = {}
        self.sims = {}
        for node in self.nodes:
            self.static[node] = {"node": node_exporter_series(node), "ipmi": ipmi_series(node),
                                 "smartctl": smartctl_series(node)}
        self.lock = threading.Lock()

    def sim(self, node: str):
        if node not in self.sims:
            self.sims[node] = simulator(node, self.nodes.index(node))
        return self.sims[node]

    def body(self, job: str, node: str, t: float) -> str:
        gpu_node = node.startswith("gpu")
        jobs = self.schedule.jobs_at(node, t) if gpu_node else []
        if job == "dcgm":
            sim, counter_list, label = self.sim(node)
            return dcgm_body(sim, counter_list, label, node, jobs, t)
        series = self.static[node][job]
        if job == "node":
            series = series + job_info_series(jobs)
        return exposition(series, t, self.ref)


async def _handle(generator: Generator, job: str, node: str, reader, writer) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b"/"
            if path.startswith(b"/metrics"):
                body = generator.body(job, node, time.time()).encode()
                status = b"200 OK"
            else:
                body, status = b"not found\n", b"404 Not Found"
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
            if b"connection: close" in head.lower():
                break
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def _serve(targets, generator: Generator, seconds: float, ready: Path | None) -> None:
    servers = []
    for job, host, port, node in targets:
        servers.append(await asyncio.start_server(
            lambda r, w, j=job, n=node: _handle(generator, j, n, r, w), host, port, backlog=64, reuse_address=True))
    if ready:
        ready.write_text("%d\n" % len(servers))
    await asyncio.sleep(seconds)
    for server in servers:
        server.close()


def serve_main(args) -> int:
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    targets = served_targets(Path(args.file_sd))
    generator = Generator(targets, args.seed, args.ref)
    asyncio.run(_serve(targets, generator, args.seconds, Path(args.ready) if args.ready else None))
    return 0


# ------------------------------------------------------------------------------------------------- backfill
def import_lines(series: list[tuple], metric_labels: dict, grid: list[float], i0: int, i1: int, ref: float,
                 cache: dict) -> list[str]:
    """JSON lines of /api/v1/import for the series between grid points i0 and i1 (exclusive)."""
    key = ("ts", i0, i1)
    stamps = cache.get(key)
    if stamps is None:
        stamps = cache[key] = ",".join("%d" % (t * 1000) for t in grid[i0:i1])
    out = []
    points = grid[i0:i1]
    for name, labels, kind, base, rate, integer in series:
        metric = dict(labels)
        metric.update(metric_labels)
        metric["__name__"] = name
        if kind == "const":
            ckey = ("c", base, integer, i1 - i0)
            values = cache.get(ckey)
            if values is None:
                values = cache[ckey] = ",".join([format_value(kind, base, integer)] * (i1 - i0))
        elif kind == "clock":
            values = ",".join("%d" % t for t in points)
        else:
            phase = hash(name) % 7
            values = ",".join([format_value(kind, value_at(kind, base, rate, phase, t, ref), integer)
                               for t in points])
        out.append('{"metric":%s,"values":[%s],"timestamps":[%s]}\n' % (json.dumps(metric), values, stamps))
    return out


def relabel(name: str, labels: dict, configs: list[dict]) -> tuple[str, dict] | None:
    """One series through a job's metric_relabel_configs as Prometheus applies them (the actions the shipped jobs
    use: replace, drop, keep, labeldrop); None when it is dropped. The history then has the series the scrapes
    store (tests/test_bench_mgmt.py holds it to the real victoria-metrics' result)."""
    current = dict(labels, __name__=name)
    for config in configs:
        action = config.get("action", "replace")
        pattern = re.compile("^(?:%s)$" % config.get("regex", "(.*)"))
        if action == "labeldrop":
            current = {k: v for k, v in current.items() if not pattern.match(k)}
            continue
        value = config.get("separator", ";").join(current.get(label, "") for label in config.get("source_labels", []))
        match = pattern.match(value)
        if action == "drop" and match or action == "keep" and not match:
            return None
        if action == "replace" and match:
            target = config["target_label"]
            result = match.expand(re.sub(r"\$\{?(\w+)\}?", r"\\g<\1>", config.get("replacement", "$1")))
            if result:
                current[target] = result
            else:
                current.pop(target, None)
        elif action not in ("replace", "drop", "keep"):
            raise ValueError("relabel action %r is not simulated" % action)
    name = current.pop("__name__")
    return name, current


def relabelled(series: list[tuple], configs: list[dict]) -> list[tuple]:
    """The value-model series of one target after its job's metric_relabel_configs."""
    if not configs:
        return series
    out = []
    for name, labels, *rest in series:
        kept = relabel(name, labels, configs)
        if kept is not None:
            out.append((kept[0], kept[1], *rest))
    return out


def segment_indexes(grid: list[float], start: float, end: float) -> tuple[int, int]:
    """Grid points within [start, end)."""
    import bisect

    return bisect.bisect_left(grid, start), bisect.bisect_left(grid, end)


def backfill_node(targets_of_node, node: str, gen: Generator, grid: list[float], ref: float, cache: dict,
                  types: dict, relabels: dict | None = None) -> list[str]:
    """Import lines of one node's targets over the grid: its job segments give the dcgm series' hpc_job and the
    job info series; each job's metric_relabel_configs (`relabels`, by job) apply as they do to a scrape."""
    out = []
    relabels = relabels or {}
    for job, host, port in targets_of_node:
        labels = {"job": job, "instance": "%s:%d" % (host, port), "node": node}
        configs = relabels.get(job) or []
        out.extend(import_lines([_series("up", {}, "const", 1, integer=True)], labels, grid, 0, len(grid), ref,
                                cache))
        if job in ("ipmi", "smartctl") or (job == "node" and not node.startswith("gpu")):
            out.extend(import_lines(relabelled(gen.static[node][job], configs), labels, grid, 0, len(grid), ref,
                                    cache))
            continue
        if job == "node":
            out.extend(import_lines(relabelled(gen.static[node]["node"], configs), labels, grid, 0, len(grid), ref,
                                    cache))
        sim, counter_list, hostname_label = gen.sim(node) if job == "dcgm" else (None, None, None)
        for slot in (0, 1):
            for start, end, jobid in gen.schedule.segments(node, slot, grid[-1] + 1):
                i0, i1 = segment_indexes(grid, start, end)
                if i1 <= i0:
                    continue
                if job == "node":
                    if jobid:
                        out.extend(import_lines(job_info_series([(slot, jobid)]), labels, grid, i0, i1, ref, cache))
                    continue
                from hpcobs_gpusim import render

                mapping = mapping_of([(slot, jobid)]) if jobid else {}
                entities = [e for e in sim.visible_entities({}) if e.gpu.index in slot_gpus(slot)]
                sim.tick(grid[i0], mapping, {})
                body = render.render_metrics(counter_list, entities, mapping, node, hostname_label=hostname_label)
                out.extend(import_lines(relabelled(dcgm_series(body, types), configs), labels, grid, i0, i1, ref,
                                        cache))
    return out


def dcgm_types() -> dict[str, str]:
    from hpcobs_gpusim import counters

    return {c.name: c.prom_type for c in counters.load_counters(str(COUNTERS))}


def post(url: str, data: bytes, timeout: float = 600) -> bytes:
    request = urllib.request.Request(url, data=data, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return answer.read()


def get(url: str, timeout: float = 60) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return answer.read()


def job_relabels(scrape_yml: Path) -> dict[str, list]:
    """Each job's metric_relabel_configs in a rendered scrape.yml."""
    import yaml

    config = yaml.safe_load(scrape_yml.read_text())
    return {job["job_name"]: job.get("metric_relabel_configs") or [] for job in config.get("scrape_configs") or []}


def backfill(vm_url: str, targets, gen: Generator, start: float, end: float, step: float,
             relabels: dict | None = None) -> dict:
    """Import the history of every target, through its job's metric_relabel_configs (`relabels`, by job); lines go
    out in ~16 MB bodies from two sender threads."""
    import queue

    grid = [start + k * step for k in range(int((end - start) // step))]
    by_node: dict[str, list] = {}
    for job, host, port, node in targets:
        by_node.setdefault(node, []).append((job, host, port))
    bodies: queue.Queue = queue.Queue(maxsize=4)
    errors = []

    def sender():
        while True:
            data = bodies.get()
            if data is None:
                return
            try:
                post(vm_url + "/api/v1/import", data)
            except (OSError, urllib.error.HTTPError) as exc:
                errors.append(str(exc))

    threads = [threading.Thread(target=sender, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    began, lines, size, chunk, pending, types, cache = time.monotonic(), 0, 0, [], 0, dcgm_types(), {}
    for node, node_targets in by_node.items():
        new = backfill_node(node_targets, node, gen, grid, end, cache, types, relabels)
        chunk.extend(new)
        pending += sum(map(len, new))
        if pending >= 16 * 2 ** 20:
            data = "".join(chunk).encode()
            lines, size, chunk, pending = lines + len(chunk), size + len(data), [], 0
            bodies.put(data)
    if chunk:
        data = "".join(chunk).encode()
        lines, size = lines + len(chunk), size + len(data)
        bodies.put(data)
    for _ in threads:
        bodies.put(None)
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError("import failed: %s" % errors[:3])
    get(vm_url + "/internal/force_flush")
    return {"series_lines": lines, "bytes": size, "points_per_series": len(grid), "step_s": step,
            "seconds": round(time.monotonic() - began, 1), "history_s": end - start}


# ------------------------------------------------------------------------------------------------ binaries
def bundle_binary(component: str, member: str, dest: Path) -> Path:
    """A binary of the offline bundle's amd64 archive of component (files/artifacts.yml), unpacked once."""
    import yaml

    path = dest / Path(member).name
    if path.exists():
        return path
    spec = yaml.safe_load((REPO / "files" / "artifacts.yml").read_text())["components"][component]
    archives = sorted((BUNDLE / "artifacts" / component / spec["version"]).glob("*linux-amd64*.tar.gz"))
    if not archives:
        sys.exit("bench-mgmt: no %s archive in %s (make bundle-local)" % (component, BUNDLE))
    root = spec.get("archive_root", "").format(version=spec["version"], arch="amd64")
    with tarfile.open(archives[0]) as archive:
        source = archive.extractfile("%s/%s" % (root, member) if root else member)
        dest.mkdir(parents=True, exist_ok=True)
        path.write_bytes(source.read())
    path.chmod(0o755)
    return path


def binaries(dest: Path) -> dict[str, Path]:
    return {"victoria-metrics": bundle_binary("victoriametrics", "victoria-metrics-prod", dest),
            "vmalert": bundle_binary("vmutils", "vmalert-prod", dest),
            "alertmanager": bundle_binary("alertmanager", "alertmanager", dest)}


def debian_prometheus(dest: Path) -> dict:
    """Prometheus and promtool from Debian's newest suite (sid), fetched with apt's own client into dest
    (the system's sources, lists and cache untouched) and unpacked there: {binary: path, "version": ...}; with them
    the package prometheus-alertmanager, for the files under /usr/share/prometheus that Debian's builds read (the
    bundle's Alertmanager is Debian's build: it loads its default notification templates from there)."""
    found = {"prometheus": dest / "usr" / "bin" / "prometheus", "promtool": dest / "usr" / "bin" / "promtool",
             "share": dest / "usr" / "share"}
    version_file = dest / "version"
    if not all(p.exists() for p in found.values()) or not version_file.exists():
        build = load("hpcobs_local_mirror", REPO / "scripts" / "local-mirror" / "build.py")
        apt = build.Apt(dest / "apt", "sid", ["amd64"])
        apt.update()
        versions = []
        for package in ("prometheus", "promtool", "prometheus-alertmanager"):
            version, deb = apt.download(package, "amd64", str(dest))
            subprocess.run(["dpkg-deb", "-x", deb, str(dest)], check=True)
            versions.append("%s %s" % (package, version))
        version_file.write_text("\n".join(versions) + "\n")
    return {**found, "version": version_file.read_text().split("\n")[0].split(" ", 1)[1]}


# ------------------------------------------------------------------------------------------------ processes
def wait_http(url: str, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            get(url, timeout=2)
            return
        except OSError:
            if process.poll() is not None:
                raise RuntimeError("%s exited with %s" % (process.args[0], process.returncode))
            if time.monotonic() > deadline:
                raise RuntimeError("%s did not answer %s" % (process.args[0], url))
            time.sleep(0.3)


def with_share(share: Path, command: list[str]) -> list[str]:
    """command in a mount namespace of its own where /usr/share also shows `share` (a read-only overlay): Debian's
    builds of Prometheus and Alertmanager find their files under /usr/share/prometheus without the system being
    changed."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c",
            'mount -t overlay hpcobs-bench -o lowerdir="$0":/usr/share /usr/share && exec "$@"', str(share), *command]


def vm_flags(text: str) -> list[str]:
    """--vm-args: a JSON list of victoria-metrics flags (each `-name` or `-name=value`)."""
    value = json.loads(text)
    if not isinstance(value, list) or not all(isinstance(f, str) and re.match(r"^-[A-Za-z][\w.-]*(=.*)?$", f)
                                              for f in value):
        raise argparse.ArgumentTypeError("--vm-args takes a JSON list of flags like [\"-memory.allowedBytes=512MiB\"], "
                                         "got %s" % text)
    return value


def start(name: str, command: list[str], work: Path, ready_url: str) -> subprocess.Popen:
    log = (work / ("%s.log" % name)).open("w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=work, start_new_session=True)
    wait_http(ready_url, process)
    return process


def stop(process: subprocess.Popen | None) -> None:
    if process is not None and process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Sampler(threading.Thread):
    """RSS and CPU seconds of named processes every `interval` seconds (/proc)."""

    def __init__(self, pids: dict[str, int], interval: float = 5.0):
        super().__init__(daemon=True)
        self.pids, self.interval = pids, interval
        self.samples: list[dict] = []
        self.halt = threading.Event()

    def sample(self) -> dict:
        row = {"t": time.time(), "load1": os.getloadavg()[0]}
        for name, pid in self.pids.items():
            row[name] = {"rss": bench_deploy.rss_bytes(pid), "cpu": bench_deploy.cpu_seconds(pid)}
        return row

    def run(self) -> None:
        while not self.halt.is_set():
            self.samples.append(self.sample())
            self.halt.wait(self.interval)
        self.samples.append(self.sample())


def usage(samples: list[dict], names) -> dict:
    """Per process and together: CPU cores (CPU seconds over wall seconds, first to last sample), RSS at the end
    and its peak, in MiB."""
    first, last = samples[0], samples[-1]
    wall = last["t"] - first["t"]
    out = {}
    for name in names:
        out[name] = {"cores": round((last[name]["cpu"] - first[name]["cpu"]) / wall, 3) if wall > 0 else 0.0,
                     "rss_mib": round(last[name]["rss"] / 2 ** 20, 1),
                     "peak_rss_mib": round(max(s[name]["rss"] for s in samples) / 2 ** 20, 1)}
    out["load1_median"] = round(statistics.median(s.get("load1", 0.0) for s in samples), 2)
    out["together"] = {"cores": round(sum(out[n]["cores"] for n in names), 3),
                       "rss_mib": round(sum(out[n]["rss_mib"] for n in names), 1),
                       "peak_rss_mib": round(max(sum(s[n]["rss"] for n in names) for s in samples) / 2 ** 20, 1)}
    return out


# ------------------------------------------------------------------------------------------------ metrics
def metric_samples(text: str, name: str) -> list[tuple[dict, float]]:
    """(labels, value) of every sample of metric `name` in a /metrics page."""
    return [(labels, value) for metric, labels, value in parse_metrics_page(text) if metric == name]


def parse_metrics_page(text: str):
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        if match:
            try:
                yield match.group(1), dict(LABEL.findall(match.group(2) or "")), float(match.group(3))
            except ValueError:
                continue


def storage_figures(text: str) -> dict:
    """Bytes on disk and rows (samples) stored, from VictoriaMetrics' /metrics."""
    size = sum(v for _labels, v in metric_samples(text, "vm_data_size_bytes"))
    rows = sum(v for labels, v in metric_samples(text, "vm_rows") if labels.get("type", "").startswith("storage/"))
    series = sum(v for labels, v in metric_samples(text, "vm_cache_entries")
                 if labels.get("type") == "storage/hour_metric_ids")
    return {"data_bytes": int(size), "rows": int(rows), "bytes_per_sample": round(size / rows, 3) if rows else None,
            "active_series": int(series)}


def vmalert_groups(text: str) -> dict[str, dict]:
    """Per rule group: evaluation time (s) of vmalert's summary vmalert_iteration_duration_seconds: mean (sum /
    count), its 0.99 quantile, and the iterations counted."""
    groups: dict[str, dict] = {}
    for metric, labels, value in parse_metrics_page(text):
        if not metric.startswith("vmalert_iteration_duration_seconds") or "group" not in labels:
            continue
        entry = groups.setdefault(labels["group"], {})
        if metric.endswith("_sum"):
            entry["sum"] = value
        elif metric.endswith("_count"):
            entry["count"] = value
        elif labels.get("quantile") == "0.99":
            entry["p99_s"] = value
        elif labels.get("quantile") == "0.5":
            entry["p50_s"] = value
    out = {}
    for name, entry in groups.items():
        count = entry.get("count", 0)
        out[name] = {"mean_s": round(entry.get("sum", 0.0) / count, 4) if count else None,
                     "p99_s": round(entry.get("p99_s", math.nan), 4) if "p99_s" in entry else None,
                     "iterations": int(count)}
    return out


def vmalert_rules(api_json: bytes) -> list[dict]:
    """Per rule, from vmalert's /api/v1/rules: the last evaluation's duration (s) and the series it fetched, so the
    costly rules of a group can be named."""
    rows = []
    for group in json.loads(api_json)["data"]["groups"]:
        for rule in group["rules"]:
            rows.append({"group": group["name"], "rule": rule["name"],
                         "seconds": round(float(rule.get("evaluationTime") or 0.0), 4),
                         "series_fetched": int(rule.get("lastSeriesFetched") or 0),
                         "samples": int(rule.get("lastSamples") or 0),
                         "error": str(rule.get("lastError") or "")[:300]})
    return sorted(rows, key=lambda r: -r["seconds"])


def smoke_problems(record: dict, groups: list[str]) -> list[str]:
    """What makes a run's figures meaningless, whatever the scale: a rule group that never ran, a rule or a panel
    query that failed, a served job never scraped, nothing stored live, a Prometheus phase without rules."""
    problems = []
    ran = record.get("rule_groups") or {}
    problems += ["rule group %s never evaluated" % g for g in groups if not (ran.get(g) or {}).get("iterations")]
    problems += ["rule %s / %s: %s" % (r["group"], r["rule"], r["error"]) for r in record.get("rules") or []
                 if r.get("error")]
    problems += ["panel %s / %s (%s): %s" % (p["dashboard"], p["panel"], p["ref"], p["error"])
                 for p in record.get("panels") or [] if p.get("error")]
    scraped = record.get("scrape") or {}
    problems += ["job %s was never scraped" % job for job in SERVED_JOBS if not (scraped.get(job) or {}).get("scrapes")]
    if not (record.get("storage") or {}).get("live_rows"):
        problems.append("nothing was stored during the live phase")
    prom = record.get("prometheus")
    if prom is not None and not (prom.get("rules") or {}).get("kept"):
        problems.append("Prometheus ran without any rule group")
    return problems


def rendered_groups(rules_dir: Path) -> list[str]:
    from test_rules import load_groups

    return sorted(group["name"] for groups in load_groups(rules_dir).values() for group in groups)


def prometheus_groups(text: str) -> dict[str, float]:
    """Per rule group: the last evaluation's duration (s) from Prometheus' own /metrics."""
    out = {}
    for labels, value in metric_samples(text, "prometheus_rule_group_last_duration_seconds"):
        out[labels.get("rule_group", "").split(";")[-1]] = value
    return out


_GPUSIM_SCRAPE = []


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (bench/gpusim_scrape.py's)."""
    if not _GPUSIM_SCRAPE:
        _GPUSIM_SCRAPE.append(load("bench_gpusim_scrape", REPO / "bench" / "gpusim_scrape.py"))
    return _GPUSIM_SCRAPE[0].percentile(values, pct)


def scrape_p99(vm_url: str, start: float, end: float) -> dict[str, dict]:
    """p50 / p99 / max of every scrape's duration per job in [start, end] (scrape_duration_seconds exported)."""
    params = urllib.parse.urlencode({"match[]": "scrape_duration_seconds", "start": "%d" % start, "end": "%d" % end})
    per_job: dict[str, list[float]] = {}
    for line in get(vm_url + "/api/v1/export?" + params, timeout=300).decode().splitlines():
        if line.strip():
            row = json.loads(line)
            per_job.setdefault(row["metric"].get("job", ""), []).extend(row["values"])
    return {job: {"scrapes": len(v), "p50_ms": round(percentile(v, 50) * 1000, 1),
                  "p99_ms": round(percentile(v, 99) * 1000, 1), "max_ms": round(max(v) * 1000, 1)}
            for job, v in sorted(per_job.items()) if v}


# ------------------------------------------------------------------------------------------------ dashboards
def dashboard_timings(vm_url: str, repeat: int, span_s: int = 86400, variables_wait_s: float = 120) -> list[dict]:
    """Every panel query of every shipped dashboard over the last span_s seconds, `repeat` times each, bypassing
    VictoriaMetrics' result cache (nocache=1): wall milliseconds per query (request, answer and JSON decoding). A
    dashboard whose variables list nothing yet is retried until variables_wait_s after the start."""
    import queries

    class Uncached(queries.VictoriaMetrics):
        def _get(self, path, params):
            return super()._get(path, dict(params, nocache="1"))

    vm = Uncached(vm_url, timeout=120)
    out = []
    # A variable read from a recording rule's series (the job and account boards) lists nothing until vmalert has
    # evaluated its group and written the result: a short run waits for it rather than report empty panels.
    deadline = time.monotonic() + variables_wait_s
    for name, model in queries.load_dashboards().items():
        model = dict(model, time={"from": "now-%ds" % span_s, "to": "now"})
        while True:
            try:
                values = queries.resolve_variables(model, vm)
                break
            except queries.HarnessError as exc:
                if time.monotonic() < deadline:
                    time.sleep(5)
                    continue
                values = None
                say("dashboard %s: %s" % (name, exc))
                break
        for query in queries.panel_queries(model, name):
            times, series, error = [], 0, ""
            for _ in range(repeat):
                if values is None:
                    error = "variables"
                    break
                began = time.perf_counter()
                evaluation = queries.evaluate(query, vm, values, model)
                times.append((time.perf_counter() - began) * 1000)
                series, error = evaluation.series, evaluation.error
                if times[-1] > SLOW_QUERY_MS:
                    break  # far beyond the goal already: not repeated, to keep the run's time bounded
            out.append({"dashboard": model.get("uid"), "panel": query.panel_title, "ref": query.ref_id,
                        "instant": query.instant, "series": series, "error": error[:300],
                        "p50_ms": round(statistics.median(times), 1) if times else None,
                        "p95_ms": round(percentile(times, 95), 1) if times else None, "runs_ms": times})
    return out


# ------------------------------------------------------------------------------------------------ Prometheus
PROMETHEUS_GROUP_KEYS = {"name", "interval", "limit", "labels", "query_offset", "rules"}
PROMETHEUS_RULE_KEYS = {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}


def prometheus_rules(rules_dir: Path, dest: Path, promtool: Path) -> dict:
    """The rendered rule groups Prometheus accepts (promtool check rules, one group at a time), in dest; the
    others by name with promtool's reason."""
    import yaml

    dest.mkdir(parents=True, exist_ok=True)
    kept, refused = [], {}
    for path in sorted(rules_dir.glob("*.yml")):
        for group in yaml.safe_load(path.read_text()).get("groups") or []:
            clean = {k: v for k, v in group.items() if k in PROMETHEUS_GROUP_KEYS}
            clean["rules"] = [{k: v for k, v in rule.items() if k in PROMETHEUS_RULE_KEYS} for rule in group["rules"]]
            target = dest / ("%s.yml" % group["name"])
            target.write_text(yaml.safe_dump({"groups": [clean]}, sort_keys=False))
            check = subprocess.run([str(promtool), "check", "rules", str(target)], capture_output=True, text=True)
            if check.returncode == 0:
                kept.append(group["name"])
            else:
                refused[group["name"]] = (check.stdout + check.stderr).strip().splitlines()[-1][:300]
                target.unlink()
    return {"kept": kept, "refused": refused}


def prometheus_config(scrape_yml: Path, rules_dir: Path, dest: Path) -> Path:
    import yaml

    config = yaml.safe_load(scrape_yml.read_text())
    config["rule_files"] = [str(rules_dir / "*.yml")]
    config["global"]["evaluation_interval"] = "30s"
    config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": ["%s:%d" % (MGMT, PORTS["alertmanager"])]}]}]}
    dest.write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


# ------------------------------------------------------------------------------------------------ one run
def render_all(work: Path, nodes: int, rule_vars: dict | None = None,
               scrape_vars: dict | None = None) -> tuple[Path, Path]:
    from tooling import render_scrape_config
    from test_rules import render as render_rules

    etc = render_scrape_config(work / "render", inventory(nodes), {**RENDER_VARS, **(scrape_vars or {})})
    rules = work / "rules"
    rules.mkdir()
    render_rules(rules, rule_vars or {})
    return etc, rules


def run_once(args, run: int, bins: dict, prom: dict | None) -> dict:
    work = Path(tempfile.mkdtemp(prefix="hpcobs-bench-mgmt-", dir=args.workdir))
    record = {"nodes": args.nodes, "run": run, "history_s": args.history, "backfill_step_s": args.backfill_step,
              "live_s": args.live, "warmup_s": args.warmup, "rule_vars": args.rule_vars,
              "scrape_vars": args.scrape_vars, "vm_args": args.vm_args, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                     time.gmtime())}
    processes: dict[str, subprocess.Popen] = {}
    try:
        etc, rules = render_all(work, args.nodes, args.rule_vars, args.scrape_vars)
        targets = served_targets(etc / "file_sd")
        record["targets"] = {job: sum(1 for t in targets if t[0] == job) for job in SERVED_JOBS}
        ref = time.time()
        total_s = 3600  # the generator stops by itself at the latest an hour after it started
        ready = work / "generator.ready"
        gen_log = (work / "generator.log").open("w")
        processes["generator"] = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "serve", "--file-sd", str(etc / "file_sd"),
             "--seed", str(args.seed + run), "--ref", "%f" % ref, "--seconds", str(total_s), "--ready", str(ready)],
            stdout=gen_log, stderr=subprocess.STDOUT, start_new_session=True)
        vm_url = "http://%s:%d" % (MGMT, PORTS["victoriametrics"])
        # One VictoriaMetrics for the whole run (a restart after the import would start the live phase with cold
        # caches): it starts with an empty scrape configuration and gets the rendered one after the backfill.
        scrape_yml = work / "scrape.yml"
        scrape_yml.write_text("scrape_configs: []\n")
        vm_args = [str(bins["victoria-metrics"]), "-storageDataPath=%s" % (work / "vm-data"),
                   "-httpListenAddr=%s:%d" % (MGMT, PORTS["victoriametrics"]), "-retentionPeriod=400d",
                   "-storage.minFreeDiskSpaceBytes=10GiB", "-promscrape.config=%s" % scrape_yml,
                   "-promscrape.fileSDCheckInterval=30s"] + args.vm_args
        processes["victoriametrics"] = start("victoriametrics", vm_args, work, vm_url + "/health")
        say("run %d: %d targets; backfilling %d s of history at a %d s step ..."
            % (run, len(targets), args.history, args.backfill_step))
        gen = Generator(targets, args.seed + run, ref)
        record["backfill"] = backfill(vm_url, targets, gen, ref - args.history, ref, args.backfill_step,
                                      job_relabels(etc / "scrape.yml"))
        say("run %d: backfill %s" % (run, record["backfill"]))
        deadline = time.monotonic() + 300
        while not ready.exists():
            if processes["generator"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the generator did not start: %s" % (work / "generator.log").read_text()[-2000:])
            time.sleep(0.5)
        record["storage_after_backfill"] = storage_figures(get(vm_url + "/metrics").decode())
        shutil.copyfile(etc / "scrape.yml", scrape_yml)
        processes["victoriametrics"].send_signal(signal.SIGHUP)  # re-reads -promscrape.config
        am_url = "http://%s:%d" % (MGMT, PORTS["alertmanager"])
        (work / "alertmanager.yml").write_text("route:\n  receiver: blackhole\nreceivers:\n  - name: blackhole\n")
        processes["alertmanager"] = start("alertmanager", with_share(bins["share"], [
            str(bins["alertmanager"]), "--config.file=%s" % (work / "alertmanager.yml"),
            "--storage.path=%s" % (work / "am-data"), "--web.listen-address=%s:%d" % (MGMT, PORTS["alertmanager"]),
            "--cluster.listen-address="]), work, am_url + "/-/ready")
        vmalert_url = "http://%s:%d" % (MGMT, PORTS["vmalert"])
        processes["vmalert"] = start("vmalert", [
            str(bins["vmalert"]), "-httpListenAddr=%s:%d" % (MGMT, PORTS["vmalert"]), "-rule=%s/*.yml" % rules,
            "-datasource.url=" + vm_url, "-remoteWrite.url=" + vm_url, "-remoteRead.url=" + vm_url,
            "-notifier.url=" + am_url, "-external.url=" + vmalert_url, "-evaluationInterval=30s"],
            work, vmalert_url + "/health")
        say("run %d: live, %d s warm-up then %d s measured ..." % (run, args.warmup, args.live))
        time.sleep(args.warmup)
        names = ["victoriametrics", "vmalert", "alertmanager"]
        sampler = Sampler({n: processes[n].pid for n in names + ["generator"]})
        live_start = time.time()
        sampler.start()
        time.sleep(args.live)
        sampler.halt.set()
        sampler.join()
        live_end = time.time()
        record["usage"] = usage(sampler.samples, names)
        record["generator"] = usage(sampler.samples, ["generator"])["generator"]
        get(vm_url + "/internal/force_flush")
        vm_metrics = get(vm_url + "/metrics").decode()
        record["storage"] = storage_figures(vm_metrics)
        before = record["storage_after_backfill"]
        added_rows = record["storage"]["rows"] - before["rows"]
        record["storage"]["live_rows"] = added_rows
        record["storage"]["live_bytes_per_sample"] = round(
            (record["storage"]["data_bytes"] - before["data_bytes"]) / added_rows, 3) if added_rows > 0 else None
        record["rule_groups"] = vmalert_groups(get(vmalert_url + "/metrics").decode())
        record["rules"] = vmalert_rules(get(vmalert_url + "/api/v1/rules"))
        record["scrape"] = scrape_p99(vm_url, live_start, live_end)
        record["scrape_health"] = {name.replace("vm_promscrape_", ""): int(sum(v for _l, v in metric_samples(
            vm_metrics, name))) for name in ("vm_promscrape_scrapes_total", "vm_promscrape_scrapes_timed_out_total",
                                             "vm_promscrape_conn_read_errors_total", "vm_slow_row_inserts_total",
                                             "vm_rows_inserted_total")}
        record["series_per_job"] = series_per_job(vm_url)
        say("run %d: usage %s" % (run, record["usage"]["together"]))
        if args.repeat:
            say("run %d: dashboards, every panel query %d times ..." % (run, args.repeat))
            record["panels"] = dashboard_timings(vm_url, args.repeat, int(min(args.history, 86400)))
        for name in ("vmalert", "victoriametrics"):
            stop(processes.pop(name))
        if prom:
            record["prometheus"] = prometheus_phase(args, work, etc, rules, prom, processes)
        record["problems"] = smoke_problems(record, rendered_groups(rules))
        record["ok"] = True
    finally:
        for name in list(processes):
            stop(processes.pop(name))
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return record


def series_per_job(vm_url: str) -> dict[str, int]:
    params = urllib.parse.urlencode({"query": "sum by (job) (scrape_samples_scraped)"})
    data = json.loads(get(vm_url + "/api/v1/query?" + params))["data"]["result"]
    return {row["metric"].get("job", ""): int(float(row["value"][1])) for row in data}


def prometheus_phase(args, work: Path, etc: Path, rules: Path, prom: dict, processes: dict) -> dict:
    say("Prometheus %s: same scrape configuration, %d s warm-up then %d s measured ..."
        % (prom["version"], args.prometheus_warmup, args.prometheus_live))
    accepted = prometheus_rules(rules, work / "prom-rules", prom["promtool"])
    config = prometheus_config(etc / "scrape.yml", work / "prom-rules", work / "prometheus.yml")
    url = "http://%s" % PROMETHEUS_ADDRESS
    processes["prometheus"] = start("prometheus", with_share(prom["share"], [
        str(prom["prometheus"]), "--config.file=%s" % config, "--storage.tsdb.path=%s" % (work / "prom-data"),
        "--storage.tsdb.retention.time=400d", "--web.listen-address=%s" % PROMETHEUS_ADDRESS]),
        work, url + "/-/ready")
    time.sleep(args.prometheus_warmup)
    sampler = Sampler({n: processes[n].pid for n in ("prometheus", "alertmanager")})
    sampler.start()
    longest: dict[str, float] = {}
    end = time.monotonic() + args.prometheus_live
    while time.monotonic() < end:
        for group, value in prometheus_groups(get(url + "/metrics").decode()).items():
            longest[group] = max(longest.get(group, 0.0), value)
        time.sleep(min(15, max(0.0, end - time.monotonic())))
    sampler.halt.set()
    sampler.join()
    page = get(url + "/metrics").decode()
    head = sum(v for _l, v in metric_samples(page, "prometheus_tsdb_head_series"))
    failures = sum(v for _l, v in metric_samples(page, "prometheus_rule_evaluation_failures_total"))
    stop(processes.pop("prometheus"))
    return {"version": prom["version"], "usage": usage(sampler.samples, ["prometheus"])["prometheus"],
            "rule_groups_max_s": {k: round(v, 4) for k, v in sorted(longest.items())},
            "rules": accepted, "head_series": int(head), "rule_evaluation_failures": int(failures)}


# ------------------------------------------------------------------------------------------------- report
PANEL_GOAL_MS = 300
GOALS = {"rss_mib": 1024, "cores": 0.5, "bytes_per_sample": 1.0, "group_s": 1.0}


def _by_nodes(results: list[dict]) -> dict[int, list[dict]]:
    grouped: dict[int, list[dict]] = {}
    for record in results:
        if record.get("ok"):
            grouped.setdefault(record["nodes"], []).append(record)
    return dict(sorted(grouped.items()))


def report_tables(results: list[dict]) -> str:
    """Markdown tables: resources per N (min / median / max over the runs), rule groups and panels at the largest
    N, the panels over the goal, Prometheus beside the stack."""
    spread = deploy_plot.spread
    grouped = _by_nodes(results)
    rows = ["| nodes | runs | RSS together MiB (VM / vmalert / AM) | CPU cores together (VM / vmalert / AM) |"
            " bytes/sample (all / live) | active series | scrape p99 ms (node / dcgm) | backfill |",
            "|---|---|---|---|---|---|---|---|"]
    for nodes, records in grouped.items():
        def u(name, key):
            return spread([r["usage"][name][key] for r in records])
        rows.append("| %d | %d | %s (%s / %s / %s) | %s (%s / %s / %s) | %s / %s | %s | %s / %s | %s |" % (
            nodes, len(records), u("together", "peak_rss_mib"), u("victoriametrics", "peak_rss_mib"),
            u("vmalert", "peak_rss_mib"), u("alertmanager", "peak_rss_mib"), u("together", "cores"),
            u("victoriametrics", "cores"), u("vmalert", "cores"), u("alertmanager", "cores"),
            spread([r["storage"]["bytes_per_sample"] for r in records]),
            spread([r["storage"]["live_bytes_per_sample"] or 0 for r in records]),
            spread([r["storage"]["active_series"] for r in records]),
            spread([r["scrape"].get("node", {}).get("p99_ms", 0) for r in records]),
            spread([r["scrape"].get("dcgm", {}).get("p99_ms", 0) for r in records]),
            "%d s step, %d points, %s s" % (records[0]["backfill"]["step_s"], records[0]["backfill"]["points_per_series"],
                                            spread([r["backfill"]["seconds"] for r in records]))))
    out = ["\n".join(rows)]
    if not grouped:
        return out[0]
    nodes, records = list(grouped.items())[-1]
    groups = sorted({g for r in records for g in r["rule_groups"]})
    rows = ["| rule group (%d nodes) | vmalert mean s | vmalert p99 s | Prometheus max s |" % nodes, "|---|---|---|---|"]
    for group in groups:
        prom = [r["prometheus"]["rule_groups_max_s"][group] for r in records
                if group in (r.get("prometheus") or {}).get("rule_groups_max_s", {})]
        rows.append("| %s | %s | %s | %s |" % (
            group, spread([r["rule_groups"][group]["mean_s"] or 0 for r in records if group in r["rule_groups"]]),
            spread([r["rule_groups"][group]["p99_s"] or 0 for r in records if group in r["rule_groups"]]),
            spread(prom) if prom else "not run (refused)" if any(r.get("prometheus") for r in records) else "-"))
    out.append("\n".join(rows))
    costly: dict[tuple, list[dict]] = {}
    for record in records:
        for rule in record.get("rules") or []:
            costly.setdefault((rule["group"], rule["rule"]), []).append(rule)
    if costly:
        rows = ["| costliest rules (%d nodes, last evaluation) | seconds | series fetched |" % nodes, "|---|---|---|"]
        for (group, rule), runs in sorted(costly.items(), key=lambda kv: -statistics.median(
                r["seconds"] for r in kv[1]))[:10]:
            rows.append("| %s / %s | %s | %s |" % (group, rule, spread([r["seconds"] for r in runs]),
                                                  spread([r["series_fetched"] for r in runs])))
        out.append("\n".join(rows))
    proms = [r["prometheus"] for r in records if r.get("prometheus")]
    if proms:
        out.append("| %d nodes | RSS MiB (peak) | CPU cores | rule groups run |\n|---|---|---|---|\n"
                   "| VictoriaMetrics + vmalert + Alertmanager | %s | %s | %d of %d |\n"
                   "| Prometheus %s (+ the same Alertmanager, not counted) | %s | %s | %d of %d |" % (
                       nodes, spread([r["usage"]["together"]["peak_rss_mib"] for r in records]),
                       spread([r["usage"]["together"]["cores"] for r in records]), len(groups), len(groups),
                       proms[0]["version"], spread([p["usage"]["peak_rss_mib"] for p in proms]),
                       spread([p["usage"]["cores"] for p in proms]), len(proms[0]["rules"]["kept"]), len(groups)))
    panels = panel_figures(records)
    slow = [p for p in panels if p["p95_ms"] is not None and p["p95_ms"] > PANEL_GOAL_MS]
    rows = ["| panel (%d nodes, 24 h) | p50 ms | p95 ms | series |" % nodes, "|---|---|---|---|"]
    for panel in sorted(slow, key=lambda p: -p["p95_ms"]):
        rows.append("| %s / %s (%s) | %.0f | %.0f | %d |" % (panel["dashboard"], panel["panel"], panel["ref"],
                                                            panel["p50_ms"], panel["p95_ms"], panel["series"]))
    out.append("%d panel queries, %d over %d ms at p95%s" % (len(panels), len(slow), PANEL_GOAL_MS,
                                                             ":\n\n" + "\n".join(rows) if slow else "."))
    return "\n\n".join(out)


def panel_figures(records: list[dict]) -> list[dict]:
    """Per panel query: p50 and p95 over the repetitions of every run together."""
    merged: dict[tuple, dict] = {}
    for record in records:
        for position, panel in enumerate(record.get("panels") or []):  # the same order in every run
            key = (position, panel["dashboard"], panel["panel"], panel["ref"])
            entry = merged.setdefault(key, {"dashboard": key[1], "panel": key[2], "ref": key[3], "runs_ms": [],
                                            "series": panel["series"], "error": panel["error"]})
            entry["runs_ms"].extend(panel.get("runs_ms") or [p for p in (panel["p50_ms"], panel["p95_ms"]) if p])
    for entry in merged.values():
        runs = entry["runs_ms"]
        entry["p50_ms"] = round(statistics.median(runs), 1) if runs else None
        entry["p95_ms"] = round(percentile(runs, 95), 1) if runs else None
    return list(merged.values())


def plots(results: list[dict], out: Path) -> list[Path]:
    """mgmt-resources.png (RSS and CPU against N), mgmt-rule-groups.png, mgmt-panels.png (the largest N)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    grouped = _by_nodes(results)
    if not grouped:
        return []
    written = []
    names = ["victoriametrics", "vmalert", "alertmanager", "together"]
    xs = list(grouped)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=110)
    for name in names:
        left.plot(xs, [statistics.median(r["usage"][name]["peak_rss_mib"] for r in grouped[n]) for n in xs], "-o",
                  label=name)
        right.plot(xs, [statistics.median(r["usage"][name]["cores"] for r in grouped[n]) for n in xs], "-o",
                   label=name)
    proms = {n: [r["prometheus"] for r in grouped[n] if r.get("prometheus")] for n in xs}
    px = [n for n in xs if proms[n]]
    if px:
        left.plot(px, [statistics.median(p["usage"]["peak_rss_mib"] for p in proms[n]) for n in px], "--s",
                  label="Prometheus (comparison)")
        right.plot(px, [statistics.median(p["usage"]["cores"] for p in proms[n]) for n in px], "--s",
                   label="Prometheus (comparison)")
    left.axhline(GOALS["rss_mib"], color="grey", linestyle=":", label="goal (together)")
    right.axhline(GOALS["cores"], color="grey", linestyle=":", label="goal (together)")
    for ax, label in ((left, "peak RSS (MiB)"), (right, "CPU (cores, live phase)")):
        ax.set_xticks(xs)
        ax.set_xlabel("GPU nodes (8 GPUs each)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    left.legend(fontsize=7)
    fig.suptitle("Management host: resources against the fleet size (median of the runs)")
    fig.tight_layout()
    written.append(out / "mgmt-resources.png")
    fig.savefig(written[-1])
    plt.close(fig)

    nodes, records = list(grouped.items())[-1]
    groups = sorted({g for r in records for g in r["rule_groups"]})
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(groups) + 1.5), dpi=110)
    ys = range(len(groups))
    vm = [max(r["rule_groups"][g]["p99_s"] or 0 for r in records if g in r["rule_groups"]) for g in groups]
    ax.barh([y + 0.2 for y in ys], vm, height=0.4, label="vmalert (p99)")
    prom = [max([r["prometheus"]["rule_groups_max_s"].get(g, 0) for r in records if r.get("prometheus")] or [0])
            for g in groups]
    if any(prom):
        ax.barh([y - 0.2 for y in ys], prom, height=0.4, label="Prometheus (max)")
    ax.axvline(GOALS["group_s"], color="grey", linestyle=":", label="goal")
    ax.set_yticks(list(ys))
    ax.set_yticklabels(groups, fontsize=8)
    ax.set_xlabel("evaluation time of one iteration (s)")
    ax.set_title("Rule groups at %d nodes" % nodes)
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out / "mgmt-rule-groups.png")
    fig.savefig(written[-1])
    plt.close(fig)

    panels = sorted((p for p in panel_figures(records) if p["p95_ms"] is not None), key=lambda p: p["p95_ms"])
    fig, ax = plt.subplots(figsize=(9, 0.16 * len(panels) + 1.5), dpi=110)
    ax.barh(range(len(panels)), [p["p95_ms"] for p in panels],
            color=["lightgrey" if not p["series"] else "tab:red" if p["p95_ms"] > PANEL_GOAL_MS else "tab:blue"
                   for p in panels])
    ax.set_yticks(range(len(panels)))
    ax.set_yticklabels(["%s / %s (%s)" % (p["dashboard"].replace("hpcobs-", ""), p["panel"][:38], p["ref"])
                        for p in panels], fontsize=5.5)
    ax.axvline(PANEL_GOAL_MS, color="grey", linestyle=":", label="goal (300 ms)")
    ax.set_xscale("log")
    ax.set_xlabel("p95 of the panel query over 24 h (ms, log scale)")
    ax.set_title("Dashboard panels at %d nodes (grey: no data in this benchmark)" % nodes)
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out / "mgmt-panels.png")
    fig.savefig(written[-1])
    plt.close(fig)
    return written


def report_main(args) -> int:
    results = json.loads(Path(args.results).read_text())
    print(report_tables(results))
    for path in plots(results, Path(args.plots)):
        print("wrote %s" % path.relative_to(REPO) if path.is_relative_to(REPO) else path)
    return 0


# ---------------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="the load generator alone (started by a run)")
    serve.add_argument("--file-sd", required=True)
    serve.add_argument("--seed", type=int, default=1)
    serve.add_argument("--ref", type=float, required=True)
    serve.add_argument("--seconds", type=float, default=600)
    serve.add_argument("--ready")
    report = sub.add_parser("report", help="Markdown tables of the results and the plots")
    report.add_argument("--results", default=str(OUT / "results.json"))
    report.add_argument("--plots", default=str(REPO / "docs" / "performance"))
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--history", type=int, default=86400, help="seconds of history backfilled")
    parser.add_argument("--backfill-step", type=int, default=3600, help="seconds between backfilled samples")
    parser.add_argument("--warmup", type=int, default=90)
    parser.add_argument("--live", type=int, default=420, help="seconds measured")
    parser.add_argument("--repeat", type=int, default=3, help="runs of every panel query (0: none)")
    parser.add_argument("--prometheus-warmup", type=int, default=60)
    parser.add_argument("--prometheus-live", type=int, default=240)
    parser.add_argument("--no-prometheus", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="20 nodes, 1 h of history, ~1 min live")
    parser.add_argument("--keep", action="store_true", help="keep the run's directory")
    parser.add_argument("--rule-vars", type=json.loads, default={}, metavar="JSON",
                        help="vmalert role settings for the rules, e.g. '{\"vmalert_rules_concurrency\": 1}' (an A/B "
                             "of a rule setting; recorded with the run)")
    parser.add_argument("--scrape-vars", type=json.loads, default={}, metavar="JSON",
                        help="victoriametrics role settings for the scrape configuration, e.g. "
                             "'{\"victoriametrics_scrape_jobs_overrides\": {\"dcgm\": {\"config\": "
                             "{\"metric_relabel_configs\": []}}}}' (an A/B of a scrape setting; recorded with the run)")
    parser.add_argument("--vm-args", type=vm_flags, default=[], metavar="JSON",
                        help="more victoria-metrics flags, e.g. '[\"-memory.allowedBytes=512MiB\"]' (an A/B of a "
                             "flag; recorded with the run)")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve_main(args)
    if args.command == "report":
        return report_main(args)
    if args.smoke:
        args.nodes, args.runs, args.history, args.backfill_step = [20], 1, 3600, 60
        args.warmup, args.live, args.repeat, args.prometheus_warmup, args.prometheus_live = 15, 30, 1, 10, 20
    out = Path(args.out).resolve()  # the binaries it unpacks there run from the run's own directory
    out.mkdir(parents=True, exist_ok=True)
    bins = binaries(out / "bin")
    debian = debian_prometheus(out / "debian")
    bins["share"] = debian["share"]
    prom = None if args.no_prometheus else debian
    results_path = out / ("smoke.json" if args.smoke else "results.json")
    results = json.loads(results_path.read_text()) if results_path.exists() and not args.smoke else []
    failed = 0
    for nodes in args.nodes:
        for run in range(1, args.runs + 1):
            args.nodes = nodes
            began = time.monotonic()
            try:
                record = run_once(args, run, bins, prom)
            except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
                say("run %d at %d nodes failed: %s" % (run, nodes, exc))
                record, failed = {"nodes": nodes, "run": run, "ok": False, "error": str(exc)[:2000]}, failed + 1
            record["wall_s"] = round(time.monotonic() - began, 1)
            for problem in record.get("problems") or []:
                say("run %d at %d nodes: PROBLEM: %s" % (run, nodes, problem))
            if args.smoke and record.get("problems"):
                failed += 1
            results.append(record)
            results_path.write_text(json.dumps(results, indent=1) + "\n")
            say("run %d at %d nodes: %.0f s; %s" % (run, nodes, record["wall_s"], results_path))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
