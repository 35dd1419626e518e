"""Test harness: run tasks in the scenarios' local podman containers through nsenter, one process per task.

containers.podman.podman needs several `podman` client runs per task (mount, mkdir, chmod, exec) and cannot
pipeline; on a small test machine those runs, not the roles, dominate a scenario's time. This plugin enters the
namespaces of the container's init process with nsenter (util-linux), pipelines modules over stdin and copies files
through the same channel. It is for the Molecule scenarios only (.config/molecule/config.yml selects it), never for
real hosts, which the roles reach over SSH.
"""
import os
import shlex
import subprocess

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display

DOCUMENTATION = """
name: hpcobs_nsenter
short_description: Run tasks in a local podman container by entering its namespaces (Molecule scenarios only)
description:
  - Finds the container's init process with C(podman inspect) (cached while that process lives), then runs every
    command and file copy with C(nsenter) in its mount, UTS, IPC, network, PID and cgroup namespaces.
  - Needs root on the controller, as rootful podman does.
author: hpcobs
options:
  remote_addr:
    description: The container's name.
    default: inventory_hostname
    vars:
      - name: inventory_hostname
      - name: ansible_host
  podman_executable:
    description: The podman client used to find the container's init process.
    default: podman
    vars:
      - name: ansible_podman_executable
    env:
      - name: ANSIBLE_PODMAN_EXECUTABLE
  pipelining:
    description: Send modules over stdin (no temporary files in the container).
    type: boolean
    default: true
    vars:
      - name: ansible_pipelining
"""

display = Display()

CACHE_DIR = "/run/hpcobs-nsenter"
ENVIRONMENT = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8",
               "container=podman"]


def _start_time(pid):
    """Field 22 of /proc/<pid>/stat: with the pid, it names one process for the machine's uptime."""
    try:
        with open("/proc/%s/stat" % pid, encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def init_pid(container, podman="podman"):
    """The pid of the container's init process: from the cache while that process lives, else podman inspect."""
    cache = os.path.join(CACHE_DIR, container)
    try:
        with open(cache, encoding="ascii") as handle:
            pid, started = handle.read().split()
        if _start_time(pid) == started:
            return pid
    except (OSError, ValueError):
        pass
    proc = subprocess.run([podman, "inspect", "--type", "container", "--format", "{{.State.Pid}}", container],
                          capture_output=True, text=True, check=False)
    pid = proc.stdout.strip()
    if proc.returncode != 0 or not pid.isdigit() or pid == "0":
        raise AnsibleConnectionFailure("container %s is not running: %s" % (container, proc.stderr.strip()))
    started = _start_time(pid)
    if started:
        os.makedirs(CACHE_DIR, mode=0o700, exist_ok=True)
        tmp = "%s.%d" % (cache, os.getpid())
        with open(tmp, "w", encoding="ascii") as handle:
            handle.write("%s %s\n" % (pid, started))
        os.replace(tmp, cache)
    return pid


def nsenter_argv(pid, argv):
    """Run argv as root in every namespace of process pid, with a clean environment."""
    return ["nsenter", "--target", pid, "--mount", "--uts", "--ipc", "--net", "--pid", "--cgroup", "--root", "--wd",
            "/usr/bin/env", "-i"] + ENVIRONMENT + list(argv)


class Connection(ConnectionBase):
    transport = "hpcobs_nsenter"
    has_pipelining = True
    default_user = "root"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pid = None

    def _connect(self):
        if not self._connected:
            self._pid = init_pid(self.get_option("remote_addr"), self.get_option("podman_executable"))
            self._connected = True
        return self

    def _run(self, argv, in_data=None, stdin=None):
        command = nsenter_argv(self._pid, argv)
        display.vvv("NSENTER %s" % " ".join(shlex.quote(a) for a in argv), host=self.get_option("remote_addr"))
        if stdin is not None:
            proc = subprocess.run(command, stdin=stdin, capture_output=True, check=False)
        else:
            proc = subprocess.run(command, input=in_data or b"", capture_output=True, check=False)
        return proc.returncode, proc.stdout, proc.stderr

    def exec_command(self, cmd, in_data=None, sudoable=True):
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        self._connect()
        return self._run(["/bin/sh", "-c", to_text(cmd, errors="surrogate_or_strict")], in_data)

    def put_file(self, in_path, out_path):
        super().put_file(in_path, out_path)
        self._connect()
        with open(to_bytes(in_path, errors="surrogate_or_strict"), "rb") as handle:
            rc, _, err = self._run(["/bin/sh", "-c", "cat > %s" % shlex.quote(out_path)], stdin=handle)
        if rc != 0:
            raise AnsibleError("could not write %s in %s: %s" % (out_path, self.get_option("remote_addr"),
                                                                  to_text(err)))

    def fetch_file(self, in_path, out_path):
        super().fetch_file(in_path, out_path)
        self._connect()
        rc, out, err = self._run(["/bin/cat", in_path])
        if rc != 0:
            raise AnsibleError("could not read %s in %s: %s" % (in_path, self.get_option("remote_addr"),
                                                                 to_text(err)))
        with open(to_bytes(out_path, errors="surrogate_or_strict"), "wb") as handle:
            handle.write(out)

    def close(self):
        self._connected = False
