"""End to end on the management hosts: test series -> VictoriaMetrics -> vmalert -> Alertmanager cluster -> webhook.

The webhook helper's series pusher refreshes every *.prom file of its series directory in both VictoriaMetrics every
5 s, as a scrape would. The series are dcgm-exporter's as stored (one copy per Slurm job holding a GPU, label hpc_job, of the fields read per
job; the others once per GPU) and the
Slurm hooks' hpcobs_slurm_job_info{hpc_job,user,account} from node_exporter. Both vmalerts evaluate the real rules,
both send to both Alertmanagers, and the cluster must deliver each notification once.

Faults of this module (the nodes are not in the inventory; `node` is what VictoriaMetrics would have added):
  gpu-e2e01 GPU 0, job 4001 (alice, physics):       ECC double-bit errors -> on-call, then cleared -> resolved
  gpu-e2e02 GPU 1, jobs 4002 (bob, chemistry) and
                   4003 (carol, physics) sharing it: ECC double-bit errors -> on-call, one notification, two alerts
  gpu-e2e03 GPU 2, job 4004 (dave, physics):        hung (memory held, no work) -> physics-team receiver
  gpu-e2e03 GPU 3, job 4005 (erin, biology):        hung -> fallback team receiver (biology has no team receiver)
"""
import datetime
import json
import re
import time

import pytest

from mgmt import (AM, HELPER, MANAGEMENT, SERIES_DIR, VMALERT, get_json, host, main_pid, notifications, post_json, query,
                  write_file)
from polling import wait_for

# Alerts reach the webhook within: `for` (15 s) + rule interval (5 s) + evaluation/latency offsets (2 s) + pushes
# (5 s) + group_wait (10 s), plus slack for a loaded test machine.
DELIVERY_TIMEOUT = 150
# The second Alertmanager would send a duplicate after its peer position wait (15 s per position) if the cluster
# did not share the notification log; wait longer than that before counting.
DUPLICATE_WINDOW = 40

JOBS = {
    "4001": ("alice", "physics"),
    "4002": ("bob", "chemistry"),
    "4003": ("carol", "physics"),
    "4004": ("dave", "physics"),
    "4005": ("erin", "biology"),
}


def gpu_series(node, gpu, jobs, power, ecc=0, util=90, fb_used=2048):
    """dcgm-exporter's series of one GPU as VictoriaMetrics stores them: the fields read per job (the shared
    gpu_job_fields) once per job holding the GPU, the others (here the ECC counter) once, without hpc_job."""
    labels = ('gpu="{gpu}",UUID="GPU-{node}-{gpu}",pci_bus_id="00000000:{bus:02X}:00.0",device="nvidia{gpu}",'
              'modelName="NVIDIA H100 80GB HBM3",Hostname="{node}",DCGM_FI_DRIVER_VERSION="560.35.03",'
              'job="dcgm",instance="{node}:9400",node="{node}"').format(node=node, gpu=gpu, bus=0x17 + gpu)
    lines = ["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{%s} %s" % (labels, ecc)]
    for job in jobs:
        for metric, value in (("DCGM_FI_DEV_GPU_TEMP", 45), ("DCGM_FI_DEV_POWER_USAGE", power),
                              ("DCGM_FI_DEV_GPU_UTIL", util), ("DCGM_FI_DEV_FB_USED", fb_used)):
            lines.append('%s{%s,hpc_job="%s"} %s' % (metric, labels, job, value))
    return lines


def job_info(node, jobs):
    return ['hpcobs_slurm_job_info{hpc_job="%s",user="%s",account="%s",partition="gpu",job="node",'
            'instance="%s:9100",node="%s"} 1' % (job, JOBS[job][0], JOBS[job][1], node, node) for job in jobs]


def put_series(name, lines):
    write_file(HELPER, "%s/%s.prom" % (SERIES_DIR, name), "\n".join(lines) + "\n")


def ecc_gpu01(ecc):
    return gpu_series("gpu-e2e01", 0, ["4001"], power=250.5, ecc=ecc) + job_info("gpu-e2e01", ["4001"])


