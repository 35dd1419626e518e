"""Remote write with vmagent (roles/victoriametrics victoriametrics_remote_write) against the real binaries of the test
tools, on loopback only.

The role's vmagent flags, scrape configuration and target files are rendered by Ansible from the role's defaults and
internal variables for a management host that remote-writes to "the site's cluster" with basic auth (a password
file on the controller, copied where the role puts it). Then: a single-node victoria-metrics as that cluster (with
basic auth) and another as the host's own VictoriaMetrics, a small HTTP target, and vmagent started with the
rendered flags. Samples must reach both; what vmagent queued while the cluster was down must arrive once it is back;
a wrong password must be logged as 401 without the password anywhere in vmagent's output.

Tools: HPCOBS_TOOLS_BIN (a directory) if set, else <repo>/.cache/tools/bin, else PATH. A missing tool fails.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tooling import PROJECT_FILTERS, REPO, exposition_server, tool

ROLE = REPO / "roles" / "victoriametrics"
CLUSTER_PASSWORD = "cluster-pass-0123456789abcdefXYZ"
WRONG_PASSWORD = "wrong-pass-9876543210zyxwvuABC"
METRIC = "hpcobs_rw_probe"


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(what, check, timeout=60, interval=0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError as err:
            last = err
        else:
            if last:
                return last
        time.sleep(interval)
    pytest.fail("%s: not within %ds (last: %r)" % (what, timeout, last))


def render(work: Path, settings: dict) -> dict:
    """The role's vmagent flags and secret files, and its scrape.yml and file_sd, for one management host."""
    out = work / "etc"
    (work / "inventory.yml").write_text(yaml.safe_dump({"all": {"children": {"management": {"hosts": {
        "mgmt01.cluster.example": None}}}}}))
    playbook = [{
        "name": "Render the vmagent flags and scrape configuration",
        "hosts": "mgmt01.cluster.example",
        "connection": "local",
        "gather_facts": False,
        "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
        "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
        "tasks": [
            {"name": "Directory", "ansible.builtin.file": {"path": str(out / "file_sd"), "state": "directory",
                                                           "mode": "0755"}},
            {"name": "Target files", "ansible.builtin.template": {
                "src": str(ROLE / "templates" / "file_sd.json.j2"),
                "dest": str(out / "file_sd") + "/{{ item.key }}.json", "mode": "0644"},
             "loop": "{{ _victoriametrics_jobs }}"},
            {"name": "Scrape configuration", "ansible.builtin.template": {
                "src": str(ROLE / "templates" / "scrape.yml.j2"), "dest": str(out / "scrape.yml"), "mode": "0644"}},
            {"name": "What the role runs", "ansible.builtin.copy": {
                "content": "{{ {'vmagent': _victoriametrics_vmagent, 'args': _victoriametrics_vmagent_args"
                           " + victoriametrics_vmagent_extra_args, 'files': _victoriametrics_remote_write_files,"
                           " 'vm_scrape_args': _victoriametrics_scrape_args,"
                           " 'problems': _victoriametrics_remote_write_problems} | to_json }}",
                "dest": str(work / "rendered.json"), "mode": "0644"}},
        ],
    }]
    (work / "render.yml").write_text(yaml.safe_dump(playbook))
    beside = Path(sys.executable).parent / "ansible-playbook"
    command = [str(beside) if beside.exists() else "ansible-playbook", "-i", str(work / "inventory.yml"),
               str(work / "render.yml"), "-e", json.dumps({"victoriametrics_config_dir": str(out), **settings})]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FILTER_PLUGINS="%s:%s" % (PROJECT_FILTERS, ROLE / "filter_plugins"))
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((work / "rendered.json").read_text())


class Process:
    """A binary of the test tools on loopback, its output in a file."""

    def __init__(self, name, args, log: Path):
        self.name, self.args, self.log = name, args, log
        self.proc = None

    def start(self):
        handle = self.log.open("ab")
        self.proc = subprocess.Popen([str(tool(self.name))] + self.args, stdout=handle, stderr=subprocess.STDOUT)
        handle.close()
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def output(self):
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def vm(work: Path, name: str, port: int, auth=None) -> Process:
    args = ["-storageDataPath=%s" % (work / name), "-httpListenAddr=127.0.0.1:%d" % port, "-retentionPeriod=1d",
            "-search.latencyOffset=0s", "-inmemoryDataFlushInterval=1s", "-loggerLevel=ERROR"]
    if auth:
        (work / (name + ".password")).write_text(auth[1])
        args += ["-httpAuth.username=%s" % auth[0], "-httpAuth.password=file://%s" % (work / (name + ".password"))]
    return Process("victoria-metrics", args, work / (name + ".log"))


def healthy(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2) as resp:
        return resp.status == 200


def timestamps(port, auth=None):
    """Timestamps (ms) of every sample of METRIC a victoria-metrics holds (export: raw samples, none left out)."""
    request = urllib.request.Request("http://127.0.0.1:%d/api/v1/export?match[]=%s" % (port, METRIC))
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(("%s:%s" % auth).encode()).decode())
    with urllib.request.urlopen(request, timeout=10) as resp:
        lines = [json.loads(line) for line in resp.read().decode().splitlines() if line.strip()]
    return sorted(ts for line in lines for ts in line["timestamps"])


@pytest.fixture
def site(tmp_path):
    """The processes of the test (stopped afterwards, whatever happens) and the ports they use."""
    with exposition_server('# TYPE %s gauge\n%s{probe="a"} 1\n' % (METRIC, METRIC)) as target:
        ports = {"target": int(target.rsplit(":", 1)[1]), "local": _free_port(), "cluster": _free_port(),
                 "vmagent": _free_port()}
        processes = []
        try:
            yield tmp_path, ports, processes
        finally:
            for process in reversed(processes):
                process.stop()


