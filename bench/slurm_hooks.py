#!/usr/bin/env python3
"""Latency of the Slurm prolog/epilog hooks (roles/slurm_hooks/files).

For each variant, runs the prolog then the epilog of a job on N GPUs (default 8),
--runs times, each hook started the way slurmd starts it (fork + exec of the
script, no PATH, a handful of SLURM_* variables), and prints p50/p99/max in ms for
the prolog, the epilog and the pair, wall time and the CPU time the hook and its children used (less
sensitive to a busy machine than wall time), and the commands one pair runs besides the hooks (counted with
strace -f, when strace is installed: each costs a fork + exec). Variants:

  dir    the hooks with LOCK_SCOPE=dir (the default: one lock per mapping dir)
  gpu    the hooks with LOCK_SCOPE=gpu (one lock per mapping file)
  naive  bench/naive_slurm_hook.sh (append / sed -i, no lock, no atomicity)

A "burst" then starts --burst-gpus single-GPU jobs on distinct GPUs at the same
instant (a node filling up) and times until the last prolog is done, which is
where a directory-wide lock would hurt if it were going to.

The floor of the measurement (fork + exec + wait of /bin/true from here) is
printed too. The mapping dir is created under /dev/shm (tmpfs, like /run) and the
textfile dir under /var/tmp (disk, like /var/lib), unless told otherwise.

usage: python3 bench/slurm_hooks.py [--runs 1000] [--gpus 8] [--others 1]
                                    [--variants dir,gpu,naive] [--shell /bin/sh]
Target: prolog + epilog pair p99 <= 5 ms for the default variant on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROLOG = REPO / "roles" / "slurm_hooks" / "files" / "hpcobs-slurm-prolog"
EPILOG = REPO / "roles" / "slurm_hooks" / "files" / "hpcobs-slurm-epilog"
NAIVE = REPO / "bench" / "naive_slurm_hook.sh"
TARGET_P99_MS = 5.0
CPU: list[float] = []  # CPU ms of every run_timed call, in order


def spawn(argv: list[str], env: dict[str, str]) -> int:
    pid = os.posix_spawn(argv[0], argv, env)
    return pid


def run_timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter_ns()
    pid = spawn(argv, env)
    _, status, usage = os.wait4(pid, 0)
    dt = (time.perf_counter_ns() - t0) / 1e6
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} exited {os.waitstatus_to_exitcode(status)}")
    CPU.append((usage.ru_utime + usage.ru_stime) * 1e3)
    return dt


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(p / 100 * len(s) + 0.5) - 1))
    return s[k]


def summary(values: list[float]) -> str:
    return f"p50 {pct(values, 50):6.2f}  p99 {pct(values, 99):6.2f}  max {max(values):6.2f}"


class Node:
    def __init__(self, map_base: str, tf_base: str):
        self.map = Path(tempfile.mkdtemp(prefix="hpcobs-bench-map-", dir=map_base))
        self.tf = Path(tempfile.mkdtemp(prefix="hpcobs-bench-tf-", dir=tf_base))
        # the hooks read only a config that nobody but root can change, in a directory likewise (not /var/tmp)
        self.private = Path(tempfile.mkdtemp(prefix="hpcobs-bench-conf-", dir=tf_base))
        self.conf = self.private / "slurm-hooks.conf"
        self.logfile = self.private / "hooks.log"
        self.logger = self.private / "logger"
        self.logger.write_text(
            f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{self.logfile}'\n"
        )
        self.logger.chmod(0o755)

    def configure(self, scope: str):
        self.conf.write_text(
            f"MAPPING_DIR='{self.map}'\nTEXTFILE_DIR='{self.tf}'\nLOCK_SCOPE='{scope}'\n"
        )

    def reset(self, gpus: int, others: int):
        for d in (self.map, self.tf):
            for p in d.iterdir():
                if p.is_dir():
                    shutil.rmtree(p)
                else:
                    p.unlink()
        # jobs sharing the GPUs (their ids must survive every run)
        for g in range(gpus):
            (self.map / str(g)).write_text(
                "".join(f"{900000 + k}\n" for k in range(others))
            )

    def env(self, job: int, gpus: str) -> dict[str, str]:
        return {
            "SLURM_JOB_ID": str(job),
            "SLURM_JOB_GPUS": gpus,
            "CUDA_VISIBLE_DEVICES": gpus,
            "SLURM_JOB_USER": "alice",
            "SLURM_JOB_ACCOUNT": "physics",
            "SLURM_JOB_PARTITION": "gpu",
            "SLURM_JOB_UID": "1000",
            "HPCOBS_SLURM_HOOKS_CONF": str(self.conf),
            "LOGGER": str(self.logger),
            "MAPPING_DIR": str(self.map),
            "TEXTFILE_DIR": str(self.tf),
        }

    def check(self, gpus: int, others: int, variant: str):
        want = "".join(f"{900000 + k}\n" for k in range(others))
        for g in range(gpus):
            got = (self.map / str(g)).read_text()
            if got != want:
                print(
                    f"  !! {variant}: GPU file {g} ends as {got[:60]!r}, expected {want!r}"
                )
        if self.logfile.exists() and self.logfile.stat().st_size:
            print(f"  !! {variant}: hooks logged: {self.logfile.read_text()[:300]!r}")
            self.logfile.unlink()

    def cleanup(self):
        shutil.rmtree(self.map, ignore_errors=True)
        shutil.rmtree(self.tf, ignore_errors=True)
        shutil.rmtree(self.private, ignore_errors=True)


def commands(variant: str, shell: list[str]):
    if variant == "naive":
        return [*shell, str(NAIVE), "prolog"], [*shell, str(NAIVE), "epilog"]
    return [*shell, str(PROLOG)], [*shell, str(EPILOG)]


def commands_run(pro: list[str], epi: list[str], env: dict[str, str]) -> str:
    """The commands one prolog + epilog pair runs besides the hooks themselves (strace -f, execve)."""
    strace = shutil.which("strace")
    if not strace:
        return "not counted (no strace)"
    names = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, argv in enumerate((pro, epi)):
            out = Path(tmp) / f"{k}.strace"
            subprocess.run([strace, "-f", "-qq", "-e", "trace=execve", "-o", str(out), *argv], env=env, check=True)
            execs = [line for line in out.read_text().splitlines() if 'execve("' in line and line.endswith("= 0")]
            names += [line.split('execve("', 1)[1].split('"', 1)[0].rsplit("/", 1)[-1] for line in execs[1:]]
    return f"{len(names)} ({' '.join(names)})"


def bench_pairs(node: Node, variant: str, shell, runs: int, gpus: int, others: int):
    node.reset(gpus, others)
    if variant != "naive":
        node.configure(variant)
    pro, epi = commands(variant, shell)
    gpu_list = ",".join(str(g) for g in range(gpus))
    for i in range(20):  # warm-up: page cache, staging dir, lock file
        env = node.env(10 + i, gpu_list)
        run_timed(pro, env)
        run_timed(epi, env)
    tp, te, tt = [], [], []
    CPU.clear()
    for i in range(runs):
        env = node.env(1000 + i, gpu_list)
        a = run_timed(pro, env)
        b = run_timed(epi, env)
        tp.append(a)
        te.append(b)
        tt.append(a + b)
    cpu = [CPU[k] + CPU[k + 1] for k in range(0, len(CPU), 2)]
    cmds = commands_run(pro, epi, node.env(999999, gpu_list))
    node.check(gpus, others, variant)
    return tp, te, tt, cpu, cmds


def bench_burst(node: Node, variant: str, shell, runs: int, width: int):
    node.reset(width, 0)
    if variant != "naive":
        node.configure(variant)
    pro, epi = commands(variant, shell)
    walls = []
    for r in range(runs):
        jobs = [(100000 + r * width + g, str(g)) for g in range(width)]
        t0 = time.perf_counter_ns()
        pids = [spawn(pro, node.env(j, g)) for j, g in jobs]
        for pid in pids:
            os.waitpid(pid, 0)
        walls.append((time.perf_counter_ns() - t0) / 1e6)
        pids = [spawn(epi, node.env(j, g)) for j, g in jobs]
        for pid in pids:
            os.waitpid(pid, 0)
    node.check(width, 0, variant)
    return walls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument(
        "--others", type=int, default=1, help="other jobs' ids already in each GPU file"
    )
    ap.add_argument("--variants", default="dir,gpu,naive")
    ap.add_argument("--burst-runs", type=int, default=200)
    ap.add_argument("--burst-gpus", type=int, default=8)
    ap.add_argument(
        "--shell",
        default="",
        help="run the scripts with this shell instead of their #!",
    )
    ap.add_argument(
        "--map-base", default="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    ap.add_argument("--textfile-base", default="/var/tmp")
    args = ap.parse_args()
    shell = [shutil.which(args.shell) or args.shell] if args.shell else []
    if args.runs < 1 or args.gpus < 1:
        ap.error("--runs and --gpus must be positive")

    sh = Path(os.path.realpath("/bin/sh")).name
    print(
        f"hooks benchmark: {args.runs} runs, job on {args.gpus} GPUs, {args.others} other"
        f" job(s) per GPU file, shell {args.shell or f'#! (/bin/sh -> {sh})'},"
        f" {os.cpu_count()} CPU(s)"
    )
    print("load average at start: %.2f %.2f %.2f" % os.getloadavg())
    floor = [run_timed(["/bin/true"], {}) for _ in range(args.runs)]
    print(f"{'floor: fork+exec+wait /bin/true':36s} {summary(floor)}  ms")

    node = Node(args.map_base, args.textfile_base)
    results = {}
    try:
        for variant in [v for v in args.variants.split(",") if v]:
            label = {
                "dir": "hooks LOCK_SCOPE=dir (default)",
                "gpu": "hooks LOCK_SCOPE=gpu",
            }.get(variant, "naive (append / sed -i, no lock)")
            tp, te, tt, cpu, cmds = bench_pairs(
                node, variant, shell, args.runs, args.gpus, args.others
            )
            results[variant] = tt
            print(f"{label}")
            print(f"{'  commands run per pair':36s} {cmds}")
            print(f"{'  prolog':36s} {summary(tp)}  ms")
            print(f"{'  epilog':36s} {summary(te)}  ms")
            print(f"{'  prolog + epilog':36s} {summary(tt)}  ms")
            print(f"{'  prolog + epilog, CPU time':36s} {summary(cpu)}  ms")
            if args.burst_runs > 0:
                walls = bench_burst(
                    node, variant, shell, args.burst_runs, args.burst_gpus
                )
                print(
                    f"{f'  burst: {args.burst_gpus} prologs at once':36s} {summary(walls)}  ms (wall, all done)"
                )
    finally:
        node.cleanup()

    print("load average at end:   %.2f %.2f %.2f" % os.getloadavg())
    if "dir" in results:
        worst = pct(results["dir"], 99)
        verdict = "met" if worst <= TARGET_P99_MS else "NOT met"
        print(
            f"target prolog + epilog p99 <= {TARGET_P99_MS:g} ms (default variant, quiet machine):"
            f" {verdict} ({worst:.2f} ms)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
