"""Every panel query of every dashboard the role provisions, run against the real VictoriaMetrics of grafana-debian12
(simulated GPU node with two Slurm jobs, real vmalert recording rules and alerts, see prepare.yml) with
tests/dashboards/queries.py: each must return data. The queries go the way a dashboard's do: through Grafana's
datasource proxy (the provisioned VictoriaMetrics datasource, its client credential and the site CA; the security
switch is on in this scenario), logged in as the admin over HTTPS. Also proves on the same data that the harness
catches an empty query and that key panels show the values the fixtures imply."""
import json
import sys
import time
import urllib.parse
import urllib.request

import pytest

from grafana_lib import DATA_HOST, ROOT, SITE_PASSWORD, grafana_url, opener

sys.path.insert(0, "%s/tests/dashboards" % ROOT)
import queries  # noqa: E402

ALL = queries.all_queries()
DASHBOARDS = queries.load_dashboards()


def instant(url, expr):
    data = urllib.parse.urlencode({"query": expr}).encode()
    with urllib.request.urlopen(url + "/api/v1/query", data=data, timeout=10) as answer:
        return json.load(answer)["data"]["result"]


@pytest.fixture(scope="module", autouse=True)
def through_grafana():
    """Every request of this module (the harness's and instant()) over HTTPS trusting the site CA, as Grafana's
    admin."""
    urllib.request.install_opener(opener(user="admin", password=SITE_PASSWORD[DATA_HOST]))
    yield
    urllib.request.install_opener(urllib.request.build_opener())


@pytest.fixture(scope="module")
def vm_url():
    """VictoriaMetrics on the data host, reached through the data host's Grafana (its VictoriaMetrics datasource),
    once the recording rules have a few minutes of history and the injected faults' alerts fire (ECC: for 1m)."""
    url = grafana_url(DATA_HOST) + "/api/datasources/proxy/uid/hpcobs-vm"
    conditions = [
        "min(count_over_time(hpc_job:hpcobs_gpu_hours:increase24h[10m])) >= 24",
        "min(count_over_time(account:hpcobs_gpu_power_watts:sum[10m])) >= 24",
        'count(ALERTS{alertstate="firing", alertname="HpcobsGpuEccUncorrectable"}) >= 1',
        'count(ALERTS{alertstate="firing", alertname="HpcobsGpuXidError"}) >= 1',
        # the slurm_metrics collector (replaying real Slurm output): a few scrapes of every series
        "min(count_over_time(slurm_node_gpus_alloc[10m])) >= 3",
    ]
    deadline = time.time() + 300
    while True:
        pending = [c for c in conditions if not instant(url, c)]
        if not pending:
            return url
        assert time.time() < deadline, "VictoriaMetrics never had: %s" % pending
        time.sleep(5)


@pytest.fixture(scope="module")
def values(vm_url):
    """Template variable values per dashboard, resolved against VictoriaMetrics as Grafana fills the drop-downs."""
    vm = queries.VictoriaMetrics(vm_url)
    return {name: queries.resolve_variables(model, vm) for name, model in DASHBOARDS.items()}


def test_every_dashboard_query_is_covered():
    assert len(ALL) >= 60
    assert {q.dashboard_uid for q in ALL} == {"hpcobs-executive", "hpcobs-gpu-fleet", "hpcobs-job-account",
                                              "hpcobs-slurm"}


@pytest.mark.parametrize("query", ALL, ids=str)
def test_panel_query_returns_data(vm_url, values, query):
    model = DASHBOARDS[query.dashboard_file]
    result = queries.evaluate(query, queries.VictoriaMetrics(vm_url), values[query.dashboard_file], model)
    assert result.ok, result.describe()


def test_variables_resolve_to_the_fixture_values(values):
    assert values["hpcobs-gpu-fleet.json"]["node"] == "gpu01"
    assert values["hpcobs-gpu-fleet.json"]["gpu"] == "0"
    # natural order: chemistry before physics; chemistry's only job is 1002
    assert values["hpcobs-job-account.json"]["account"] == "chemistry"
    assert values["hpcobs-job-account.json"]["job"] == "1002"


def test_every_query_also_returns_data_for_the_other_account_and_job(vm_url):
    problems = queries.check(vm_url, overrides={"account": "physics", "job": "1001", "gpu": "3"})
    assert not problems, "\n".join(problems)


def test_harness_catches_an_empty_query_on_this_data(vm_url, tmp_path):
    model = json.loads(json.dumps(DASHBOARDS["hpcobs-executive.json"]))
    model["uid"] = "broken-copy"
    # a recording rule renamed in the vmalert role but not in the dashboard: "watt" instead of "watts"
    target = model["panels"][3]["targets"][0]
    target["expr"] = target["expr"].replace("account:hpcobs_gpu_power_watts:sum", "account:hpcobs_gpu_power_watt:sum")
    path = tmp_path / "broken-copy.json"
    path.write_text(json.dumps(model), encoding="utf-8")
    problems = queries.check(vm_url, [path])
    assert len(problems) == 1
    assert problems[0].startswith("broken-copy/GPU power by account/A") and "returned no data" in problems[0]


def _panel_values(vm_url, dashboard, title):
    model = DASHBOARDS[dashboard]
    vm = queries.VictoriaMetrics(vm_url)
    resolved = queries.resolve_variables(model, vm)
    out = {}
    for query in queries.panel_queries(model, dashboard):
        if query.panel_title == title:
            rendered = queries.render(query, resolved)
            out[query.ref_id] = {json.dumps(r["metric"], sort_keys=True): float(r["value"][1])
                                 for r in instant(vm_url, rendered)}
    assert out, "no panel %s" % title
    return out


def test_executive_board_shows_the_fixture_state(vm_url):
    health = _panel_values(vm_url, "hpcobs-executive.json", "GPU fleet health")
    # 4 GPUs; GPU 1 (ECC) and GPU 3 (XID 13) have a firing hardware alert
    assert list(health["A"].values()) == [2.0] and list(health["B"].values()) == [4.0]
    assert list(health["C"].values()) == [2.0]
    alerts = _panel_values(vm_url, "hpcobs-executive.json", "Firing alerts")
    assert list(alerts["A"].values())[0] >= 1 and list(alerts["B"].values())[0] >= 1
    use = _panel_values(vm_url, "hpcobs-executive.json", "GPU use now")
    assert list(use["A"].values()) == [75.0]  # 3 of 4 GPUs held by jobs
    jobs = _panel_values(vm_url, "hpcobs-executive.json", "Top jobs by GPU-hours, last 24 h")["A"]
    owners = {(json.loads(k)["hpc_job"], json.loads(k)["user"], json.loads(k)["account"]) for k in jobs}
    assert owners == {("1001", "alice", "physics"), ("1002", "bob", "chemistry")}
    hours = {json.loads(k)["hpc_job"]: v for k, v in jobs.items()}
    assert hours["1001"] > hours["1002"] > 0  # two GPUs against one, same duration
