"""Verify the slurm_metrics collector on the real controllers of both lab clusters (Slurm 22.05 and 24.11).

The collector (hpcobs-slurm-metrics, every 5 s in this scenario) serves the names of Slurm's metrics/openmetrics
plugin. The site's security switch is on (the default): its front (vmauth) serves port 9341 over HTTPS with the
controller's site certificate and lets only the client user with slurm-metrics-client read /metrics; the collector
listens on 127.0.0.1:9342 behind it. Each check compares what it serves with what Slurm itself says at the same time
(sinfo, squeue, scontrol), for a job that holds GPUs and for a node drained with a reason.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import testinfra
from exposition import parse_exposition, value
from hostchecks import assert_runs_as_its_own_user, cmdline, unit_property
from polling import wait_for

CLUSTERS = ["d12", "d13"]
PORT = 9341
UNIT = "hpcobs-slurm-metrics.service"
FRONT = "hpcobs-slurm-metrics-front.service"
CONFIG_DIR = "/etc/hpcobs-slurm-metrics"
CA = CONFIG_DIR + "/tls/ca.crt"
# where a test keeps the client credential inside a container (root only), copied from the scenario's site PKI
PASSWORD_FILE = "/root/.hpcobs-test-slurm-metrics-client"
TIMEOUT = 60
REPO = Path(__file__).resolve().parents[3]
# The raw command output of each cluster is kept here, with sinfo's and squeue's view of the same moment: the
# material for unit tests of the collector against real output (tests/data/slurm/<version>/).
CAPTURE_DIR = Path(os.environ.get("HPCOBS_SLURM_CAPTURE_DIR", REPO / ".cache" / "slurm-capture"))
COLLECTOR_COMMANDS = {
    "nodes": "scontrol --oneliner show node",
    "partitions": "scontrol --oneliner show partition",
    "jobs": "scontrol --oneliner show job",
    "sdiag": "sdiag",
    "ping": "scontrol ping",
    # Slurm's own views of the same moment, for the unit tests' expectations
    "sinfo": "sinfo -h -N -o '%N|%T|%G|%E'",
    "squeue": "squeue -h -t all -o '%i|%T|%u|%a|%P|%b|%C|%D'",
    "version": "scontrol -V",
}


def podman(name):
    return testinfra.get_host("podman://%s" % name)


def credential():
    path = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "pki" / "credentials" / "slurm-metrics-client"
    return path.read_text(encoding="utf-8").strip()


def put_credential(container):
    """The client credential into a root-only file of the container (through stdin: never on a command line)."""
    subprocess.run(["podman", "exec", "-i", container, "sh", "-c", "umask 077; cat > %s" % PASSWORD_FILE],
                   input=credential(), text=True, check=True, timeout=30)


# argv: url, CA file (- for the system's, insecure for no check), user (- for none), password file; prints the
# status, then the body (0: nothing answered, the reason as body)
_FETCH = (
    "import base64,ssl,sys,urllib.request,urllib.error\n"
    "url,ca,user,pwfile=sys.argv[1:5]\n"
    "req=urllib.request.Request(url)\n"
    "if user!='-': req.add_header('Authorization','Basic '+base64.b64encode((user+':'+open(pwfile).read().strip())"
    ".encode()).decode())\n"
    "ctx=ssl._create_unverified_context() if ca=='insecure' else ssl.create_default_context(cafile=None if ca=='-' "
    "else ca)\n"
    "try:\n"
    "  r=urllib.request.urlopen(req,timeout=10,context=ctx); code,body=r.status,r.read()\n"
    "except urllib.error.HTTPError as e:\n"
    "  code,body=e.code,e.read()\n"
    "except OSError as e:\n"
    "  code,body=0,str(e).encode()\n"
    "sys.stdout.write('%d\\n' % code + body.decode('utf-8','replace'))\n")


def fetch(host, url, ca=CA, user="-", password_file="-", as_user=None):
    words = " ".join(shlex.quote(w) for w in (url, ca or "-", user, password_file))
    command = "python3 -c %s %s" % (shlex.quote(_FETCH), words)
    if as_user:
        command = "runuser -u %s -- %s" % (as_user, command)
    code, _, body = host.check_output(command).partition("\n")
    return int(code), body


def metrics(ctl):
    """What the collector serves, read the way VictoriaMetrics reads it: through the front, HTTPS trusting the site
    CA, with the client credential."""
    code, body = fetch(ctl, "https://127.0.0.1:%d/metrics" % PORT, CA, "hpcobs", PASSWORD_FILE)
    assert code == 200, body[:300]
    return parse_exposition(body)


@pytest.fixture(scope="module", params=CLUSTERS)
def cluster(request):
    name = request.param
    put_credential("slurm-%s-ctl" % name)
    return {"name": name, "ctl": podman("slurm-%s-ctl" % name), "gpu1": "slurm-%s-gpu1" % name,
            "gpu2": "slurm-%s-gpu2" % name}


def submit(ctl, user, account, gpus, node):
    return ctl.check_output(
        "runuser -u %s -- sbatch --parsable --job-name=hpcobs-metrics --account=%s --gres=%s --nodelist=%s "
        "--ntasks=1 --cpus-per-task=1 --chdir=/tmp --output=/dev/null --wrap='sleep 600'",
        user, account, "gpu:%d" % gpus, node).strip().split(";")[0]


def job_state(ctl, job):
    return ctl.run("squeue -h -j %s -o %%T", job).stdout.strip()


def test_capture_command_output_with_running_pending_and_drained(cluster):
    """Run the collector's commands as its own user while a job runs, one waits and a node is drained; keep the
    output (and sinfo's/squeue's view) for the unit tests."""
    ctl = cluster["ctl"]
    running = submit(ctl, "alice", "physics", 3, cluster["gpu1"])
    waiting = submit(ctl, "bob", "chemistry", 2, cluster["gpu1"])
    reason = "hpcobs capture: GPU 1 XID 79"
    ctl.check_output("scontrol update nodename=%s state=drain reason=%s", cluster["gpu2"], reason)
    try:
        wait_for("job %s running" % running, lambda: job_state(ctl, running) == "RUNNING", TIMEOUT, interval=0.5)
        wait_for("job %s pending" % waiting, lambda: job_state(ctl, waiting) == "PENDING", TIMEOUT, interval=0.5)
        out = CAPTURE_DIR / cluster["name"]
        out.mkdir(parents=True, exist_ok=True)
        for key, command in COLLECTOR_COMMANDS.items():
            result = ctl.run("runuser -u hpcobs-slurm-metrics -- %s" % command)
            assert result.rc == 0 or key == "ping", (command, result.stderr)
            (out / ("%s.txt" % key)).write_text(result.stdout)
        # GPUs as the job asked for them (TresPerNode=gres/gpu:3, 22.05: gres:gpu:3); its TRES name them only
        # where slurm.conf accounts gres/gpu (AccountingStorageTRES), which the lab leaves at its default
        assert re.search(r"TresPerNode=gres[/:]gpu:3\b", (out / "jobs.txt").read_text())
        assert reason in (out / "sinfo.txt").read_text()
    finally:
        ctl.run("scancel %s %s", running, waiting)
        ctl.run("scontrol update nodename=%s state=resume", cluster["gpu2"])
    for job in (running, waiting):
        wait_for("job %s gone" % job, lambda: job_state(ctl, job) == "", TIMEOUT, interval=0.5)


def test_collector_runs_unprivileged_and_hardened(cluster):
    ctl = cluster["ctl"]
    assert_runs_as_its_own_user(ctl, UNIT, "hpcobs-slurm-metrics")
    argv = cmdline(ctl, UNIT)
    assert argv[1].endswith("/hpcobs-slurm-metrics") and "serve" in argv and "--mode=full" in argv
    for prop, wanted in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                         ("PrivateTmp", "yes"), ("CapabilityBoundingSet", "")]:
        assert unit_property(ctl, UNIT, prop) == wanted, prop
    # GPU nodes get no collector
    assert not podman(cluster["gpu1"]).file("/etc/systemd/system/" + UNIT).exists
    # behind its front: the collector on loopback, vmauth on the port, as the collector's user, hardened too
    assert "--listen=127.0.0.1:9342" in argv
    front = cmdline(ctl, FRONT)
    for flag in ("-httpListenAddr=0.0.0.0:9341", "-httpInternalListenAddr=127.0.0.1:9343", "-tls",
                 "-tlsCertFile=%s/tls/server.crt" % CONFIG_DIR, "-tlsKeyFile=%s/tls/server.key" % CONFIG_DIR,
                 "-auth.config=%s/front.yml" % CONFIG_DIR):
        assert flag in front, flag
    assert credential() not in " ".join(front)
    assert_runs_as_its_own_user(ctl, FRONT, "hpcobs-slurm-metrics")
    for prop, wanted in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("CapabilityBoundingSet", "")]:
        assert unit_property(ctl, FRONT, prop) == wanted, prop
    # the auth config holds the password and the key is the host's: neither readable by other users
    for path in (CONFIG_DIR + "/front.yml", CONFIG_DIR + "/tls/server.key"):
        item = ctl.file(path)
        assert (item.user, item.group, item.mode) == ("root", "hpcobs-slurm-metrics", 0o640), path
    assert ctl.run("runuser -u alice -- cat %s/front.yml" % CONFIG_DIR).rc != 0


def test_a_job_on_a_gpu_node_reads_nothing_without_the_credential(cluster):
    """From a GPU node, as a user's job would: nothing without the credential, nothing over plain HTTP, nothing
    with a guessed password, and no way around the front; the shipped credential reads /metrics and nothing else."""
    gpu, ctl = podman(cluster["gpu1"]), cluster["ctl"]
    url = "https://slurm-%s-ctl:%d" % (cluster["name"], PORT)
    ca = "insecure"  # an attacker does not care whose certificate it is
    for path in ("/metrics", "/", "/health", "/metrics?x=1"):
        code, body = fetch(gpu, url + path, ca, as_user="alice")
        assert code == 401, "%s without the credential: HTTP %d %s" % (path, code, body[:200])
    gpu.check_output("printf %s > /tmp/hpcobs-wrong && chmod 0644 /tmp/hpcobs-wrong", "not-the-credential-0123")
    assert fetch(gpu, url + "/metrics", ca, "hpcobs", "/tmp/hpcobs-wrong", as_user="alice")[0] == 401
    code, body = fetch(gpu, url.replace("https://", "http://") + "/metrics", "-", as_user="alice")
    assert code in (0, 400) and "slurm_" not in body
    # a client that does not trust the site CA refuses the front's certificate
    code, body = fetch(gpu, url + "/metrics", "-", as_user="alice")
    assert code == 0 and "CERTIFICATE_VERIFY_FAILED" in body, body[:300]
    # the collector and the front's own endpoints are on the controller's loopback only
    host = "slurm-%s-ctl" % cluster["name"]
    for port in (9342, 9343):
        code, body = fetch(gpu, "http://%s:%d/metrics" % (host, port), "-", as_user="alice")
        assert code == 0, "port %d answered from a GPU node: %d %s" % (port, code, body[:200])
    # with the credential (on the controller): /metrics, and 400 for every other path
    assert metrics(ctl)
    for path in ("/", "/health", "/metrics/../flags", "/-/reload"):
        code, _ = fetch(ctl, "https://127.0.0.1:%d%s" % (PORT, path), CA, "hpcobs", PASSWORD_FILE)
        assert code in (400, 404), path


def test_every_command_works_and_the_cluster_is_described(cluster):
    ctl = cluster["ctl"]
    samples = metrics(ctl)
    for command in ["nodes", "partitions", "jobs", "sdiag", "ping"]:
        assert value(samples, "hpcobs_slurm_collector_success", command=command) == 1, command
    assert value(samples, "slurm_nodes") == 2
    assert value(samples, "slurm_partitions") == 1
    for node in (cluster["gpu1"], cluster["gpu2"]):
        assert value(samples, "slurm_node_gpus", node=node) == 4
        cpus = int(ctl.check_output("sinfo -h -N -n %s -o %%c", node).split()[0])
        assert value(samples, "slurm_node_cpus", node=node) == cpus
    assert value(samples, "slurm_partition_gpus", partition="gpu") == 8
    assert value(samples, "slurm_partition_nodes", partition="gpu") == 2
    controller = "slurm-%s-ctl" % cluster["name"]
    assert value(samples, "hpcobs_slurm_controller_up", controller=controller, role="primary") == 1
    # sdiag's scheduler statistics (main cycles run at least at every submission and every minute)
    assert value(samples, "slurm_server_thread_cnt") >= 1
    assert value(samples, "slurm_schedule_cycle_cnt") is not None


def test_a_job_holding_gpus_is_counted_for_its_user_account_node_and_partition(cluster):
    ctl = cluster["ctl"]
    job = submit(ctl, "bob", "chemistry", 3, cluster["gpu1"])
    try:
        wait_for("job %s running" % job, lambda: job_state(ctl, job) == "RUNNING", TIMEOUT, interval=0.5)

        # the node's state and the job list come from two commands of one collector round (scontrol show node,
        # then show job), and slurmctld may report the node MIXED a moment after the job RUNNING: wait for a round
        # that has both
        def counted():
            samples = metrics(ctl)
            return samples if (value(samples, "slurm_account_jobs_gpus_alloc", account="chemistry") == 3
                               and value(samples, "hpcobs_slurm_node_state_info", node=cluster["gpu1"], state="mixed",
                                         reason="") == 1) else None
        samples = wait_for("the collector counting job %s" % job, counted, TIMEOUT, interval=1)
        running = len(ctl.check_output("squeue -h -t RUNNING -o %i").split())
        assert value(samples, "slurm_jobs_running") == running >= 1
        assert value(samples, "slurm_user_jobs_running", username="bob") == 1
        assert value(samples, "slurm_user_jobs_gpus_alloc", username="bob") == 3
        assert value(samples, "slurm_node_gpus_alloc", node=cluster["gpu1"]) == 3
        assert value(samples, "slurm_partition_jobs_gpus_alloc", partition="gpu") == 3
        assert value(samples, "slurm_jobs_gpus_alloc") == 3
        assert value(samples, "hpcobs_slurm_node_state_info", node=cluster["gpu1"], state="mixed", reason="") == 1
    finally:
        ctl.run("scancel %s", job)
    wait_for("job %s gone" % job, lambda: job_state(ctl, job) == "", TIMEOUT, interval=0.5)
    wait_for("GPUs of job %s released in the metrics" % job,
             lambda: value(metrics(ctl), "slurm_node_gpus_alloc", node=cluster["gpu1"]) == 0, TIMEOUT, interval=1)


def test_a_drained_node_shows_with_its_reason_and_comes_back(cluster):
    ctl, node = cluster["ctl"], cluster["gpu2"]
    reason = "hpcobs verify: GPU 2 XID 79"
    ctl.check_output("scontrol update nodename=%s state=drain reason=%s", node, reason)
    try:
        assert reason in ctl.check_output("sinfo -h -R -n %s -o %%E", node)

        def drained():
            samples = metrics(ctl)
            return samples if value(samples, "hpcobs_slurm_node_state_info", node=node, state="drained",
                                    reason=reason) == 1 else None
        samples = wait_for("%s drained in the metrics" % node, drained, TIMEOUT, interval=1)
        assert value(samples, "slurm_nodes_drain") == 1
        assert value(samples, "slurm_nodes_drained") == 1
        assert value(samples, "slurm_nodes_idle") == 2  # Slurm keeps the base state: IDLE+DRAIN
        assert value(samples, "slurm_partition_nodes_drained", partition="gpu") == 1
        # one state series per node: the old one is gone
        assert [k for k in samples if k[0] == "hpcobs_slurm_node_state_info" and ("node", node) in k[1]] == [
            ("hpcobs_slurm_node_state_info", (("node", node), ("reason", reason), ("state", "drained")))]
    finally:
        ctl.run("scontrol update nodename=%s state=resume", node)
    # Back in service: one state series, not drained, no reason. Which state depends on the queue: a job that was
    # pending for want of this node starts on it at once (mixed/allocated), else it is idle (or planned).
    def back():
        series = [dict(k[1]) for k in metrics(ctl) if k[0] == "hpcobs_slurm_node_state_info" and ("node", node) in k[1]]
        assert len(series) == 1 and series[0]["reason"] == "" and series[0]["state"] in (
            "idle", "mixed", "allocated", "planned"), "node series: %r" % series
        return series

    wait_for("%s back in service in the metrics" % node, back, TIMEOUT, interval=1)
    assert value(metrics(ctl), "slurm_nodes_drain") == 0


def test_jobstats_and_report_are_installed_and_configured(cluster):
    ctl = cluster["ctl"]
    conf = ctl.file("/etc/hpcobs/jobstats.conf")
    # no management host in this scenario: the default falls back to the controller itself, to VictoriaMetrics'
    # read-only front there (the security switch is on by default), with the site CA and the reader credential
    assert conf.mode == 0o644 and "url = https://127.0.0.1:8427" in conf.content_string
    assert "ca_file = /etc/hpcobs/tls/ca.crt" in conf.content_string
    for tool in ("hpcobs-jobstats", "hpcobs-report"):
        assert ctl.file("/usr/local/bin/%s" % tool).mode == 0o755
    # any user may run it; without a VictoriaMetrics there it says so (exit 1), naming the configured URL
    result = ctl.run("runuser -u alice -- hpcobs-jobstats 1")
    assert result.rc == 1 and "VictoriaMetrics at https://127.0.0.1:8427" in result.stderr, result.stderr
    assert ctl.run("runuser -u alice -- hpcobs-report --help").rc == 0


def test_slurmctld_runs_the_job_end_summary_as_its_mailprog(cluster):
    """slurm_metrics_job_summary: slurmctld (22.05 and 24.11) runs hpcobs-slurm-mail for a job's END mail, with the
    job in its environment; the wrapper asks hpcobs-jobstats (no VictoriaMetrics here: it says why in one line) and
    hands the mail to the lab's mailer, which keeps it in its spool."""
    ctl = cluster["ctl"]
    assert re.search(r"(?m)^MailProg=/usr/local/bin/hpcobs-slurm-mail$", ctl.file("/etc/slurm/slurm.conf").content_string)
    assert re.search(r"(?m)^MailProg\s+= /usr/local/bin/hpcobs-slurm-mail$", ctl.check_output("scontrol show config"))
    assert "mailer = /usr/local/bin/hpcobs-lab-mail" in ctl.file("/etc/hpcobs/jobstats.conf").content_string
    job = ctl.check_output("runuser -u bob -- sbatch --parsable --job-name=hpcobs-mail --account=chemistry "
                           "--mail-type=END -o /dev/null --wrap 'sleep 1'").strip().split(";")[0]
    assert job.isdigit(), job
    spool = "/var/spool/hpcobs-lab-mail"
    names = wait_for("the END mail of job %s" % job, lambda: ctl.check_output(
        "cd %s && ls -1 -- *.%s.mail 2>/dev/null || true" % (spool, job)).split(), TIMEOUT, interval=1)
    mail = ctl.check_output("cat %s/%s" % (spool, names[0]))
    head, _, body = mail.partition("\n\n")
    assert head.splitlines()[0] == "To: bob", head
    assert re.match(r"Subject: Slurm Job_id=%s Name=hpcobs-mail Ended" % job, head.splitlines()[1]), head
    assert body.startswith("No GPU summary: hpcobs-jobstats failed (hpcobs-jobstats: VictoriaMetrics at "
                           "https://127.0.0.1:8427"), body