def ecc_shared_gpu02(ecc):
    return gpu_series("gpu-e2e02", 1, ["4002", "4003"], power=300, ecc=ecc) + job_info("gpu-e2e02", ["4002", "4003"])


def matching(path, alertname, status="firing", **labels):
    """Notifications sent to `path` for groups of `alertname` whose common labels include `labels`."""
    found = []
    for entry in notifications():
        body = entry["body"]
        if entry["path"] != path or body.get("status") != status:
            continue
        if body.get("groupLabels", {}).get("alertname") != alertname:
            continue
        common = body.get("commonLabels", {})
        if all(common.get(k) == v for k, v in labels.items()):
            found.append(entry)
    return found


def described(sent):
    """What a failed exactly-once check shows: each notification's sender, time and alerts (a second one from the
    same sender is a group that changed; from the other, a duplicate), and what both Alertmanagers logged about their
    cluster and notifications."""
    lines = ["%.1f %s from %s: %s" % (
        entry["received"], entry["body"].get("status"), entry["body"].get("externalURL"),
        [(a["labels"].get("hpc_job"), a.get("status"), a.get("startsAt")) for a in entry["body"]["alerts"]])
        for entry in sent]
    for name in MANAGEMENT:
        log = host(name).run("journalctl -u alertmanager --no-pager -o cat --since -10min | "
                             "grep -i -E 'memberlist|cluster|peer|gossip|notify' | tail -15").stdout
        lines.append("%s alertmanager log:\n%s" % (name, log))
    return "\n".join(lines)


def cluster_ready(name):
    cluster = get_json(name, AM + "/api/v2/status")["cluster"]
    return cluster["status"] == "ready" and len(cluster["peers"]) == len(MANAGEMENT)


def settle_after(notification):
    """Wait until DUPLICATE_WINDOW seconds have passed since `notification` arrived."""
    time.sleep(max(0.0, notification["received"] + DUPLICATE_WINDOW - time.time()))


def parse_time(value):
    """RFC 3339 time with any number of fractional digits (vmalert prints nanoseconds)."""
    match = re.match(r"^(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", value)
    assert match, value
    base = datetime.datetime.fromisoformat(match.group(1) + ("+00:00" if match.group(3) == "Z" else match.group(3)))
    return base + datetime.timedelta(microseconds=int((match.group(2) or "0")[:6].ljust(6, "0")))


@pytest.fixture(scope="module")
def faults():
    """Start every fault of the module at once (they are independent), return when the series are written."""
    for name in MANAGEMENT:
        wait_for("a settled Alertmanager cluster on %s" % name, lambda n=name: cluster_ready(n), timeout=90)
    helper = host(HELPER)
    helper.check_output("rm -f %s/*.prom && : > /var/lib/hpcobs-e2e/notifications.jsonl" % SERIES_DIR)
    # Jobs run on healthy GPUs first; the faults come once VictoriaMetrics holds every series (4 GPUs' ECC counters,
    # 5 job copies of the fields read per job: a new series can take a few seconds to become searchable, and copies
    # seen one evaluation apart would fire apart).
    put_series("ecc-gpu01", ecc_gpu01(ecc=0))
    put_series("ecc-shared-gpu02", ecc_shared_gpu02(ecc=0))
    put_series("hang-gpu03", gpu_series("gpu-e2e03", 2, ["4004"], power=60, util=0, fb_used=30000)
               + gpu_series("gpu-e2e03", 3, ["4005"], power=62, util=0, fb_used=25000)
               + job_info("gpu-e2e03", ["4004", "4005"]))
    wait_for("every test series in both VictoriaMetrics", lambda: all(
        query(name, 'count(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{node=~"gpu-e2e0[123]"} == 0)') == [({}, 4.0)]
        and query(name, 'count(DCGM_FI_DEV_GPU_TEMP{node=~"gpu-e2e0[123]", hpc_job!=""})') == [({}, 5.0)]
        and query(name, 'count(hpcobs_slurm_job_info{node=~"gpu-e2e0[123]"})') == [({}, 5.0)]
        for name in MANAGEMENT), timeout=90)
    started = time.time()
    put_series("ecc-gpu01", ecc_gpu01(ecc=2))
    put_series("ecc-shared-gpu02", ecc_shared_gpu02(ecc=3))
    return {"ecc_raised": started}


