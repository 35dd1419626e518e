#!/usr/bin/env python3
"""Deploy at scale: the GPU-node play on N light systemd containers, reached over SSH as a site reaches its nodes.

For each N: N fresh containers (bench/deploy/Containerfile: the test image plus sshd, slurmd and the OS packages
a node image has) on their own podman network, then
  full         playbooks/gpu_nodes.yml + playbooks/slurm.yml (node_exporter, the GPU simulator as dcgm-exporter,
               ipmi_exporter, smartctl_exporter, the log shipper, the Slurm hooks): first converge, no-op rerun
  baseline     the project's node_exporter role alone (bench/deploy/node_exporter.yml) on N other fresh
               containers: first converge, no-op rerun
Each run records wall time, tasks per host (ok + skipped, from the recap), changed tasks, controller CPU seconds
(ansible-playbook, its workers and the SSH clients and multiplexers) and the controller's peak RSS (all of those
together). Results go to --out (results.json, one log per run); bench/plot.py draws them.

  bench/deploy.py --nodes 10 50 100 200 [--runs 3] [--connection ssh|nsenter] [--plays full baseline]
  bench/deploy.py --smoke          1 node, the baseline play (make test's version, about a minute); the full
                                   play's one-node deploy is bench/cardinality.py's, also in make test
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent / "deploy"
IMAGE = "localhost/hpcobs-bench-node"
BASE_IMAGE = "localhost/hpcobs-debian12"
NETWORK = "hpcobs-bench"
PREFIX = "hpcobs-bench-"
PLAYS = {
    "full": [REPO / "playbooks" / "gpu_nodes.yml", REPO / "playbooks" / "slurm.yml"],
    "baseline": [HERE / "node_exporter.yml"],
}
# The lab's GPU-node settings (inventories/lab/group_vars/gpu_nodes.yml): the simulator serves dcgm-exporter's port.
GPU_NODE_VARS = {
    "lab_gpu_simulator_enabled": True,
    "lab_gpu_simulator_journal": "journal-remote",
    "dcgm_exporter_install_method": "none",
    "dcgm_exporter_executable": "/usr/local/bin/hpcobs-gpusim",
    "dcgm_exporter_remote_hostengine": "",
    "dcgm_exporter_device_allow": [],
    "dcgm_exporter_state_directory": "hpcobs-gpusim",
}
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)"
                   r"\s+rescued=(\d+)\s+ignored=(\d+)")


def say(message: str) -> None:
    print("bench-deploy: %s" % message, flush=True)


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], check=check, text=True, capture_output=True)


def build_image() -> None:
    """The node image, rebuilt when its Containerfile or the base image changes (label hpcobs.key)."""
    base = podman("image", "inspect", "--format", "{{.Id}}", BASE_IMAGE, check=False)
    if base.returncode != 0:
        sys.exit("bench-deploy: %s is missing: run scripts/build-images.sh debian12 (make images) first" % BASE_IMAGE)
    key = hashlib.sha256(((HERE / "Containerfile").read_text() + base.stdout.strip()).encode()).hexdigest()[:20]
    current = podman("image", "inspect", "--format", '{{ index .Labels "hpcobs.key" }}', IMAGE, check=False)
    if current.returncode == 0 and current.stdout.strip() == key:
        return
    say("building %s (apt from the test image's mirror, once) ..." % IMAGE)
    result = subprocess.run(["podman", "build", "--label", "hpcobs.key=%s" % key, "-t", IMAGE,
                             "-f", str(HERE / "Containerfile"), str(HERE)], text=True, capture_output=True)
    if result.returncode != 0:
        sys.exit("bench-deploy: building %s failed:\n%s" % (IMAGE, (result.stdout + result.stderr)[-3000:]))


def ensure_key(directory: Path) -> Path:
    """The benchmark's SSH key in directory (made once); its .pub goes into every node's authorized_keys."""
    key = directory / "id_ed25519"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hpcobs-bench", "-f", str(key)], check=True)
    return key


def remove_nodes() -> None:
    names = podman("ps", "-a", "--format", "{{.Names}}", "--filter", "name=^" + PREFIX, check=False).stdout.split()
    if names:
        podman("rm", "-f", "-t", "0", *names, check=False)


INOTIFY_LIMIT = Path("/proc/sys/fs/inotify/max_user_instances")


def inotify_instances_needed(count: int) -> int:
    """Every systemd container holds inotify instances of root's one budget (PID 1, journald, logind, dbus, then
    the exporters): about 5 per booted node were measured (the 26th node of a stock host, limit 128, exits 255 at
    boot), so 16 per node leaves room for what the deploy starts, plus the host's own."""
    return 256 + 16 * count


