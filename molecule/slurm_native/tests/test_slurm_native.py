"""Verify slurmctld 26.05's own metrics (Debian sid's Slurm on the Debian 13 test image) end to end.

slurmctld must run with AccountingStorageTRES=gres/gpu, through slurmdbd (lab_slurm_accounting); slurm_metrics, left
at hpcobs_slurm_native_metrics auto, must have found 26.05 and enabled slurmctld's metrics/openmetrics plugin;
VictoriaMetrics must scrape its five endpoints; the rules' slurm_* names must be names slurmctld really emits; a GPU
job must show in the 26.05 GPU gauges (node, partition, account, user); a node drained with a reason must make
HpcobsSlurmNodeUnavailable fire in vmalert, the reason among its labels.
Every HTTP call runs inside a container (the scenario's hosts resolve each other by name there).
"""
from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import shlex
import time
from pathlib import Path
from urllib.parse import quote

import pytest
import testinfra
from exposition import parse_exposition
from polling import wait_for

CTL, GPU, MGMT = "native-ctl", "native-gpu1", "native-mgmt"
PORT = 6817
ENDPOINTS = {"slurmctld_nodes": "/metrics/nodes", "slurmctld_jobs": "/metrics/jobs",
             "slurmctld_partitions": "/metrics/partitions", "slurmctld_scheduler": "/metrics/scheduler",
             "slurmctld_accounts": "/metrics/jobs-users-accts"}
REPO = Path(__file__).resolve().parents[3]
RULES = REPO / "roles" / "vmalert" / "templates" / "rules" / "hpcobs-slurm.yml.j2"
REASON = "hpcobs test: fan 3 failed"
# slurmctld_* jobs are scraped every 60 s (the role's default): two intervals, and some slack on this machine.
SCRAPE_WAIT = 150

# One request from inside a container: argv URL [method] [data]; $HPCOBS_AUTH (user:password) becomes basic auth,
# $HPCOBS_CA the CA an https URL must chain to.
_GET = ("import os,sys,ssl,base64,urllib.request,urllib.error\n"
        "req=urllib.request.Request(sys.argv[1],method=(sys.argv[2:3] or ['GET'])[0],\n"
        "  data=sys.argv[3].encode() if len(sys.argv)>3 else None)\n"
        "if os.environ.get('HPCOBS_AUTH'):\n"
        "  req.add_header('Authorization','Basic '+base64.b64encode(os.environ['HPCOBS_AUTH'].encode()).decode())\n"
        "ctx=ssl.create_default_context(cafile=os.environ.get('HPCOBS_CA') or None)\n"
        "try:\n"
        "  r=urllib.request.urlopen(req,timeout=20,context=ctx); code,body=r.status,r.read()\n"
        "except urllib.error.HTTPError as e:\n"
        "  code,body=e.code,e.read()\n"
        "sys.stdout.write('%d\\n' % code + body.decode('utf-8','replace'))\n")
# the switch is on: VictoriaMetrics over HTTPS with the site CA and the client credential of the site PKI
VM_CA = "/etc/victoriametrics/tls/ca.crt"
VM = "https://127.0.0.1:8428"


def credential(name):
    """A generated credential of the scenario's site PKI (what the controller holds)."""
    path = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "pki" / "credentials" / name
    return path.read_text(encoding="utf-8").strip()


def podman(name):
    return testinfra.get_host("podman://" + name)


def get(name, url, auth=None, ca=None, method="GET", data=None, user=None):
    env = "HPCOBS_AUTH=%s HPCOBS_CA=%s " % (shlex.quote(auth or ""), shlex.quote(ca or ""))
    args = " ".join(shlex.quote(a) for a in [url, method] + ([data] if data is not None else []))
    command = "%spython3 -c %s %s" % (env, shlex.quote(_GET), args)
    if user:
        command = "runuser -u %s -- env %s" % (user, command)
    out = podman(name).check_output(command)
    code, _, body = out.partition("\n")
    return int(code), body


def vm_get(path):
    return get(MGMT, VM + path, "hpcobs:" + credential("victoriametrics-client"), VM_CA)


def query(expr):
    code, body = vm_get("/api/v1/query?query=" + quote(expr, safe=""))
    assert code == 200, body[:500]
    return json.loads(body)["data"]["result"]


def value_of(expr):
    result = query(expr)
    return float(result[0]["value"][1]) if len(result) == 1 else None


def sq(ctl, *args):
    return ctl.check_output(" ".join(shlex.quote(a) for a in args))


@pytest.fixture(scope="module")
def ctl():
    return podman(CTL)


