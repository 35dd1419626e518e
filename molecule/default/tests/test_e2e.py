"""The end-to-end proof, on the whole stack as make lab deploys it.

A real Slurm job (user alice, account physics) on 2 GPUs of e2e-gpu01 -> VictoriaMetrics holds the dcgm series of
exactly those GPUs with its hpc_job -> the per-account power recording rule shows physics -> an ECC double-bit fault
on one of those GPUs -> the on-call webhook receives exactly one notification naming node, gpu, hpc_job, alice and
physics -> the fault is cleared and the job ends -> the alert resolves. The same for a hung GPU in a job of bob
(chemistry: the team's receiver, not on-call) and for an XID 79 (on-call). Then every dashboard panel's query is
evaluated against this VictoriaMetrics.

The stack runs with the site's security switch on (its default): the tests reach VictoriaMetrics as its clients do,
over HTTPS trusting the site CA, with the client credential victoriametrics-client of the scenario's PKI.

The tests run in order and share one state (the module-scoped `e2e` fixture); timings are collected in it and
written to .cache/logs/e2e-timings.json.
"""
import csv
import io
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
import site_tls
import yaml
from polling import wait_for

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "dashboards"))

MGMT, CTL, GPU1, GPU2, HOOK = "e2e-mgmt01", "e2e-ctl01", "e2e-gpu01", "e2e-gpu02", "e2e-webhook"
NETWORK = "hpcobs-mol-e2e"
# The scenario's timings (molecule.yml): scrape and evaluation every 5 s, group_wait 3 s.
SCRAPE, EVAL, GROUP_WAIT = 5, 5, 3
FOR = {"HpcobsGpuEccUncorrectable": 10, "HpcobsGpuXidCritical": 10, "HpcobsGpuHungJob": 15}
HANG_WINDOW = 30


def sh(host, command, check=True):
    proc = subprocess.run(["podman", "exec", host, "sh", "-c", command], capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, "%s: %s\n%s%s" % (host, command, proc.stdout, proc.stderr)
    return proc.stdout


def address(host):
    out = subprocess.run(["podman", "inspect", "-f", "{{json .NetworkSettings.Networks}}", host], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)[NETWORK]["IPAddress"]


class E2E:
    def __init__(self):
        self.vm = "https://%s:8428" % address(MGMT)
        self.hook = "http://%s:8080" % address(HOOK)
        self.timings = {}
        self.jobs = {}

    def query(self, expr):
        url = "%s/api/v1/query?%s" % (self.vm, urllib.parse.urlencode({"query": expr}))
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)["data"]["result"]

    def notifications(self, path=None):
        with urllib.request.urlopen(self.hook + "/notifications", timeout=10) as response:
            lines = response.read().decode().splitlines()
        found = [json.loads(line) for line in lines if line.strip()]
        return [n for n in found if path is None or n["path"] == path]

    def alerts(self, alertname, path=None, status=None):
        """(notification, alert) pairs for an alert name, optionally limited to a receiver path and a status."""
        pairs = []
        for note in self.notifications(path):
            for alert in note["body"].get("alerts", []):
                if alert["labels"].get("alertname") == alertname and (status is None or alert["status"] == status):
                    pairs.append((note, alert))
        return pairs

    def submit(self, user, account, node, gpus, name, mail=""):
        jobid = sh(CTL, "runuser -u %s -- sbatch --parsable -w %s --gres=gpu:%d -A %s -J %s -o /dev/null %s"
                        "--wrap 'sleep 1200'" % (user, node, gpus, account, name,
                                                 "--mail-type=%s " % mail if mail else "")).strip().split(";")[0]
        assert jobid.isdigit(), jobid
        wait_for("job %s running" % jobid,
                 lambda: sh(CTL, "squeue -h -j %s -o %%T" % jobid).strip() == "RUNNING", 90)
        gpu_ids = wait_for("mapping files of job %s" % jobid, lambda: self.mapped_gpus(node, jobid), 30)
        self.jobs[name] = {"id": jobid, "node": node, "gpus": gpu_ids, "user": user, "account": account}
        return self.jobs[name]

    def owned(self, job, timeout=60):
        """Wait until the owner record every GPU alert starts from (gpu:hpcobs_gpu_owner:info) names the job, with its
        user and account, on each of its GPUs: it trails the job's series by one evaluation (docs/alerts.md)."""
        expr = 'gpu:hpcobs_gpu_owner:info{hpc_job="%s", user="%s", account="%s"}' % (job["id"], job["user"],
                                                                                   job["account"])
        return wait_for("owner record of job %s" % job["id"], lambda: sorted(
            r["metric"]["gpu"] for r in self.query(expr) if r["metric"]["node"] == job["node"]) == job["gpus"], timeout)

    @staticmethod
    def mapped_gpus(node, jobid):
        out = sh(node, "cd /run/hpcobs/dcgm-job-mapping && grep -lx %s [0-9]* || true" % jobid)
        return sorted(out.split())

    def finish(self, job):
        sh(CTL, "scancel %s" % job["id"])
        wait_for("job %s gone" % job["id"], lambda: sh(CTL, "squeue -h -j %s -o %%T" % job["id"], check=False)
                 .strip() in ("", "COMPLETED", "CANCELLED"), 60)


