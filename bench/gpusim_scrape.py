#!/usr/bin/env python3
"""Scrape-latency benchmark for the GPU simulator.

Starts roles/lab_gpu_simulator/files/hpcobs-gpusim (the launcher of its
hpcobs_gpusim package) on a free loopback port
with 8 GPUs and a counters CSV of the first 30 metric fields of the canonical
hpcobs CSV (plus its DCGM_FI_DRIVER_VERSION label row), maps one Slurm job to
half of the GPUs, scrapes /metrics 100 times over HTTP and prints the median,
90th percentile and maximum scrape time in milliseconds.

    python3 bench/gpusim_scrape.py [--gpus 8] [--fields 30] [--scrapes 100]
"""

import argparse
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROG = ROOT / "roles" / "lab_gpu_simulator" / "files" / "hpcobs-gpusim"
COUNTERS = ROOT / "roles" / "dcgm_exporter" / "files" / "hpcobs-counters.csv"


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_csv(path, fields):
    metric_rows, label_rows = [], []
    for line in COUNTERS.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        kind = line.split(",")[1].strip()
        (label_rows if kind == "label" else metric_rows).append(line)
    if len(metric_rows) < fields:
        sys.exit("the canonical CSV has only %d metric fields" % len(metric_rows))
    path.write_text("\n".join(metric_rows[:fields] + label_rows) + "\n")


def percentile(values, pct):
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--fields", type=int, default=30)
    parser.add_argument("--scrapes", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="gpusim-bench-"))
    proc = None
    try:
        csv_path = work / "counters.csv"
        build_csv(csv_path, args.fields)
        mapping = work / "map"
        mapping.mkdir()
        for gpu in range(0, args.gpus, 2):
            (mapping / str(gpu)).write_text("%d\n" % (1000 + gpu))
        port = free_port()
        env = dict(os.environ, HPCOBS_GPUSIM_CONFIG="none")
        proc = subprocess.Popen(
            [str(PROG), "-f", str(csv_path), "-a", "127.0.0.1:%d" % port,
             "--hpc-job-mapping-dir", str(mapping), "--sim-gpus", str(args.gpus),
             "--sim-state-dir", str(work / "state"), "--sim-hostname", "bench-node"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = "http://127.0.0.1:%d/metrics" % port
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    resp.read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    sys.exit("simulator did not start")
                time.sleep(0.05)
        for _ in range(args.warmup):
            with urllib.request.urlopen(url, timeout=5) as resp:
                resp.read()
        times, size, series = [], 0, 0
        for _ in range(args.scrapes):
            start = time.perf_counter()
            with urllib.request.urlopen(url, timeout=5) as resp:
                body = resp.read()
            times.append((time.perf_counter() - start) * 1000.0)
            size = len(body)
            series = sum(1 for line in body.splitlines() if not line.startswith(b"#"))
        print("hpcobs-gpusim scrape benchmark: %d GPUs, %d metric fields, %d scrapes"
              % (args.gpus, args.fields, args.scrapes))
        print("response: %d series, %d bytes" % (series, size))
        print("median %.2f ms  p90 %.2f ms  max %.2f ms"
              % (statistics.median(times), percentile(times, 90), max(times)))
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