@pytest.fixture(scope="module")
def job(ctl):
    """A job of alice (account physics) holding one of the node's two GPUs, for the length of the module."""
    jobid = ctl.check_output(
        "runuser -u alice -- sbatch --parsable --job-name=hpcobs-native --account=physics --gres=gpu:1 "
        "--ntasks=1 --cpus-per-task=1 --chdir=/tmp --output=/dev/null --wrap='sleep 900'").split(";")[0]
    wait_for("job %s running" % jobid, lambda: ctl.run("squeue -h -j %s -o %%T", jobid).stdout.strip() == "RUNNING",
             60)
    yield jobid
    ctl.run("scancel %s", jobid)


def test_slurm_is_26_05_from_sid(ctl):
    assert re.match(r"^slurm(-wlm)? 26\.05\.\d+", ctl.check_output("scontrol -V")), ctl.check_output("scontrol -V")
    for name in (CTL, GPU):
        policy = podman(name).check_output("apt-cache policy slurm-client")
        installed = re.search(r"Installed: (\S+)", policy).group(1)
        assert installed.startswith("26.05."), policy
    # pinned at 100: sid replaces nothing the Slurm packages do not need (the trixie system stays trixie)
    assert podman(GPU).check_output("cat /etc/debian_version").startswith("13.")


def test_slurmctld_tracks_the_gpu_tres_through_slurmdbd(ctl, job):
    """AccountingStorageTRES=gres/gpu needs slurmdbd (lab_slurm_accounting): slurmctld runs with it, the TRES is in
    slurmdbd's database, and the running GPU job's allocation counts it."""
    for unit in ("mariadb.service", "slurmdbd.service", "slurmctld.service"):
        assert ctl.service(unit).is_running, unit
    config = ctl.check_output("scontrol show config")
    assert re.search(r"(?m)^AccountingStorageType\s*=\s*accounting_storage/slurmdbd$", config), config
    tres = re.search(r"(?m)^AccountingStorageTRES\s*=\s*(\S+)$", config).group(1).split(",")
    assert "gres/gpu" in tres, tres
    assert "gres|gpu" in ctl.check_output("sacctmgr --noheader --parsable2 list tres format=type,name").splitlines()
    # no database password anywhere: slurmdbd logs in through MariaDB's unix_socket authentication
    dbd_conf = ctl.check_output("cat /etc/slurm/slurmdbd.conf")
    assert "StoragePass" not in dbd_conf and ctl.file("/etc/slurm/slurmdbd.conf").mode == 0o600
    alloc = ctl.check_output("scontrol show job %s", job)
    assert re.search(r"AllocTRES=\S*gres/gpu=1\b", alloc), alloc


def test_the_role_chose_native_metrics_on_its_own(ctl):
    conf = ctl.check_output("cat /etc/slurm/slurm.conf")
    assert re.search(r"(?m)^MetricsType=metrics/openmetrics$", conf)
    fact = json.loads(ctl.check_output("cat /etc/ansible/facts.d/hpcobs_slurm_metrics.fact"))
    assert fact["native"] is True and fact["slurm_version"].startswith("26.05.")
    unit = ctl.check_output("systemctl cat hpcobs-slurm-metrics.service")
    assert "--mode=extras" in unit
    # extras only: the collector leaves the slurm_* series to slurmctld
    # (through its front: HTTPS and the collector's client credential, the way VictoriaMetrics scrapes it)
    code, body = get(CTL, "https://127.0.0.1:9341/metrics", "hpcobs:" + credential("slurm-metrics-client"),
                     "/etc/hpcobs-slurm-metrics/tls/ca.crt")
    assert code == 200, body[:300]
    names = {name for name, _ in parse_exposition(body)}
    assert "hpcobs_slurm_node_state_info" in names
    assert not {n for n in names if n.startswith("slurm_")}, sorted(names)


def test_scontrol_token_mints_what_the_victoriametrics_role_reads(ctl):
    """The minting half of slurmctld's metrics behind MetricsAuthUsers, on the real slurmctld with auth/jwt: the
    token scontrol prints is one hpcobs_slurm_token_minted takes, of the user asked for, ending after its lifespan.
    Debian's 26.05 has no http_auth_jwt.so, so its HTTP
    metrics cannot take it (the preflight finds that and keeps the collector)."""
    spec = importlib.util.spec_from_file_location("hpcobs_service", REPO / "playbooks" / "filter_plugins" / "hpcobs_service.py")
    service = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(service)
    before = time.time()
    token = service.slurm_token_minted(ctl.check_output("scontrol token username=hpcobs-metrics lifespan=600"))
    expiry = service.slurm_token_expiry(token)
    assert before + 590 <= expiry <= time.time() + 610, expiry
    payload = token.split(".")[1]
    assert json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["sun"] == "hpcobs-metrics"
    plugins = ctl.run("ls /usr/lib/x86_64-linux-gnu/slurm-wlm/ /usr/lib/aarch64-linux-gnu/slurm-wlm/ 2>/dev/null").stdout
    assert "auth_jwt.so" in plugins and "http_auth_jwt.so" not in plugins