@pytest.fixture(scope="module")
def e2e():
    names = {address(MGMT): MGMT}
    urllib.request.install_opener(site_tls.opener(lambda: names, user="hpcobs",
                                                  password=site_tls.credential("victoriametrics-client")))
    state = E2E()
    yield state
    urllib.request.install_opener(urllib.request.build_opener())
    path = os.path.join(ROOT, ".cache", "logs", "e2e-timings.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(state.timings, handle, indent=2, sort_keys=True)
    print("\nend-to-end timings: %s" % json.dumps(state.timings, sort_keys=True))


def test_every_gpu_of_the_lab_is_scraped(e2e):
    series = wait_for("8 simulated GPUs in VictoriaMetrics", lambda: len(e2e.query("DCGM_FI_DEV_GPU_TEMP")) == 8, 120)
    assert series
    nodes = {r["metric"]["node"] for r in e2e.query("DCGM_FI_DEV_GPU_TEMP")}
    assert nodes == {GPU1, GPU2}
    assert not e2e.query("up == 0"), "a scrape target is down: %s" % e2e.query("up == 0")


# What a job on a GPU node could try against the management host: (component, method, path, body). Every one must
# be refused (401) without a credential, and plain HTTP must not be served.
HOSTILE = [
    ("victoriametrics", "GET", "/api/v1/query?query=up", None),
    ("victoriametrics", "POST", "/api/v1/import", '{"metric":{"__name__":"up","job":"forged"},"values":[1],"timestamps":[1]}'),
    ("victoriametrics", "POST", "/api/v1/admin/tsdb/delete_series?match[]=up", None),
    ("victoriametrics_reader", "GET", "/api/v1/query?query=up", None),
    ("vmalert", "GET", "/api/v1/rules", None),
    ("alertmanager", "POST", "/api/v2/silences",
     '{"matchers":[{"name":"alertname","value":".+","isRegex":true}],"startsAt":"2020-01-01T00:00:00Z",'
     '"endsAt":"2099-01-01T00:00:00Z","createdBy":"job","comment":"quiet"}'),
    ("alertmanager", "GET", "/api/v2/alerts", None),
    ("loki", "POST", "/loki/api/v1/push", '{"streams":[{"stream":{"job":"forged"},"values":[["1","x"]]}]}'),
    ("loki", "GET", "/loki/api/v1/query?query=%7Bjob%3D%22systemd-journal%22%7D", None),
    ("grafana", "GET", "/api/search", None),
]
# Run as the job's user on the GPU node: the status of each request (0: nothing answered), without any credential
# and without verifying the server (an attacker has no reason to).
_PROBE = r"""
import json, ssl, sys, urllib.error, urllib.request
out = []
for url, method, body in json.loads(sys.argv[1]):
    req = urllib.request.Request(url, data=body.encode() if body else None, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        code = urllib.request.urlopen(req, timeout=10, context=ssl._create_unverified_context()).status
    except urllib.error.HTTPError as err:
        code = err.code
    except Exception:
        code = 0
    out.append(code)
print(json.dumps(out))
"""


def test_a_job_on_a_gpu_node_without_credentials_is_refused_by_every_management_api(e2e):
    with open(os.path.join(ROOT, "files", "components.yml"), encoding="utf-8") as handle:
        components = yaml.safe_load(handle)["components"]
    secured = [(c, m, p, b) for c, m, p, b in HOSTILE if components[c].get("tls")]
    assert {c for c, _, _, _ in secured} >= {"victoriametrics", "victoriametrics_reader", "vmalert", "alertmanager",
                                             "loki", "grafana"}, secured
    mgmt = address(MGMT)
    requests = [("https://%s:%d%s" % (mgmt, components[c]["port"], p), m, b) for c, m, p, b in secured]
    plain = [("http://%s:%d%s" % (mgmt, components[c]["port"], p), m, b) for c, m, p, b in secured]
    before = len(e2e.query('{__name__="up"}'))
    out = sh(GPU1, "runuser -u alice -- python3 -c %s %s" % (shlex.quote(_PROBE), shlex.quote(json.dumps(requests))))
    codes = dict(zip(["%s %s %s" % (c, m, p) for c, m, p, _ in secured], json.loads(out)))
    assert set(codes.values()) == {401}, codes
    out = sh(GPU1, "runuser -u alice -- python3 -c %s %s" % (shlex.quote(_PROBE), shlex.quote(json.dumps(plain))))
    codes = dict(zip(["%s %s %s" % (c, m, p) for c, m, p, _ in secured], json.loads(out)))
    assert all(code in (0, 400) for code in codes.values()), codes  # a TLS port answers plain HTTP with 400
    # nothing was deleted or forged (a silence would stop the pages the tests below wait for)
    assert len(e2e.query('{__name__="up"}')) == before
    assert not e2e.query('up{job="forged"}')


def test_job_attribution_reaches_victoriametrics(e2e):
    t0 = time.time()
    # alice asks for Slurm's mail at the job's end: the lab's MailProg is hpcobs-slurm-mail (job-end summary)
    job = e2e.submit("alice", "physics", GPU1, 2, "e2e-ecc", mail="END")
    assert len(job["gpus"]) == 2
    expr = 'DCGM_FI_DEV_POWER_USAGE{hpc_job="%s"}' % job["id"]
    result = wait_for("power series of job %s" % job["id"], lambda: e2e.query(expr), 60)
    assert {(r["metric"]["node"], r["metric"]["gpu"]) for r in result} == {(GPU1, g) for g in job["gpus"]}
    # the fields not read per job are stored once per GPU, without the job (the dcgm job's relabelling). Read as the
    # rules read them (last sample of the last minute): the scrape that saw the job start also wrote a stale marker
    # on them (the line without the job is gone from dcgm-exporter's text), which an instant read sees until the
    # next scrape.
    xid = e2e.query('last_over_time(DCGM_FI_DEV_XID_ERRORS{node="%s"}[1m])' % GPU1)
    assert xid and not [r for r in xid if "hpc_job" in r["metric"]], xid
    assert {r["metric"]["gpu"] for r in xid} >= set(job["gpus"])
    info = wait_for("job info", lambda: e2e.query('hpcobs_slurm_job_info{hpc_job="%s"}' % job["id"]), 60)
    assert info[0]["metric"]["user"] == "alice" and info[0]["metric"]["account"] == "physics"
    assert info[0]["metric"]["node"] == GPU1
    e2e.timings["job_start_to_hpc_job_series_s"] = round(time.time() - t0, 1)
    e2e.owned(job)
    e2e.timings["job_start_to_owner_record_s"] = round(time.time() - t0, 1)


def test_per_account_power_recording_rule_shows_the_account(e2e):
    t0 = time.time()
    result = wait_for("account:hpcobs_gpu_power_watts:sum for physics",
                      lambda: e2e.query('account:hpcobs_gpu_power_watts:sum{account="physics"} > 0'), 90)
    assert float(result[0]["value"][1]) > 0
    assert wait_for("GPUs in use by physics",
                    lambda: e2e.query('account:hpcobs_gpus_in_use:count{account="physics"} == 2'), 60)
    e2e.timings["recording_rule_visible_s"] = round(time.time() - t0, 1)


def wait_for_page(e2e, alertname, path, job, gpu, timeout):
    def delivered():
        return [(n, a) for n, a in e2e.alerts(alertname, path, "firing")
                if a["labels"].get("gpu") == gpu and a["labels"].get("hpc_job") == job["id"]]
    return wait_for("%s for job %s gpu %s at %s" % (alertname, job["id"], gpu, path), delivered, timeout, 0.5)


def test_ecc_double_bit_error_pages_oncall_once_with_the_job(e2e):
    job = e2e.jobs["e2e-ecc"]
    gpu = job["gpus"][0]
    t0 = time.time()
    sh(GPU1, "hpcobs-gpusim fault set --gpu %s ecc-dbe" % gpu)
    bound = FOR["HpcobsGpuEccUncorrectable"] + 2 * SCRAPE + EVAL + GROUP_WAIT
    delivered = wait_for_page(e2e, "HpcobsGpuEccUncorrectable", "/oncall", job, gpu, bound + 60)
    delay = delivered[0][0]["received"] - t0
    e2e.timings["ecc_fault_to_oncall_notification_s"] = round(delay, 1)
    labels = delivered[0][1]["labels"]
    assert (labels["node"], labels["gpu"], labels["hpc_job"], labels["user"], labels["account"]) == \
        (GPU1, gpu, job["id"], "alice", "physics")
    assert labels["severity"] == "critical" and labels["audience"] == "oncall"
    assert delivered[0][1]["annotations"].get("runbook")
    assert delay <= bound, "notified after %.1fs; bound for + 2 scrapes + eval + group_wait = %ss" % (delay, bound)
    # exactly one notification to on-call, and one to the team of the job's account (physics) naming the job; no
    # other (give a second one the chance to arrive)
    time.sleep(2 * (EVAL + GROUP_WAIT))
    assert len(e2e.alerts("HpcobsGpuEccUncorrectable", "/oncall", "firing")) == 1
    told = e2e.alerts("HpcobsGpuEccUncorrectable", "/physics-team", "firing")
    assert len(told) == 1 and told[0][1]["labels"]["hpc_job"] == job["id"], told
    assert len(e2e.alerts("HpcobsGpuEccUncorrectable", status="firing")) == 2


def test_clearing_the_fault_and_ending_the_job_resolves_and_cleans_up(e2e):
    job = e2e.jobs["e2e-ecc"]
    t0 = time.time()
    sh(GPU1, "hpcobs-gpusim fault clear --gpu %s" % job["gpus"][0])
    e2e.finish(job)
    resolved = wait_for("resolved ECC notification",
                        lambda: e2e.alerts("HpcobsGpuEccUncorrectable", "/oncall", "resolved"), 120, 0.5)
    assert resolved[0][1]["labels"]["hpc_job"] == job["id"]
    e2e.timings["ecc_clear_to_resolved_s"] = round(resolved[0][0]["received"] - t0, 1)
    # the epilog emptied the mapping files (never deleted them) and removed the job's metric file
    for gpu in job["gpus"]:
        assert sh(GPU1, "cat /run/hpcobs/dcgm-job-mapping/%s" % gpu) == ""
    assert sh(GPU1, "ls /var/lib/node_exporter/textfile/").count("hpcobs_slurm_job_%s.prom" % job["id"]) == 0


def raw_series(e2e, selector, start, end):
    """Raw samples from VictoriaMetrics' export API: {(node, gpu): [(t, v)]}."""
    url = "%s/api/v1/export?%s" % (e2e.vm, urllib.parse.urlencode(
        {"match[]": selector, "start": "%.3f" % start, "end": "%.3f" % end}))
    with urllib.request.urlopen(url, timeout=30) as response:
        lines = response.read().decode().splitlines()
    found = {}
    for line in lines:
        if line.strip():
            item = json.loads(line)
            key = (item["metric"].get("node", ""), item["metric"].get("gpu", ""))
            # null: a staleness marker (the series ended), which VictoriaMetrics exports as such
            found.setdefault(key, []).extend(sorted(
                (t / 1000.0, float(v)) for t, v in zip(item["timestamps"], item["values"]) if v is not None))
    return found


def held(points):
    """Value x seconds of a gauge sampled at points, each value held until the next sample."""
    return sum((t2 - t1) * v1 for (t1, v1), (t2, _) in zip(points, points[1:]))


def test_jobstats_and_report_give_the_numbers_of_the_raw_series(e2e):
    """hpcobs-jobstats and hpcobs-report, run on the controller as a user would, for the finished ECC job of alice
    (physics): their numbers against sums computed here from the raw series in VictoriaMetrics."""
    job = e2e.jobs["e2e-ecc"]
    stats = json.loads(sh(CTL, "runuser -u alice -- hpcobs-jobstats %s --json" % job["id"]))
    assert (stats["job"], stats["user"], stats["account"], stats["nodes"]) == (job["id"], "alice", "physics", [GPU1])
    assert sorted(g["gpu"] for g in stats["gpus"]) == job["gpus"]
    start, end = stats["start"], stats["end"]
    selector = '%%s{hpc_job="%s"}' % job["id"]
    util = raw_series(e2e, selector % "DCGM_FI_DEV_GPU_UTIL", start - 60, end + 60)
    power = raw_series(e2e, selector % "DCGM_FI_DEV_POWER_USAGE", start - 60, end + 60)
    memory = raw_series(e2e, selector % "DCGM_FI_DEV_FB_USED", start - 60, end + 60)
    energy = raw_series(e2e, selector % "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", start - 60, end + 60)
    assert set(util) == {(GPU1, g) for g in job["gpus"]}
    kwh = hours = 0.0
    for gpu in stats["gpus"]:
        key = (gpu["node"], gpu["gpu"])
        for field, series in (("utilisation_percent", util), ("power_watts", power), ("memory_used_mib", memory)):
            values = [v for _, v in series[key]]
            assert gpu[field]["mean"] == pytest.approx(sum(values) / len(values)), (key, field)
            assert gpu[field]["max"] == max(values), (key, field)
        # the simulator's energy counter (mJ) never resets during the job
        counter = [v for _, v in energy[key]]
        assert gpu["energy_source"] == "energy counter"
        assert gpu["energy_kwh"] == pytest.approx((counter[-1] - counter[0]) / 1000 / 3.6e6), key
        kwh += (counter[-1] - counter[0]) / 1000 / 3.6e6
        hours += (util[key][-1][0] - util[key][0][0]) / 3600
    assert stats["energy_kwh"] == pytest.approx(kwh) and stats["gpu_hours"] == pytest.approx(hours)
    assert stats["energy_kwh"] > 0 and stats["gpu_hours"] > 0
    # the fault injected on its first GPU is among the alerts during the job
    assert ("HpcobsGpuEccUncorrectable", GPU1, job["gpus"][0]) in {
        (a["alertname"], a["node"], a["gpu"]) for a in stats["alerts"]}, stats["alerts"]
    assert stats["verdict"]
    text = sh(CTL, "runuser -u alice -- hpcobs-jobstats %s" % job["id"])
    assert text.startswith("Job %s  user alice  account physics" % job["id"]) and "Verdict: " in text

    # the mail Slurm sent alice when the job ended (MailProg hpcobs-slurm-mail -> the lab's mailer) carries the same
    # summary, made 10 s (slurm_metrics_job_summary_delay) after the end: job, GPU-hours and energy of the JSON above
    spool = "/var/spool/hpcobs-lab-mail"
    name = wait_for("the end mail of job %s" % job["id"], lambda: sh(
        CTL, "cd %s && ls -1 -- *.%s.mail 2>/dev/null || true" % (spool, job["id"])).split(), 90)
    assert len(name) == 1, name
    mail = sh(CTL, "cat %s/%s" % (spool, name[0]))
    head, _, body = mail.partition("\n\n")
    assert head.splitlines()[0] == "To: alice"
    assert re.match(r"Subject: Slurm Job_id=%s Name=e2e-ecc Ended" % job["id"], head.splitlines()[1]), head
    assert body.startswith("GPU summary (hpcobs-jobstats %s):\n\nJob %s  user alice  account physics" % (
        job["id"], job["id"])), body
    assert "(ended, " in body and "still running" not in body, body
    totals = re.search(r"GPUs:  2   GPU-hours: ([0-9.]+)   energy: ([0-9.]+) kWh", body)
    assert totals, body
    assert float(totals.group(1)) == pytest.approx(stats["gpu_hours"], abs=0.006)
    assert float(totals.group(2)) == pytest.approx(stats["energy_kwh"], abs=0.0006)
    assert "HpcobsGpuEccUncorrectable" in body and "\nVerdict: " in body

    # the report of a period covering the job (and the other accounts' jobs so far: none)
    period_start, period_end = int(start) - 60, int(time.time()) - 5
    iso = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))  # noqa: E731
    sh(CTL, "rm -rf /tmp/e2e-report && mkdir /tmp/e2e-report")
    markdown = sh(CTL, "hpcobs-report --start %s --end %s --price-kwh 0.25 --co2-g-per-kwh 350 "
                       "--out-dir /tmp/e2e-report" % (iso(period_start), iso(period_end)))
    rows = list(csv.DictReader(io.StringIO(sh(CTL, "cat /tmp/e2e-report/*.csv"))))
    # and its chart: one PNG beside the CSV and the Markdown
    assert sh(CTL, "for f in /tmp/e2e-report/*.png; do head -c 8 \"$f\" | od -An -tx1; done").split() == [
        "89", "50", "4e", "47", "0d", "0a", "1a", "0a"]
    physics = [r for r in rows if r["level"] == "account" and r["account"] == "physics"]
    alice = [r for r in rows if r["level"] == "user" and (r["account"], r["user"]) == ("physics", "alice")]
    assert len(physics) == 1 and len(alice) == 1, rows
    # the tools' CSV has 4 decimals; the recording rules' series may gain or lose one evaluation (5 s) at each edge
    csv_digit = 0.5e-4
    rule_hours = sum(held(p) for p in raw_series(e2e, 'account:hpcobs_gpus_in_use:count{account="physics"}',
                                                 period_start, period_end).values()) / 3600
    watts = raw_series(e2e, 'account:hpcobs_gpu_power_watts:sum{account="physics"}', period_start, period_end)
    rule_kwh = sum(held(p) for p in watts.values()) / 3.6e6
    max_watts = max(v for p in watts.values() for _, v in p)
    assert float(physics[0]["gpu_hours"]) == pytest.approx(rule_hours, abs=2 * 2 * EVAL / 3600 + csv_digit)
    assert float(physics[0]["energy_kwh"]) == pytest.approx(rule_kwh, abs=2 * EVAL * max_watts / 3.6e6 + csv_digit)
    assert float(alice[0]["gpu_hours"]) == pytest.approx(float(physics[0]["gpu_hours"]), abs=2 * 2 * EVAL / 3600)
    # the recording rules and the job's own samples tell the same story: the rules start and end up to two scrapes
    # and an evaluation after the job's series, on each of its 2 GPUs
    assert float(physics[0]["gpu_hours"]) == pytest.approx(hours, abs=2 * 2 * (2 * SCRAPE + EVAL) / 3600)
    assert float(physics[0]["cost"]) == pytest.approx(float(physics[0]["energy_kwh"]) * 0.25, abs=2 * csv_digit)
    assert "physics" in markdown and "alice" in markdown
    samples = os.path.join(ROOT, ".cache", "logs", "e2e-samples")
    os.makedirs(samples, exist_ok=True)
    for name, content in (("hpcobs-jobstats.txt", text), ("hpcobs-report.md", markdown)):
        with open(os.path.join(samples, name), "w", encoding="utf-8") as handle:
            handle.write(content)


