#!/usr/bin/env python3
"""What one module run costs in CPU, by how Ansible sends the module: an AnsiballZ module (every builtin module, and
any module that imports Ansible's module_utils) against a JSONARGS module (roles/service's hpcobs_files, which
imports only the standard library).

Each module runs COUNT times as the items of one loop on localhost (local connection, pipelining on, as the
project's ansible.cfg has it), so that the controller's cost per task is paid once; the CPU seconds of
ansible-playbook and everything it starts (getrusage of the children), less those of the same play with an empty
loop, divided by COUNT, is the cost of one module run. Each measure is taken REPEAT times; min / median / max.

  bench/module_cost.py [--count 40] [--repeat 3] [--python /usr/bin/python3] [--json FILE]

The modules run with --python: the host's /usr/bin/python3 by default, as on a node (the controller's own Python,
a virtual environment's, may start slower or faster).

The modules compared, on a converged host (nothing to change):
  ansible.builtin.stat    one file read (AnsiballZ)
  ansible.builtin.file    one directory as it should be (AnsiballZ)
  hpcobs_files            the same directory and a file in it, as roles/service calls it (JSONARGS)
  ansible.builtin.command a query: `true` (AnsiballZ)
  hpcobs_read             the same query, as roles/service's packages, holds_group and slurm_hooks' self-test run
                          theirs (JSONARGS)
"""
from __future__ import annotations

import argparse
import grp
import json
import os
import pwd
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def play(kind, count, workdir):
    """A play running one module `count` times (a loop), on what `workdir` already holds."""
    target = str(workdir / "d")
    modules = {
        "ansible.builtin.stat": {"ansible.builtin.stat": {"path": target + "/f"}},
        "ansible.builtin.file": {"ansible.builtin.file": {"path": target, "state": "directory", "mode": "0755"}},
        "hpcobs_files": {"hpcobs_files": {
            "directories": [{"path": target, "owner": "{{ me }}", "group": "{{ my_group }}", "mode": "0755"}],
            "files": [{"dest": target + "/f", "content": "x\n", "owner": "{{ me }}", "group": "{{ my_group }}",
                       "mode": "0644"}]}},
        "ansible.builtin.command": {"ansible.builtin.command": {"argv": ["true"]}, "changed_when": False},
        "hpcobs_read": {"hpcobs_read": {"argv": ["true"]}},
    }
    task = dict(modules[kind], loop="{{ range(%d) | list }}" % count, register="r")
    check = {"ansible.builtin.assert": {"that": ["r.results | length == %d" % count, "r is not changed"],
                                        "quiet": True}}
    return [{"hosts": "localhost", "gather_facts": False,
             "vars": {"me": pwd.getpwuid(os.getuid()).pw_name,
                      "my_group": grp.getgrgid(os.getgid()).gr_name},
             "tasks": [task, check]}]


def cpu_of(kind, count, workdir, python):
    """CPU seconds (user + system) of one ansible-playbook run of the play and all it starts."""
    path = workdir / ("play-%s-%d.yml" % (kind, count))
    path.write_text(json.dumps(play(kind, count, workdir)))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_PIPELINING="1",
               ANSIBLE_LIBRARY=str(REPO / "roles/service/library"),
               ANSIBLE_ACTION_PLUGINS=str(REPO / "roles/service/action_plugins"),
               ANSIBLE_LOCAL_TEMP=str(workdir / ".ansible-tmp"), ANSIBLE_NOCOLOR="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c",
                             "local", "-e", "ansible_python_interpreter=" + python, str(path)],
                            capture_output=True, text=True, env=env, cwd=str(workdir), timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        sys.exit("module_cost: the %s play failed:\n%s" % (kind, (result.stdout + result.stderr)[-3000:]))
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=40, help="module runs per measure")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--python", default="/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable,
                        help="the interpreter the modules run with (default: %(default)s)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    figures = {}
    with tempfile.TemporaryDirectory(prefix="hpcobs-module-cost-") as tmp:
        workdir = Path(tmp)
        (workdir / "d").mkdir(mode=0o755)
        os.chmod(workdir / "d", 0o755)
        (workdir / "d" / "f").write_text("x\n")
        os.chmod(workdir / "d" / "f", 0o644)
        for kind in ("ansible.builtin.stat", "ansible.builtin.file", "hpcobs_files", "ansible.builtin.command",
                     "hpcobs_read"):
            per_run = []
            for _ in range(args.repeat):
                empty = cpu_of(kind, 0, workdir, args.python)
                full = cpu_of(kind, args.count, workdir, args.python)
                per_run.append((full - empty) / args.count)
            figures[kind] = sorted(per_run)
            print("%-24s CPU s per module run (min / median / max of %d): %.3f / %.3f / %.3f"
                  % (kind, args.repeat, min(per_run), statistics.median(per_run), max(per_run)), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"count": args.count, "repeat": args.repeat, "python": args.python,
                                               "cpu_s_per_run": figures}, indent=1))


if __name__ == "__main__":
    main()