def test_slurmctld_serves_openmetrics_on_its_port(job):
    """Read from the management host, anonymously, as VictoriaMetrics does: every endpoint answers 200."""
    seen = {}
    for path in ENDPOINTS.values():
        code, body = get(MGMT, "http://%s:%d%s" % (CTL, PORT, path))
        assert code == 200, (path, code, body[:300])
        assert "# TYPE slurm_" in body, body[:300]
        seen.update(parse_exposition(body))
    assert seen[("slurm_nodes", ())] == 1
    assert seen[("slurm_node_gpus", (("node", GPU),))] == 2
    assert seen[("slurm_partition_gpus", (("partition", "gpu"),))] == 2
    assert seen[("slurm_jobs_running", ())] >= 1


def test_victoriametrics_scrapes_every_endpoint_every_60s():
    scrape = podman(MGMT).check_output("cat /etc/victoriametrics/scrape.yml")
    for job_name, path in ENDPOINTS.items():
        block = scrape.split("job_name: %s\n" % job_name, 1)[1].split("job_name:", 1)[0]
        assert "metrics_path: %s\n" % path in block and "scrape_interval: 60s" in block, block
        targets = json.loads(podman(MGMT).check_output("cat /etc/victoriametrics/file_sd/%s.json" % job_name))
        assert targets == [{"targets": ["%s:%d" % (CTL, PORT)], "labels": {"node": CTL}}], targets
    wait_for("every slurmctld_* target up", lambda: len(query('up{job=~"slurmctld_.*"} == 1')) == 5, SCRAPE_WAIT, 5)


def test_26_05_gpu_gauges_follow_a_gpu_job(job):
    """One GPU of the node held by alice's job in account physics: node, job, partition, account and user gauges."""
    expected = {
        'slurm_node_gpus_alloc{job="slurmctld_nodes",node="%s"}' % GPU: 1,
        'slurm_node_gpus{job="slurmctld_nodes",node="%s"}' % GPU: 2,
        'slurm_jobs_gpus_alloc{job="slurmctld_jobs"}': 1,
        'slurm_partition_gpus{job="slurmctld_partitions",partition="gpu"}': 2,
        'slurm_partition_jobs_gpus_alloc{job="slurmctld_partitions",partition="gpu"}': 1,
        'slurm_account_jobs_gpus_alloc{job="slurmctld_accounts",account="physics"}': 1,
        'slurm_user_jobs_gpus_alloc{job="slurmctld_accounts",username="alice"}': 1,
        'slurm_user_jobs_running{job="slurmctld_accounts",username="alice"}': 1,
        # and what the lab gives besides GPUs: its one node, one partition, the job
        'slurm_nodes{job="slurmctld_nodes"}': 1,
        'slurm_jobs_running{job="slurmctld_jobs"}': 1,
        'slurm_partition_nodes{job="slurmctld_partitions",partition="gpu"}': 1,
        'slurm_partition_jobs_running{job="slurmctld_partitions",partition="gpu"}': 1,
    }

    def all_there():
        seen = {expr: value_of(expr) for expr in expected}
        return seen if seen == expected else False

    try:
        wait_for("the job in the GPU gauges", all_there, SCRAPE_WAIT, 5)
    except AssertionError:
        pytest.fail("VictoriaMetrics has %r, expected %r" % ({e: value_of(e) for e in expected}, expected))


def test_every_slurm_series_the_rules_read_is_one_slurmctld_serves(job):
    """The rules and the collector use Slurm's names: each slurm_* name of the Slurm rules is in VictoriaMetrics from
    a slurmctld_* job (not from the collector), with the labels the rules group by."""
    rules = "\n".join(line for line in RULES.read_text().splitlines() if not line.lstrip().startswith("#"))
    names = sorted(set(re.findall(r"\bslurm_[a-z_]+\b", rules)))
    assert names, "no slurm_* series in %s" % RULES
    missing = [n for n in names if not query('%s{job=~"slurmctld_.*"}' % n)]
    assert not missing, "read by the rules, not served by slurmctld 26.05: %s" % missing
    for name in names:
        if name.startswith("slurm_partition_"):
            assert all(s["metric"].get("partition") for s in query('%s{job=~"slurmctld_.*"}' % name)), name