def test_hung_gpu_in_a_job_notifies_the_owning_team_not_oncall(e2e):
    job = e2e.submit("bob", "chemistry", GPU2, 1, "e2e-hang")
    gpu = job["gpus"][0]
    wait_for("series of the hang job", lambda: e2e.query('DCGM_FI_DEV_GPU_UTIL{hpc_job="%s"}' % job["id"]), 60)
    t0 = time.time()
    sh(GPU2, "hpcobs-gpusim fault set --gpu %s hang" % gpu)
    bound = HANG_WINDOW + FOR["HpcobsGpuHungJob"] + 2 * SCRAPE + EVAL + GROUP_WAIT
    delivered = wait_for_page(e2e, "HpcobsGpuHungJob", "/chemistry-team", job, gpu, bound + 60)
    e2e.timings["hang_to_team_notification_s"] = round(delivered[0][0]["received"] - t0, 1)
    labels = delivered[0][1]["labels"]
    assert (labels["node"], labels["user"], labels["account"], labels["audience"]) == (GPU2, "bob", "chemistry", "team")
    assert not e2e.alerts("HpcobsGpuHungJob", "/oncall"), "a hung job must not page on-call"
    sh(GPU2, "hpcobs-gpusim fault clear --gpu %s" % gpu)
    e2e.finish(job)
    wait_for("resolved hang notification", lambda: e2e.alerts("HpcobsGpuHungJob", "/chemistry-team", "resolved"),
             120, 0.5)


