"""A GPU node lost in the middle of a site run (runs after test_e2e.py, on the deployed stack).

playbooks/site.yml runs again; when its GPU play starts installing (after the checks, which stop every host on any
failure by design), e2e-gpu02's container is killed. The staged rollout must let
the other hosts finish (one batch of both GPU nodes here, 50% allowed to fail), keep the Slurm controller's
slurm.conf as it was (its Prolog= waits for the hooks on every GPU node of the run), and end with a summary that
names both hosts not deployed and why.
"""
import os
import re
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
GPU1, GPU2, CTL, MGMT = "e2e-gpu01", "e2e-gpu02", "e2e-ctl01", "e2e-mgmt01"


def sh(host, command):
    return subprocess.run(["podman", "exec", host, "sh", "-c", command], capture_output=True, text=True,
                          timeout=120).stdout


def recap(output, host):
    found = re.search(r"^%s\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)" % re.escape(host),
                      output, re.M)
    assert found, "no recap line for %s" % host
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, found.groups())))


def test_a_gpu_node_killed_mid_play_is_named_and_the_others_finish():
    conf_before = sh(CTL, "sha256sum /etc/slurm/slurm.conf")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", PYTHONUNBUFFERED="1",
               ANSIBLE_CALLBACK_PLUGINS=os.path.join(ROOT, "playbooks", "callback_plugins"),
               ANSIBLE_CALLBACKS_ENABLED="hpcobs_rollout")
    cmd = ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], os.path.join(ROOT, "playbooks", "site.yml"),
           "-e", '{"hpcobs_gpu_serial": [2], "hpcobs_gpu_max_fail_percentage": 50}']
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines, in_gpu_play, killed = [], False, False
    for line in proc.stdout:
        lines.append(line)
        in_gpu_play = in_gpu_play or line.startswith("PLAY [GPU node telemetry]")
        if in_gpu_play and not killed and line.startswith("TASK [service : Create the account and the directories of node_exporter]"):
            subprocess.run(["podman", "kill", GPU2], check=True, capture_output=True)
            killed = True
    rc = proc.wait(timeout=1800)
    output = "".join(lines)
    assert killed, output[-3000:]
    assert rc != 0
    # the other hosts finished: the management play ran after the loss, nothing failed on them
    assert "PLAY [Management hosts]" in output[output.index("PLAY [GPU node telemetry]"):]
    for host in (GPU1, MGMT):
        assert recap(output, host)["failed"] == 0 and recap(output, host)["unreachable"] == 0, output[-4000:]
    lost = recap(output, GPU2)
    assert lost["unreachable"] + lost["failed"] >= 1
    # the controller refused Prolog= and kept its slurm.conf
    assert recap(output, CTL)["failed"] == 1
    assert "Prolog=/Epilog= not written to slurm.conf: the hooks are not in place on %s" % GPU2 in output
    assert sh(CTL, "sha256sum /etc/slurm/slurm.conf") == conf_before
    # the summary names both, with the reason
    summary = output[output.index("NOT DEPLOYED"):]  # stderr, merged into output here
    assert re.search(r"^  %s: (unreachable|failed) in task \[" % GPU2, summary, re.M), summary
    assert re.search(r"^  %s: failed in task \[Wait for the hooks on every GPU node" % CTL, summary, re.M), summary
    assert GPU1 not in summary and MGMT not in summary