def test_drained_node_fires_the_alert_with_its_reason(ctl, job):
    ctl.check_output("scancel %s", job)
    wait_for("job gone", lambda: not ctl.run("squeue -h -j %s -o %%T", job).stdout.strip(), 60)
    sq(ctl, "scontrol", "update", "nodename=%s" % GPU, "state=drain", "reason=%s" % REASON)
    try:
        def firing():
            code, body = get(MGMT, "https://127.0.0.1:8880/api/v1/alerts", "hpcobs:" + credential("vmalert-client"),
                             "/etc/vmalert/tls/ca.crt")
            assert code == 200, body[:300]
            alerts = [a for a in json.loads(body)["data"]["alerts"]
                      if a["name"] == "HpcobsSlurmNodeUnavailable" and a["state"] == "firing"]
            return alerts[0] if alerts else None

        alert = wait_for("HpcobsSlurmNodeUnavailable firing", firing, 120, 3)
        assert alert["labels"]["node"] == GPU
        assert alert["labels"]["state"] in ("drained", "drain")
        assert alert["labels"]["reason"] == REASON
        assert alert["labels"]["audience"] == "ops" and alert["labels"]["severity"] == "warning"
        assert REASON in alert["annotations"]["summary"]
        # slurmctld's own count of drained nodes, scraped at its 60 s interval
        wait_for("slurm_nodes_drained from slurmctld",
                 lambda: value_of('slurm_nodes_drained{job="slurmctld_nodes"}') == 1, SCRAPE_WAIT, 5)
    finally:
        sq(ctl, "scontrol", "update", "nodename=%s" % GPU, "state=resume")


# ------------------------------------------------------------------ the Slurm tools behind the security switch
FRONT = "https://%s:8427" % MGMT
TOOLS_CA = "/etc/hpcobs/tls/ca.crt"
READER_FILE = "/etc/hpcobs/tls/victoriametrics-reader-client"


def test_the_tools_read_victoriametrics_through_its_read_only_front(ctl, job):
    """A user (alice) runs hpcobs-jobstats and hpcobs-report on the controller: both reach VictoriaMetrics' read-only
    front over HTTPS with the credential every local user can read (the job is not in the metrics here, no prolog
    writes its info: exit 2 says the tool got in and asked)."""
    conf = ctl.check_output("cat /etc/hpcobs/jobstats.conf")
    for line in ("url = %s" % FRONT, "ca_file = %s" % TOOLS_CA, "user = hpcobs", "password_file = %s" % READER_FILE):
        assert line in conf.splitlines(), conf
    reader = ctl.file(READER_FILE)
    assert (reader.user, reader.group, reader.mode) == ("root", "root", 0o644)
    assert ctl.file("/etc/hpcobs/tls").mode == 0o755
    stats = ctl.run("runuser -u alice -- hpcobs-jobstats %s --lookback 1d", job)
    assert stats.rc == 2 and "not in the metrics" in stats.stderr, (stats.rc, stats.stdout, stats.stderr)
    report = ctl.run("cd /tmp && runuser -u alice -- hpcobs-report --month-to-date --out-dir /tmp")
    assert report.rc == 0, report.stderr
    # without the credential (another settings file) the front says 401, and the tool says so
    ctl.check_output("printf 'url = %s\\nca_file = %s\\n' > /tmp/no-credential.conf" % (FRONT, TOOLS_CA))
    refused = ctl.run("runuser -u alice -- env HPCOBS_JOBSTATS_CONF=/tmp/no-credential.conf hpcobs-jobstats %s", job)
    assert refused.rc == 1 and "401" in refused.stderr, refused.stderr


@pytest.mark.parametrize("method, path, data", [
    ("POST", "/api/v1/import/prometheus", 'up{job="forged",node="native-gpu1"} 1'),
    ("POST", "/api/v1/write", "x"),
    ("POST", "/api/v1/admin/tsdb/delete_series?match[]=%7Bjob%3D~%22.%2B%22%7D", ""),
    ("GET", "/api/v1/admin/tsdb/delete_series?match[]=%7Bjob%3D~%22.%2B%22%7D", None),
    ("GET", "/snapshot/create", None),
    ("GET", "/-/reload", None),
    ("GET", "/metrics", None),
])
def test_the_credential_users_can_read_writes_deletes_and_administers_nothing(ctl, method, path, data):
    before = value_of('count(up)')
    secret = ctl.check_output("runuser -u alice -- cat %s", READER_FILE)
    reader = "hpcobs:" + secret
    assert get(CTL, FRONT + "/api/v1/query?query=up", reader, TOOLS_CA, user="alice")[0] == 200
    code, body = get(CTL, FRONT + path, reader, TOOLS_CA, method, data, user="alice")
    assert code in (400, 404), (path, code, body[:300])
    # at VictoriaMetrics itself the credential opens nothing
    assert get(CTL, "https://%s:8428%s" % (MGMT, path), reader, TOOLS_CA, method, data, user="alice")[0] == 401
    assert query('up{job="forged"}') == []
    assert value_of('count(up)') == before