def test_xid_79_pages_oncall_with_the_job(e2e):
    job = e2e.submit("carol", "physics", GPU2, 2, "e2e-xid")
    gpu = job["gpus"][-1]
    wait_for("series of the xid job", lambda: e2e.query('DCGM_FI_DEV_GPU_TEMP{hpc_job="%s"}' % job["id"]), 60)
    # the bound below is from fault to page for a job the GPU alerts already know
    e2e.owned(job)
    t0 = time.time()
    sh(GPU2, "hpcobs-gpusim fault set --gpu %s xid --code 79" % gpu)
    bound = FOR["HpcobsGpuXidCritical"] + 2 * SCRAPE + EVAL + GROUP_WAIT
    delivered = wait_for_page(e2e, "HpcobsGpuXidCritical", "/oncall", job, gpu, bound + 60)
    delay = delivered[0][0]["received"] - t0
    e2e.timings["xid79_to_oncall_notification_s"] = round(delay, 1)
    labels = delivered[0][1]["labels"]
    assert (labels["node"], labels["user"], labels["account"]) == (GPU2, "carol", "physics")
    assert delay <= bound
    # the kernel-style line reached the node's journal (Promtail ships it to Loki)
    assert re.search(r"NVRM: Xid \(PCI:[0-9a-f:.]+\): 79", sh(GPU2, "journalctl -k --no-pager -n 50"))