def ensure_inotify_limit(count: int) -> None:
    """Raise fs.inotify.max_user_instances for this boot when count nodes need more (not persistent: nothing in
    /etc/sysctl.d changes), saying so; a stock host's 128 stops systemd in the containers from booting."""
    needed = inotify_instances_needed(count)
    current = int(INOTIFY_LIMIT.read_text())
    if current >= needed:
        return
    INOTIFY_LIMIT.write_text("%d\n" % needed)
    say("fs.inotify.max_user_instances raised from %d to %d for %d nodes (until reboot; systemd in a container "
        "does not boot without its inotify instances)" % (current, needed, count))


def start_nodes(count: int, pubkey: Path) -> dict[str, str]:
    """count fresh node containers; returns {inventory name: address} once every sshd answers."""
    remove_nodes()
    ensure_inotify_limit(count)
    if podman("network", "exists", NETWORK, check=False).returncode != 0:
        podman("network", "create", NETWORK)
    names = ["gpu%03d" % i for i in range(1, count + 1)]

    def run(name: str) -> str:
        podman("run", "-d", "--name", PREFIX + name, "--hostname", name, "--network", NETWORK,
               "--systemd", "always", "--cap-add", "SYS_ADMIN,MKNOD",
               "-v", "%s:/root/.ssh/authorized_keys:ro" % pubkey, IMAGE, "/sbin/init")
        address = podman("inspect", "--format",
                         '{{ (index .NetworkSettings.Networks "%s").IPAddress }}' % NETWORK, PREFIX + name).stdout.strip()
        deadline = time.monotonic() + 120
        while True:
            state = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", PREFIX + name,
                           check=False).stdout.split()
            if state and state[0] == "exited":
                raise RuntimeError("%s: the container exited (code %s) before sshd answered: `podman logs %s%s`; "
                                   "a systemd container that exits 255 at boot lacks inotify instances "
                                   "(fs.inotify.max_user_instances)" % (name, state[1:], PREFIX, name))
            try:
                with socket.create_connection((address, 22), timeout=2) as conn:
                    if conn.recv(4).startswith(b"SSH-"):
                        return address
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("%s: sshd did not answer within 120 s" % name)
            time.sleep(0.5)

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        addresses = list(pool.map(run, names))
    return dict(zip(names, addresses))


def write_inventory(path: Path, nodes: dict[str, str], key: Path, connection: str, pki_dir: Path,
                    extra_vars: dict | None = None) -> None:
    all_vars = {
        "hpcobs_pki_dir": str(pki_dir),
        **GPU_NODE_VARS,
        **(extra_vars or {}),
    }
    if connection == "ssh":
        all_vars.update({
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(key),
            # throw-away containers on a private network: their host keys are new on every run
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
        })
        hosts = {name: {"ansible_host": address} for name, address in nodes.items()}
    else:
        all_vars["ansible_connection"] = "hpcobs_nsenter"
        hosts = {name: {"ansible_host": PREFIX + name} for name in nodes}
    inventory = {"all": {"vars": all_vars, "children": {
        # the log shipper's Loki and the scrape side name a management host; the play never reaches it
        "management": {"hosts": {"bench-mgmt": {"ansible_host": "127.0.0.1"}}},
        "gpu_nodes": {"hosts": hosts},
    }}}
    path.write_text(json.dumps(inventory, indent=1))