def test_uncorrectable_ecc_pages_oncall_exactly_once(faults):
    first = wait_for("the on-call notification for gpu-e2e01", lambda: matching(
        "/oncall", "HpcobsGpuEccUncorrectable", node="gpu-e2e01", gpu="0"), DELIVERY_TIMEOUT)
    print("ECC on gpu-e2e01 -> on-call webhook: %.1f s" % (first[0]["received"] - faults["ecc_raised"]))
    settle_after(first[0])
    sent = matching("/oncall", "HpcobsGpuEccUncorrectable", node="gpu-e2e01", gpu="0")
    assert len(sent) == 1, "the Alertmanager cluster sent %d notifications:\n%s" % (len(sent), described(sent))
    body = sent[0]["body"]
    assert body["receiver"] == "oncall"
    assert len(body["alerts"]) == 1
    labels = body["alerts"][0]["labels"]
    assert {k: labels.get(k) for k in ("alertname", "node", "gpu", "hpc_job", "user", "account", "severity",
                                       "audience")} == {
        "alertname": "HpcobsGpuEccUncorrectable", "node": "gpu-e2e01", "gpu": "0", "hpc_job": "4001",
        "user": "alice", "account": "physics", "severity": "critical", "audience": "oncall"}
    annotations = body["alerts"][0]["annotations"]
    assert annotations["summary"] and annotations["runbook"]
    # the on-call URL (with its token) came from the secret file
    assert sent[0]["query"] == "token=e2e-oncall-token-7f3a"
    # the job the fault killed is its team's business too: one notification to physics-team, naming the job
    told = wait_for("the physics-team notification for job 4001", lambda: matching(
        "/physics-team", "HpcobsGpuEccUncorrectable", hpc_job="4001"), DELIVERY_TIMEOUT)
    settle_after(told[0])
    told = matching("/physics-team", "HpcobsGpuEccUncorrectable", hpc_job="4001")
    assert len(told) == 1, "physics-team got %d notifications:\n%s" % (len(told), described(told))
    assert told[0]["body"]["receiver"] == "physics-team"
    assert [(a["labels"]["hpc_job"], a["labels"]["node"], a["labels"]["gpu"], a["labels"]["user"])
            for a in told[0]["body"]["alerts"]] == [("4001", "gpu-e2e01", "0", "alice")]
    # and nobody else's: no ops or fallback notification for it
    assert not [e for e in notifications() if e["path"] not in ("/oncall", "/physics-team")
                and e["body"].get("groupLabels", {}).get("alertname") == "HpcobsGpuEccUncorrectable"]


def test_shared_gpu_is_one_notification_naming_both_jobs(faults):
    first = wait_for("the on-call notification for gpu-e2e02", lambda: matching(
        "/oncall", "HpcobsGpuEccUncorrectable", node="gpu-e2e02", gpu="1"), DELIVERY_TIMEOUT)
    settle_after(first[0])
    sent = matching("/oncall", "HpcobsGpuEccUncorrectable", node="gpu-e2e02", gpu="1")
    assert len(sent) == 1, "the Alertmanager cluster sent %d notifications:\n%s" % (len(sent), described(sent))
    alerts = sent[0]["body"]["alerts"]
    assert sorted((a["labels"]["hpc_job"], a["labels"]["user"], a["labels"]["account"]) for a in alerts) == [
        ("4002", "bob", "chemistry"), ("4003", "carol", "physics")]
    # physics has a team: it hears of its job 4003 once; chemistry has none here, so on-call alone has job 4002
    told = wait_for("the physics-team notification for job 4003", lambda: matching(
        "/physics-team", "HpcobsGpuEccUncorrectable", hpc_job="4003"), DELIVERY_TIMEOUT)
    settle_after(told[0])
    told = matching("/physics-team", "HpcobsGpuEccUncorrectable", hpc_job="4003")
    assert len(told) == 1 and [a["labels"]["hpc_job"] for a in told[0]["body"]["alerts"]] == ["4003"], described(told)
    assert not [e for e in notifications() if e["path"] != "/oncall" and any(
        a["labels"].get("hpc_job") == "4002" for a in e["body"].get("alerts", []))]