def test_vmagent_writes_to_both_queues_through_an_outage_and_keeps_the_password_out_of_its_logs(site):
    work, ports, processes = site
    controller = work / "controller"
    controller.mkdir()
    (controller / "cluster-password").write_text(CLUSTER_PASSWORD + "\n")
    remote_write = [{"name": "cluster", "url": "http://127.0.0.1:%d/api/v1/write" % ports["cluster"],
                     "username": "cluster", "password_file": str(controller / "cluster-password")}]
    rendered = render(work, {
        "hpcobs_security": False,
        "hpcobs_pki_dir": str(work / "pki"),
        "victoriametrics_remote_write": remote_write,
        "victoriametrics_listen_address": "127.0.0.1:%d" % ports["local"],
        "victoriametrics_vmagent_listen_address": "127.0.0.1:%d" % ports["vmagent"],
        "victoriametrics_vmagent_data_dir": str(work / "queue"),
        "victoriametrics_vmagent_max_disk_usage_per_url": "64MiB",
        "victoriametrics_scrape_interval": "1s",
        "victoriametrics_scrape_timeout": "1s",
        "victoriametrics_file_sd_check_interval": "1s",
        "victoriametrics_scrape_jobs": {"probe": {"port": ports["target"], "hosts": ["127.0.0.1"]}},
        "victoriametrics_vmagent_extra_args": ["-loggerLevel=INFO"],
    })
    assert rendered["vmagent"] is True and rendered["problems"] == []
    # VictoriaMetrics does not scrape where vmagent does
    assert rendered["vm_scrape_args"] == []
    args = rendered["args"]
    assert CLUSTER_PASSWORD not in " ".join(args)
    assert "-remoteWrite.tmpDataPath=%s" % (work / "queue") in args
    assert "-remoteWrite.maxDiskUsagePerURL=64MiB" in args
    # the role copies each secret from the controller to its place on the host (0640); here the test does
    assert rendered["files"] == [{"src": str(controller / "cluster-password"),
                                  "dest": str(work / "etc" / "remote-write" / "cluster.password"), "mode": "0640"}]
    for entry in rendered["files"]:
        Path(entry["dest"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(entry["src"], entry["dest"])
        os.chmod(entry["dest"], 0o640)
    secret = Path(rendered["files"][0]["dest"])
    (work / "queue").mkdir()

    local = vm(work, "local", ports["local"])
    cluster = vm(work, "cluster", ports["cluster"], auth=("cluster", CLUSTER_PASSWORD))
    processes += [local.start(), cluster.start()]
    wait_until("both victoria-metrics healthy", lambda: healthy(ports["local"]) and healthy(ports["cluster"]))
    agent = Process("vmagent", args, work / "vmagent.log")
    processes.append(agent.start())

    # samples reach both: the host's own VictoriaMetrics and the site's cluster
    wait_until("samples in the local VictoriaMetrics", lambda: len(timestamps(ports["local"])) >= 3)
    wait_until("samples in the cluster", lambda: len(timestamps(ports["cluster"], ("cluster", CLUSTER_PASSWORD))) >= 3)

    # the cluster goes away; vmagent keeps scraping and queues; back again, it delivers what it queued
    cluster.stop()
    down = int(time.time() * 1000)
    time.sleep(6)
    up = int(time.time() * 1000)
    wait_until("the local VictoriaMetrics keeps receiving during the outage",
               lambda: [ts for ts in timestamps(ports["local"]) if down + 1000 < ts < up - 1000])
    processes.append(cluster.start())
    wait_until("the cluster healthy again", lambda: healthy(ports["cluster"]))
    queued = wait_until("the samples of the outage delivered to the cluster", lambda: [
        ts for ts in timestamps(ports["cluster"], ("cluster", CLUSTER_PASSWORD)) if down + 1000 < ts < up - 1000],
        timeout=90)
    assert len(queued) >= 3, queued

    # a wrong password: the cluster answers 401, vmagent says so and never shows the password
    agent.stop()
    secret.write_text(WRONG_PASSWORD + "\n")
    wrong = Process("vmagent", args, work / "vmagent-wrong.log")
    processes.append(wrong.start())
    # vmagent names the URL by its position only (2: the cluster; -remoteWrite.showURL stays off)
    wait_until("the cluster's 401 in vmagent's output", lambda: [
        line for line in wrong.output().splitlines()
        if "unexpected status code" in line and '"2:secret-url"' in line and ": 401;" in line], timeout=60)
    for process in (agent, wrong):
        text = process.output()
        assert WRONG_PASSWORD not in text and CLUSTER_PASSWORD not in text, process.log
    # the local write goes on meanwhile (its queue is its own)
    before = len(timestamps(ports["local"]))
    wait_until("the local VictoriaMetrics still receiving", lambda: len(timestamps(ports["local"])) > before)


def test_the_render_refuses_a_url_with_credentials(tmp_path):
    """The role's check sees the same problems the filter reports (the preflight stops on them); the URL's
    password is not in them."""
    rendered_problems = None
    try:
        render(tmp_path, {"hpcobs_security": False, "victoriametrics_remote_write": [
            {"name": "cluster", "url": "https://u:s3cr3t-pw@vminsert.example.org/api/v1/write"}]})
    except AssertionError as err:  # the flags cannot be made from it either: the render stops
        rendered_problems = str(err)
    assert rendered_problems is not None
    assert "must not carry credentials" in rendered_problems and "s3cr3t-pw" not in rendered_problems
