#!/usr/bin/env python3
"""Prove, in seconds and before any long work, that this machine can run the lab and the tests.

    python3 scripts/doctor.py            every check (make doctor; the start of make test and make lab)
    python3 scripts/doctor.py --host     only the checks that need no container image

Each check prints one line. The first one that fails prints its cause and the command that fixes it, and the
doctor stops with exit status 1 (later checks would only fail for the same reason). What the Molecule scenarios and
the lab rely on:
  - root, Debian 12 or newer, the host packages of scripts/setup.sh, podman with runc as its OCI runtime;
  - enough free disk (container storage and the checkout's caches) and memory;
  - the containers.conf drop-in in effect: the container ulimits this kernel accepts;
  - a working container storage driver (native overlay, or fuse-overlayfs with /dev/fuse);
  - a systemd container (the test image) boots to "running" under runc;
  - two containers on a podman network resolve each other by name and connect over TCP.
The container checks use the test image localhost/hpcobs-debian12 and build it first when it is missing (once, about
a minute: nothing can be pulled from a registry here).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE = "localhost/hpcobs-debian12"
DROPIN = "/etc/containers/containers.conf.d/50-hpcobs.conf"
OS_RELEASE = "/etc/os-release"
ULIMIT = "20000"
# Both lanes of make test run about a dozen systemd containers at once, VictoriaMetrics and Slurm among them.
MIN_FREE_DISK_GIB = 15
NETWORK_WAIT_SECONDS = 30
MIN_AVAILABLE_MEMORY_GIB = 6
PACKAGES_FILE = os.path.join(ROOT, "scripts", "host-packages.txt")


class Failed(Exception):
    def __init__(self, cause, fix):
        super().__init__(cause)
        self.cause = cause
        self.fix = fix


def run(cmd, timeout=60, check=False):
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise Failed("%s is not installed" % cmd[0], "make setup")
    except subprocess.TimeoutExpired:
        raise Failed("`%s` did not finish within %d s" % (" ".join(cmd), timeout),
                     "look at `podman ps -a` and the journal (journalctl -e) for what hangs")
    if check and proc.returncode != 0:
        raise Failed("`%s` failed (exit %d): %s" % (" ".join(cmd), proc.returncode, last_lines(proc)),
                     "make setup")
    return proc


def last_lines(proc, count=3):
    text = (proc.stderr or proc.stdout or "").strip().splitlines()
    return " | ".join(text[-count:]) or "no output"


_INFO = {}


def podman_info(field):
    """One field of `podman info` ("Host.NetworkBackend"), read once."""
    if not _INFO:
        _INFO.update(json.loads(run(["podman", "info", "--format", "json"], check=True).stdout))
    value = _INFO
    for key in field.split("."):
        value = value.get(key, {}) if isinstance(value, dict) else {}
    return value if not isinstance(value, dict) else ""


def dpkg_installed(package):
    proc = run(["dpkg-query", "-W", "-f=${Status}", package])
    return proc.returncode == 0 and "install ok installed" in proc.stdout


# --- host checks -------------------------------------------------------------------------------------------------


def check_root():
    if os.geteuid() != 0:
        raise Failed("the lab and the tests run as root (they start systemd containers and install packages)",
                     "sudo -i, then run the same make target again")
    return "running as root"


def check_os():
    try:
        fields = dict(line.rstrip("\n").split("=", 1) for line in open(OS_RELEASE) if "=" in line)
    except OSError:
        raise Failed("%s is missing: not a Debian machine" % OS_RELEASE,
                     "use a Debian 12 (or newer) machine")
    name, version = fields.get("ID", "").strip('"'), fields.get("VERSION_ID", "").strip('"')
    major = version.split(".", 1)[0]
    if name != "debian" or not major.isdigit() or int(major) < 12:
        raise Failed("this is %s %s; the lab and the tests need Debian 12 or newer" % (name or "?", version or "?"),
                     "use a Debian 12 (or newer) machine")
    return "Debian %s" % version


def check_packages():
    with open(PACKAGES_FILE) as listing:
        packages = [line.strip() for line in listing if line.strip() and not line.startswith("#")]
    missing = [p for p in packages if not dpkg_installed(p)]
    if missing:
        raise Failed("host packages missing: %s" % " ".join(missing), "make setup")
    return "%d host packages installed" % len(packages)


def check_runtime():
    runtime = podman_info("host.ociRuntime.name")
    if runtime != "runc":
        raise Failed("podman's OCI runtime is %r; crun refuses this kernel's hybrid cgroups, the tests use runc"
                     % runtime, "make setup   (writes %s)" % DROPIN)
    return "podman %s, OCI runtime runc" % podman_info("version.Version")


def check_dns_provider():
    backend = podman_info("host.networkBackend")
    if backend == "netavark":
        needed = "aardvark-dns"
    elif backend == "cni":
        needed = "golang-github-containernetworking-plugin-dnsname"
    else:
        raise Failed("unknown podman network backend %r" % backend, "make setup")
    if not dpkg_installed(needed):
        raise Failed("podman's %s network backend has no DNS provider (%s): containers cannot resolve each other"
                     % (backend, needed), "make setup   (or: apt-get install %s)" % needed)
    return "network backend %s with %s" % (backend, needed)


def check_storage():
    driver = podman_info("store.graphDriverName")
    if driver != "overlay":
        return "storage driver %s" % driver
    if podman_info("store.graphStatus.Native Overlay Diff") == "true":
        return "storage: native overlay"
    if not os.path.exists("/dev/fuse"):
        raise Failed("podman's overlay storage needs fuse-overlayfs here, and /dev/fuse is missing",
                     "modprobe fuse   (or run the machine with /dev/fuse available)")
    if not shutil.which("fuse-overlayfs"):
        raise Failed("podman's overlay storage needs fuse-overlayfs here", "make setup")
    return "storage: overlay through fuse-overlayfs"


def free_gib(path):
    while not os.path.exists(path):
        path = os.path.dirname(path)
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize / 2 ** 30


def check_disk():
    places = {}
    for label, path in (("container storage", podman_info("store.graphRoot")), ("checkout", ROOT)):
        places.setdefault(os.stat(path if os.path.exists(path) else "/").st_dev, []).append((label, path))
    seen = []
    for group in places.values():
        label, path = group[0]
        free = free_gib(path)
        names = " and ".join(item[0] for item in group)
        if free < MIN_FREE_DISK_GIB:
            raise Failed("%.1f GiB free for the %s (%s); the tests need %d GiB"
                         % (free, names, path, MIN_FREE_DISK_GIB),
                         "free space there (podman system prune removes unused images and containers)")
        seen.append("%.0f GiB free (%s)" % (free, names))
    return ", ".join(seen)


def check_memory():
    fields = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    available = int(fields["MemAvailable"].split()[0]) / 2 ** 20
    if available < MIN_AVAILABLE_MEMORY_GIB:
        raise Failed("%.1f GiB of memory available; the tests need %d GiB" % (available, MIN_AVAILABLE_MEMORY_GIB),
                     "stop other containers (podman ps) or use a larger machine")
    return "%.1f GiB memory available" % available


def check_dropin():
    want = 'default_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]' % ((ULIMIT,) * 4)
    try:
        text = open(DROPIN).read()
    except OSError:
        raise Failed("%s is missing (podman's default ulimits are refused by this kernel)" % DROPIN, "make setup")
    if want not in text:
        raise Failed("%s does not set %s" % (DROPIN, want), "make setup")
    return "containers.conf drop-in present"


HOST_CHECKS = [check_root, check_os, check_packages, check_runtime, check_dns_provider, check_storage, check_disk,
               check_memory, check_dropin]


# --- container checks --------------------------------------------------------------------------------------------


class Scratch:
    """Containers and a network made for the checks, removed whatever happens."""

    def __init__(self):
        self.tag = "hpcobs-doctor-%s" % uuid.uuid4().hex[:8]
        self.containers = []
        self.network = None

    def container(self, suffix, *args):
        name = "%s-%s" % (self.tag, suffix)
        self.containers.append(name)
        proc = run(["podman", "run", "-d", "--name", name] + list(args), timeout=90)
        if proc.returncode != 0:
            raise Failed("podman could not start a container: %s" % last_lines(proc),
                         "make setup, then look at `podman run --rm %s true`" % IMAGE)
        return name

    def make_network(self):
        self.network = self.tag
        run(["podman", "network", "create", self.network], check=True)
        return self.network

    def close(self):
        for name in self.containers:
            run(["podman", "rm", "--force", "--time", "0", name], timeout=60)
        if self.network:
            run(["podman", "network", "rm", "--force", self.network], timeout=60)


def ensure_image():
    if run(["podman", "image", "exists", IMAGE]).returncode == 0:
        return None
    print("doctor: building the test image %s first (once, about a minute) ..." % IMAGE, flush=True)
    proc = run([os.path.join(ROOT, "scripts", "build-images.sh"), "debian12"], timeout=900)
    if proc.returncode != 0:
        raise Failed("the test image could not be built: %s" % last_lines(proc, 6),
                     "scripts/build-images.sh debian12   (it needs the Debian mirror of /etc/apt/sources.list*)")
    return "built %s" % IMAGE


def check_ulimits(scratch):
    proc = run(["podman", "run", "--rm", IMAGE, "bash", "-c", "ulimit -n; ulimit -u"], timeout=90)
    if proc.returncode != 0:
        raise Failed("a container could not start: %s" % last_lines(proc),
                     "make setup   (the drop-in %s sets ulimits this kernel accepts)" % DROPIN)
    got = proc.stdout.split()
    if got != [ULIMIT, ULIMIT]:
        raise Failed("containers get ulimits %s, not nofile/nproc %s: the drop-in %s is not in effect"
                     % ("/".join(got), ULIMIT, DROPIN),
                     "make setup; if another containers.conf overrides default_ulimits, remove that setting")
    return "container ulimits nofile=nproc=%s" % ULIMIT


def check_systemd(scratch):
    name = scratch.container("systemd", "--systemd=always", IMAGE, "/sbin/init")
    runtime = run(["podman", "inspect", "--format", "{{.OCIRuntime}}", name]).stdout.strip()
    if runtime != "runc":
        raise Failed("the container runs under %r, not runc" % runtime, "make setup")
    started = time.monotonic()
    state = ""
    while time.monotonic() - started < 60:
        state = run(["podman", "exec", name, "systemctl", "is-system-running"], timeout=30).stdout.strip()
        if state in ("running", "degraded"):
            break
        time.sleep(0.5)
    if state != "running":
        failed = run(["podman", "exec", name, "systemctl", "--failed", "--no-legend", "--plain"], timeout=30)
        raise Failed("systemd in a container is %r after %.0f s (failed units: %s)"
                     % (state or "not answering", time.monotonic() - started,
                        " ".join(line.split()[0] for line in failed.stdout.splitlines() if line.split()) or "none"),
                     "podman logs %s; make setup (runc, ulimits drop-in)" % name)
    return "a systemd container boots to running in %.1f s" % (time.monotonic() - started)


def check_network(scratch):
    network = scratch.make_network()
    server = scratch.container("server", "--network", network, "--network-alias", "doctor-server", IMAGE,
                               "python3", "-m", "http.server", "--bind", "0.0.0.0", "8000")
    client = scratch.container("client", "--network", network, IMAGE, "sleep", "300")
    backend = podman_info("host.networkBackend")
    provider = "aardvark-dns" if backend == "netavark" else "golang-github-containernetworking-plugin-dnsname"
    started = time.monotonic()
    resolved = connected = None
    while time.monotonic() - started < NETWORK_WAIT_SECONDS:
        resolved = run(["podman", "exec", client, "getent", "hosts", server], timeout=20)
        if resolved.returncode == 0:
            connected = run(["podman", "exec", client, "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                             "--max-time", "5", "http://%s:8000/" % server], timeout=20)
            if connected.returncode == 0 and connected.stdout.strip() == "200":
                break
        time.sleep(0.5)
    if resolved is None or resolved.returncode != 0:
        raise Failed("two containers on a podman network cannot resolve each other by name (%s backend)" % backend,
                     "apt-get install %s   (make setup installs it), then run the doctor again" % provider)
    if connected is None or connected.stdout.strip() != "200":
        raise Failed("%s resolves to %s but a TCP connection to it fails: %s"
                     % (server, resolved.stdout.split()[0], last_lines(connected) if connected else "-"),
                     "check the host firewall (iptables -S FORWARD) and `podman network inspect %s`" % network)
    return "containers resolve each other by name and connect (%s, %s)" % (backend, provider)


CONTAINER_CHECKS = [check_ulimits, check_systemd, check_network]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", action="store_true", help="only the checks that need no container image")
    args = parser.parse_args(argv)
    started = time.monotonic()

    def report(check, *extra):
        t0 = time.monotonic()
        try:
            what = check(*extra)
        except Failed as failure:
            print("doctor: FAILED  %s\n        cause: %s\n        fix:   %s" % (check.__name__[6:].replace("_", " "),
                                                                            failure.cause, failure.fix))
            return False
        if what:
            print("doctor: ok      %s (%.1f s)" % (what, time.monotonic() - t0), flush=True)
        return True

    for check in HOST_CHECKS:
        if not report(check):
            return 1
    if not args.host:
        if not report(ensure_image):
            return 1
        scratch = Scratch()
        try:
            for check in CONTAINER_CHECKS:
                if not report(check, scratch):
                    return 1
        finally:
            scratch.close()
    print("doctor: this machine can run the lab and the tests (%.0f s)" % (time.monotonic() - started))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
