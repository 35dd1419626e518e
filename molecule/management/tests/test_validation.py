"""Changes to a running management pair: bad input given to the roles (preflight refuses what it can judge, the
real tools refuse the rest, and in both cases the files in place and the running services stay as they were), a
new node reaching VictoriaMetrics without a restart, and silences surviving a restart of every Alertmanager.

The role tests run a role of the scenario again (apply_role.yml) with extra variables on top of group_vars/management.yml. These
tests run after the end-to-end module: restarts would disturb its timings.
"""
import datetime
import json
import os
import re
import time

import pytest
import yaml

from mgmt import (AM, AM_AUTH, MANAGEMENT, SCENARIO_DIR, VMALERT, get_json, host, http, main_pid, post_json,
                  run_role, scraper)
from polling import wait_for

with open(os.path.join(SCENARIO_DIR, "group_vars", "management.yml"), encoding="utf-8") as handle:
    SCENARIO_VARS = yaml.safe_load(handle)


def checksums(paths):
    return {(name, path): host(name).file(path).sha256sum for name in MANAGEMENT for path in paths}


def pids(unit):
    return {name: main_pid(name, unit) for name in MANAGEMENT}


def recap_changed(output):
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\S+)\s*:\s*ok=\d+\s+changed=(\d+)", output, re.M)}


def failed_task(output):
    """Name of the task that failed (the last TASK header before the first 'fatal:')."""
    head = output[:output.index("fatal:")]
    return re.findall(r"^TASK \[(?:[^:\]]+ : )?([^\]]+)\]", head, re.M)[-1]


RULE_FILES = ["/etc/vmalert/rules/%s" % f for f in (
    "hpcobs-energy.yml", "hpcobs-fleet.yml", "hpcobs-gpu.yml", "hpcobs-monitoring.yml", "hpcobs-node.yml",
    "site-rules.yml")]


def test_invalid_rule_expression_is_refused_and_the_running_rules_stay():
    before, pid_before = checksums(RULE_FILES), pids("vmalert")
    bad = [{"name": "site-e2e", "interval": "5s", "rules": [
        {"record": "site:hpcobs_e2e_gpus:count", "expr": "count(group by (node, gpu) (DCGM_FI_DEV_GPU_TEMP)"}]}]
    result = run_role("vmalert", {"vmalert_site_rule_groups": bad})
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert failed_task(output).startswith("Write the site's rule groups"), output[-3000:]
    assert "failed to validate" in output and "bad MetricsQL expr" in output
    assert checksums(RULE_FILES) == before
    assert pids("vmalert") == pid_before
    for name in MANAGEMENT:
        groups = get_json(name, VMALERT + "/api/v1/rules")["data"]["groups"]
        site = [g for g in groups if g["name"] == "site-e2e"]
        assert site and all(rule["health"] == "ok" for rule in site[0]["rules"])


def test_invalid_for_override_is_refused_before_anything_changes():
    before, pid_before = checksums(RULE_FILES), pids("vmalert")
    result = run_role("vmalert", {"vmalert_alert_for_overrides": {"HpcobsGpuHungJob": "soon",
                                                                  "HpcobsNoSuchAlert": "5m"}})
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert failed_task(output) == "Check the rule settings", output[-3000:]
    assert "vmalert rule settings are invalid" in output and "HpcobsNoSuchAlert" in output
    assert recap_changed(output) == {name: 0 for name in MANAGEMENT}
    assert checksums(RULE_FILES) == before and pids("vmalert") == pid_before


@pytest.mark.parametrize("settings,interval", [
    # the scenario evaluates every 5s: a 5s lookback would not reach past the evaluation before
    ({"vmalert_gpu_field_lookback": "5s"}, "hpcobs_gpu_sample_interval, 30s"),
    # the dcgm job scraped every minute: a 45s lookback would not reach past the scrape a job change marks
    ({"vmalert_gpu_field_lookback": "45s", "hpcobs_gpu_sample_interval": "1m"}, "hpcobs_gpu_sample_interval, 1m"),
], ids=["rule-interval", "sample-interval"])
def test_a_field_lookback_within_one_scrape_or_evaluation_is_refused_before_anything_changes(settings, interval):
    before, pid_before = checksums(RULE_FILES), pids("vmalert")
    result = run_role("vmalert", settings)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert failed_task(output) == "Check the GPU field lookback reaches past one scrape", output[-3000:]
    message = " ".join(output.split())
    assert ("vmalert_gpu_field_lookback (%s) must be longer than both the GPU sample interval (%s:"
            % (settings["vmalert_gpu_field_lookback"], interval)) in message
    assert "and vmalert_rules_interval (5s)" in message
    assert recap_changed(output) == {name: 0 for name in MANAGEMENT}
    assert checksums(RULE_FILES) == before and pids("vmalert") == pid_before