def test_hung_job_goes_to_its_team_not_oncall(faults):
    first = wait_for("the physics-team notification for job 4004", lambda: matching(
        "/physics-team", "HpcobsGpuHungJob", hpc_job="4004"), DELIVERY_TIMEOUT)
    settle_after(first[0])
    sent = matching("/physics-team", "HpcobsGpuHungJob", hpc_job="4004")
    assert len(sent) == 1, "the Alertmanager cluster sent %d notifications:\n%s" % (len(sent), described(sent))
    body = sent[0]["body"]
    assert body["receiver"] == "physics-team"
    labels = body["alerts"][0]["labels"]
    assert (labels["node"], labels["gpu"], labels["user"], labels["account"], labels["audience"]) == (
        "gpu-e2e03", "2", "dave", "physics", "team")
    assert not [e for e in notifications() if e["path"] in ("/oncall", "/ops")
                and e["body"].get("groupLabels", {}).get("alertname") == "HpcobsGpuHungJob"]


def test_team_without_a_receiver_gets_the_fallback(faults):
    sent = wait_for("the fallback notification for job 4005", lambda: matching(
        "/teams", "HpcobsGpuHungJob", hpc_job="4005"), DELIVERY_TIMEOUT)
    labels = sent[0]["body"]["alerts"][0]["labels"]
    assert (labels["user"], labels["account"]) == ("erin", "biology")
    assert not matching("/physics-team", "HpcobsGpuHungJob", hpc_job="4005")


def test_power_is_recorded_per_account(faults):
    # each job copy of a GPU gets an equal share of its power: gpu-e2e02's 300 W split between two jobs
    expected = {"physics": 250.5 + 150 + 60, "chemistry": 150.0, "biology": 62.0}

    def recorded(name):
        values = {labels["account"]: value for labels, value in query(name, "account:hpcobs_gpu_power_watts:sum")}
        return values if all(abs(values.get(k, -1) - v) < 0.01 for k, v in expected.items()) else None
    for name in MANAGEMENT:
        wait_for("account power recorded in %s" % name, lambda n=name: recorded(n), timeout=90)
    jobs = {labels["hpc_job"]: (labels["user"], labels["account"], value)
            for labels, value in query(MANAGEMENT[0], "hpc_job:hpcobs_gpu_power_watts:sum")}
    assert jobs["4001"] == ("alice", "physics", 250.5)
    # the site's own recording rule runs next to the role's
    assert query(MANAGEMENT[0], "site:hpcobs_e2e_gpus:count")


def test_alert_state_is_restored_after_a_vmalert_restart(faults):
    name = MANAGEMENT[0]

    def ecc_alert():
        alerts = get_json(name, VMALERT + "/api/v1/alerts")["data"]["alerts"]
        return [a for a in alerts if a["name"] == "HpcobsGpuEccUncorrectable" and a["labels"].get("node") == "gpu-e2e01"
                and a["state"] == "firing"]
    before = wait_for("the firing ECC alert in vmalert", ecc_alert, DELIVERY_TIMEOUT)[0]
    # the state vmalert restores from is in VictoriaMetrics
    assert query(name, 'ALERTS_FOR_STATE{alertname="HpcobsGpuEccUncorrectable",node="gpu-e2e01"}')
    pid = main_pid(name, "vmalert")
    host(name).check_output("systemctl restart vmalert")
    assert main_pid(name, "vmalert") != pid
    after = wait_for("the ECC alert after the restart", ecc_alert, timeout=60)[0]
    activated = [parse_time(a["activeAt"]) for a in (before, after)]
    # a fresh start would make it pending again with activeAt = now; restored, it keeps when it began
    assert abs((activated[1] - activated[0]).total_seconds()) < 2, (before["activeAt"], after["activeAt"])


