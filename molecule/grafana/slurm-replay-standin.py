#!/usr/bin/python3
"""STAND-IN for Slurm's client commands `scontrol` and `sdiag`, for scenarios without a Slurm cluster (grafana).

It replays output captured from the lab's real Slurm (tests/data/slurm/<version>/, written by the slurm scenario)
from the directory in HPCOBS_SLURM_REPLAY_DIR, for exactly the invocations the slurm_metrics collector makes:

  scontrol --oneliner show node|partition|job   ->  nodes.txt, partitions.txt, jobs.txt
  scontrol ping                                 ->  ping.txt
  scontrol -V                                   ->  version.txt
  sdiag                                         ->  sdiag.txt

Anything else is refused as the real commands refuse what they do not know (exit 1, a message on stderr), so a
collector that started calling something new fails here instead of being fed invented output. Installed as
`scontrol` and `sdiag` (it looks at the name it was called by). It lives with the grafana scenario, not under
molecule/standins/ (those are bundle components).
"""
import os
import sys

FILES = {
    ("scontrol", "--oneliner", "show", "node"): "nodes.txt",
    ("scontrol", "--oneliner", "show", "partition"): "partitions.txt",
    ("scontrol", "--oneliner", "show", "job"): "jobs.txt",
    ("scontrol", "ping"): "ping.txt",
    ("scontrol", "-V"): "version.txt",
    ("sdiag",): "sdiag.txt",
}


def main():
    name = os.path.basename(sys.argv[0])
    key = (name,) + tuple(sys.argv[1:])
    if key not in FILES:
        sys.stderr.write("%s: invalid command or option: %s (replay stand-in)\n" % (name, " ".join(sys.argv[1:])))
        return 1
    with open(os.path.join(os.environ["HPCOBS_SLURM_REPLAY_DIR"], FILES[key]), encoding="utf-8") as handle:
        sys.stdout.write(handle.read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