def test_every_dashboard_query_returns_data(e2e):
    import queries  # tests/dashboards/queries.py
    job = e2e.jobs["e2e-xid"]
    # range panels need some recording-rule history: retry for a while before judging
    problems = []
    deadline = time.time() + 240
    while time.time() < deadline:
        problems = queries.check(e2e.vm, overrides={"account": "physics", "job": job["id"]})
        if not problems:
            break
        time.sleep(15)
    assert not problems, "dashboard queries without data:\n" + "\n".join(problems)


def test_xid_resolves_and_no_node_was_drained(e2e):
    job = e2e.jobs["e2e-xid"]
    sh(GPU2, "hpcobs-gpusim fault clear --gpu %s" % job["gpus"][-1])
    e2e.finish(job)
    wait_for("resolved XID notification", lambda: e2e.alerts("HpcobsGpuXidCritical", "/oncall", "resolved"), 120, 0.5)
    states = sh(CTL, "sinfo -h -N -o '%N %t'")
    assert "drain" not in states and "down" not in states, states


def test_memory_of_the_metrics_services(e2e):
    for service in ("victoriametrics", "vmalert"):
        pid = sh(MGMT, "systemctl show -p MainPID --value %s" % service).strip()
        rss_kib = int(re.search(r"VmRSS:\s+(\d+)", sh(MGMT, "cat /proc/%s/status" % pid)).group(1))
        e2e.timings["%s_rss_mib" % service] = round(rss_kib / 1024, 1)
        assert rss_kib > 0