def test_critical_inhibits_warning_of_the_same_gpu():
    now = datetime.datetime.now(datetime.timezone.utc)
    ends = (now + datetime.timedelta(minutes=10)).isoformat()
    common = {"alertname": "HpcobsE2eInhibitProbe", "node": "probe01", "gpu": "0", "audience": "ops"}
    alerts = [{"labels": dict(common, severity=severity), "endsAt": ends} for severity in ("critical", "warning")]
    alerts.append({"labels": dict(common, severity="warning", gpu="1"), "endsAt": ends})
    status, body = post_json(MANAGEMENT[0], AM + "/api/v2/alerts", alerts)
    assert status == 200, body
    url = AM + "/api/v2/alerts?filter=alertname%3D%22HpcobsE2eInhibitProbe%22"

    def states():
        found = get_json(MANAGEMENT[0], url)
        return {(a["labels"]["severity"], a["labels"]["gpu"]): a["status"] for a in found} if len(found) == 3 else None
    state = wait_for("the probe alerts in Alertmanager", states, 30)
    assert state[("warning", "0")]["state"] == "suppressed" and state[("warning", "0")]["inhibitedBy"]
    assert state[("critical", "0")]["state"] == "active"
    # another GPU of the node is not silenced
    assert state[("warning", "1")]["state"] == "active"


def test_node_down_inhibits_that_nodes_gpu_alerts():
    now = datetime.datetime.now(datetime.timezone.utc)
    ends = (now + datetime.timedelta(minutes=10)).isoformat()
    alerts = [
        {"labels": {"alertname": "HpcobsNodeDown", "node": "probe02", "severity": "warning", "audience": "ops"},
         "endsAt": ends},
        {"labels": {"alertname": "HpcobsGpuTemperatureCritical", "node": "probe02", "gpu": "3",
                    "severity": "critical", "audience": "ops"}, "endsAt": ends},
        {"labels": {"alertname": "HpcobsGpuTemperatureCritical", "node": "probe03", "gpu": "3",
                    "severity": "critical", "audience": "ops"}, "endsAt": ends},
    ]
    status, body = post_json(MANAGEMENT[1], AM + "/api/v2/alerts", alerts)
    assert status == 200, body
    url = AM + "/api/v2/alerts?filter=node%3D~%22probe0%5B23%5D%22"

    def states():
        found = get_json(MANAGEMENT[1], url)
        return {(a["labels"]["alertname"], a["labels"]["node"]): a["status"] for a in found} if len(found) == 3 else None
    state = wait_for("the probe alerts in Alertmanager", states, 30)
    assert state[("HpcobsGpuTemperatureCritical", "probe02")]["state"] == "suppressed"
    assert state[("HpcobsNodeDown", "probe02")]["state"] == "active"
    assert state[("HpcobsGpuTemperatureCritical", "probe03")]["state"] == "active"


def test_cleared_fault_resolves(faults):
    # the GPU was reset: its ECC counter is back at 0 (the job still runs)
    put_series("ecc-gpu01", ecc_gpu01(ecc=0))
    cleared = time.time()
    resolved = wait_for("the resolved notification for gpu-e2e01", lambda: matching(
        "/oncall", "HpcobsGpuEccUncorrectable", status="resolved", node="gpu-e2e01", gpu="0"), DELIVERY_TIMEOUT)
    print("ECC cleared on gpu-e2e01 -> resolved on the on-call webhook: %.1f s" % (resolved[0]["received"] - cleared))
    assert resolved[0]["body"]["alerts"][0]["labels"]["hpc_job"] == "4001"
    assert json.dumps(resolved[0]["body"]).count("HpcobsGpuEccUncorrectable") >= 1