def test_invalid_alertmanager_config_is_refused_and_the_running_config_stays():
    config = ["/etc/alertmanager/alertmanager.yml"]
    before, pid_before = checksums(config), pids("alertmanager")
    bad_routes = [{"matchers": ['node=~"gpu[0-"'], "receiver": "noc"}]
    result = run_role("alertmanager", {"alertmanager_routes_extra": bad_routes})
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert failed_task(output).startswith("Write alertmanager.yml"), output[-3000:]
    assert "failed to validate" in output and "error parsing regexp" in output
    assert recap_changed(output) == {name: 0 for name in MANAGEMENT}
    assert checksums(config) == before and pids("alertmanager") == pid_before
    for name in MANAGEMENT:
        assert http(name, AM + "/-/ready", **AM_AUTH)[0] == 200


def test_inline_secret_is_refused_without_being_shown():
    secret = "https://hooks.slack.example/services/T1/B2/inline-e2e-secret-0b9d"
    receivers = [dict(r) for r in SCENARIO_VARS["alertmanager_receivers"]]
    for receiver in receivers:
        if receiver["name"] == "noc":
            receiver["slack_configs"] = [{"api_url": secret, "channel": "#gpu-noc"}]
    before = checksums(["/etc/alertmanager/alertmanager.yml"])
    result = run_role("alertmanager", {"alertmanager_receivers": receivers})
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert failed_task(output) == "Refuse secrets written inline", output[-3000:]
    assert "slack_configs[0]: api_url is a secret written inline" in output and "api_url_file" in output
    assert secret not in output and "inline-e2e-secret" not in output
    assert checksums(["/etc/alertmanager/alertmanager.yml"]) == before


def test_a_new_node_is_scraped_without_a_restart():
    new_node = "gpu-spare%d" % (int(time.time()) % 100000)
    overrides = dict(SCENARIO_VARS["victoriametrics_scrape_jobs_overrides"])
    overrides["dcgm"] = {"hosts": ["gpu-spare01.cluster.example", new_node + ".cluster.example"]}
    before, pid_before = checksums(["/etc/victoriametrics/scrape.yml"]), pids("victoriametrics")
    result = run_role("victoriametrics", {"victoriametrics_scrape_jobs_overrides": overrides})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    # only the dcgm target file changed: no new scrape.yml, no reload, no restart
    assert recap_changed(output) == {name: 1 for name in MANAGEMENT}, output[-2000:]
    assert checksums(["/etc/victoriametrics/scrape.yml"]) == before
    assert pids("victoriametrics") == pid_before
    for name in MANAGEMENT:
        wait_for("the new target in %s" % name, lambda n=name: [
            t for t in get_json(n, scraper(n) + "/api/v1/targets")["data"]["activeTargets"]
            if t["labels"].get("node") == new_node and t["labels"]["job"] == "dcgm"], timeout=60)


def test_silences_are_shared_by_the_cluster_and_survive_restarts():
    """A silence made on one host reaches the other through the cluster and survives a restart of both."""
    now = datetime.datetime.now(datetime.timezone.utc)
    silence = {
        "matchers": [{"name": "alertname", "value": "HpcobsE2eSilenceProbe", "isRegex": False, "isEqual": True}],
        "startsAt": now.isoformat(), "endsAt": (now + datetime.timedelta(hours=2)).isoformat(),
        "createdBy": "management scenario", "comment": "persistence probe",
    }
    status, body = post_json(MANAGEMENT[0], AM + "/api/v2/silences", silence)
    assert status == 200, body
    silence_id = json.loads(body)["silenceID"]

    def active_on(name):
        silences = get_json(name, AM + "/api/v2/silences")
        return any(s["id"] == silence_id and s["status"]["state"] == "active" for s in silences)
    wait_for("the silence on the other host", lambda: active_on(MANAGEMENT[1]), timeout=60)
    # stop both (nothing left to gossip it back), start both: it comes back from the data directories
    for name in MANAGEMENT:
        host(name).check_output("systemctl stop alertmanager")
    for name in MANAGEMENT:
        host(name).check_output("systemctl start alertmanager")
    for name in MANAGEMENT:
        wait_for("%s ready" % name, lambda n=name: http(n, AM + "/-/ready", **AM_AUTH)[0] == 200, timeout=60)
        assert active_on(name)
    status, _ = http(MANAGEMENT[0], AM + "/api/v2/silence/" + silence_id, method="DELETE", **AM_AUTH)
    assert status == 200