def proc_stat(pid) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3 on), or None once the process is gone."""
    try:
        return Path("/proc/%s/stat" % pid).read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def session_processes(session: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        fields = proc_stat(entry) if entry.isdigit() else None
        if fields and int(fields[3]) == session:  # field 6 of stat: the session id
            pids.append(int(entry))
    return pids


def rss_bytes(pid: int) -> int:
    try:
        for line in Path("/proc/%d/status" % pid).read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


_MUX_SEEN: dict[tuple[int, str], bool] = {}


def ssh_multiplexers(since: float) -> list[int]:
    """The SSH ControlMaster processes started during the run: they leave the run's session (ControlPersist). A
    process's command line is read once (cached by pid and start time, so a reused pid is read again): the sampler
    must not cost the controller a core itself."""
    ticks = os.sysconf("SC_CLK_TCK")
    boot = time.time() - float(Path("/proc/uptime").read_text().split()[0])
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = proc_stat(entry)
        if not fields or boot + int(fields[19]) / ticks < since - 1:
            continue
        key = (int(entry), fields[19])
        if key not in _MUX_SEEN:
            try:
                _MUX_SEEN[key] = b"[mux]" in Path("/proc/%s/cmdline" % entry).read_bytes()
            except OSError:
                continue
        if _MUX_SEEN[key]:
            pids.append(int(entry))
    return pids


def cpu_seconds(pid: int) -> float:
    fields = proc_stat(pid)
    if fields is None:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_play(playbooks: list[Path], inventory: Path, log: Path, connection: str) -> dict:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               HPCOBS_BUNDLE_DIR=os.environ.get("HPCOBS_BUNDLE_DIR", str(REPO / ".cache/bundle-test/bundle")),
               HPCOBS_BUNDLE_ALLOWED_SIGNERS=os.environ.get(
                   "HPCOBS_BUNDLE_ALLOWED_SIGNERS", str(REPO / ".cache/signing/allowed_signers")))
    if connection == "nsenter":
        env["ANSIBLE_CONNECTION_PLUGINS"] = str(REPO / "molecule" / "shared" / "connection_plugins")
    command = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), *map(str, playbooks)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started_wall = time.time()
    started = time.monotonic()
    peak = 0
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                   start_new_session=True)
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                total = sum(rss_bytes(pid) for pid in session_processes(process.pid))
                total += sum(rss_bytes(pid) for pid in ssh_multiplexers(started_wall))
                peak = max(peak, total)
                stop.wait(1.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rc = process.wait()
        stop.set()
        sampler.join()
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cpu += sum(cpu_seconds(pid) for pid in ssh_multiplexers(started_wall))
    return {"rc": rc, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "peak_rss_mib": round(peak / 2**20),
            **recap_figures(log.read_text(), gpu_nodes=lambda name: name.startswith("gpu"))}


def recap_figures(output: str, gpu_nodes) -> dict:
    """Tasks per host, changed tasks and failed hosts from a run's PLAY RECAP, for the hosts gpu_nodes(name) keeps
    (a host of several plays has one recap line holding every play's tasks; ok counts changed ones too)."""
    hosts = {}
    for line in output.splitlines():
        match = RECAP.match(line)
        if match and gpu_nodes(match.group(1)):
            ok, changed, unreachable, failed, skipped = (int(match.group(i)) for i in range(2, 7))
            hosts[match.group(1)] = {"ok": ok, "changed": changed, "failed": failed + unreachable, "skipped": skipped}
    return {"hosts": len(hosts),
            "tasks_per_host": max((h["ok"] + h["skipped"] for h in hosts.values()), default=0),
            "ok_per_host": max((h["ok"] for h in hosts.values()), default=0),
            "changed": sum(h["changed"] for h in hosts.values()),
            "failed_hosts": sorted(name for name, h in hosts.items() if h["failed"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[10])
    parser.add_argument("--runs", type=int, default=1, help="repetitions of each (N, play) on fresh containers")
    parser.add_argument("--connection", choices=["ssh", "nsenter"], default="ssh")
    parser.add_argument("--plays", nargs="+", choices=sorted(PLAYS), default=None,
                        help="default: full and baseline (--smoke: baseline)")
    parser.add_argument("--out", type=Path, default=REPO / ".cache" / "bench" / "deploy")
    parser.add_argument("--smoke", action="store_true", help="1 node, the baseline play (unless --plays says "
                        "otherwise), one run; fails on any goal that does not depend on scale (rc 0, nothing changed "
                        "on the rerun)")
    parser.add_argument("--keep", action="store_true", help="leave the last containers running")
    args = parser.parse_args()
    if args.smoke:
        args.nodes, args.runs = [1], 1
    if args.plays is None:
        args.plays = ["baseline"] if args.smoke else ["full", "baseline"]
    if os.geteuid() != 0:
        sys.exit("bench-deploy: needs root (rootful podman, as the tests)")
    mem_free = int(next(line for line in Path("/proc/meminfo").read_text().splitlines()
                        if line.startswith("MemAvailable:")).split()[1]) * 1024
    # a deployed node holds about 110 MiB (systemd, journald, five exporters, the simulator): measured at N=10
    for count in args.nodes:
        if count * 110 * 2**20 > mem_free * 0.8:
            sys.exit("bench-deploy: %d nodes need about %d MiB, %d MiB are available: choose fewer --nodes"
                     % (count, count * 110, mem_free // 2**20))
    args.out = args.out.resolve()  # the PKI directory and the inventory are given to Ansible as absolute paths
    args.out.mkdir(parents=True, exist_ok=True)
    key = ensure_key(args.out)
    build_image()
    results_file = args.out / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() and not args.smoke else []
    problems = []
    try:
        for count in args.nodes:
            for run in range(1, args.runs + 1):
                for play in args.plays:
                    say("N=%d run %d/%d %s: starting %d containers" % (count, run, args.runs, play, count))
                    nodes = start_nodes(count, key.with_suffix(".pub"))
                    work = args.out / ("n%d-%s-%s-run%d" % (count, args.connection, play, run))
                    if work.exists():
                        shutil.rmtree(work)
                    work.mkdir()
                    write_inventory(work / "inventory.json", nodes, key, args.connection, work / "pki")
                    record = {"nodes": count, "connection": args.connection, "play": play, "run": run,
                              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "cores": os.cpu_count(), "load_before": Path("/proc/loadavg").read_text().split()[0]}
                    for phase in ("converge", "rerun"):
                        figures = run_play(PLAYS[play], work / "inventory.json", work / ("%s.log" % phase),
                                           args.connection)
                        record[phase] = figures
                        say("N=%d %s %s: %.1f s wall, %.1f s CPU, %d MiB, %d tasks/host, %d changed, rc %d"
                            % (count, play, phase, figures["wall_s"], figures["cpu_s"], figures["peak_rss_mib"],
                               figures["tasks_per_host"], figures["changed"], figures["rc"]))
                        if figures["rc"] != 0:
                            problems.append("N=%d %s %s failed (rc %d, hosts %s): %s" % (
                                count, play, phase, figures["rc"], ", ".join(figures["failed_hosts"]) or "-",
                                work / ("%s.log" % phase)))
                            break
                    if "rerun" in record:
                        record["rerun_ratio"] = round(record["rerun"]["wall_s"] / record["converge"]["wall_s"], 2)
                        if record["rerun"]["changed"]:
                            problems.append("N=%d %s: the no-op rerun changed %d tasks (%s)" % (
                                count, play, record["rerun"]["changed"], work / "rerun.log"))
                    results.append(record)
                    results_file.write_text(json.dumps(results, indent=1))
    finally:
        if not args.keep:
            remove_nodes()
    for problem in problems:
        say("PROBLEM: " + problem)
    say("results in %s" % results_file)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
