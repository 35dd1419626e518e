"""The hpcobs Grafana dashboards (roles/grafana/files/dashboards) and the query harness (tests/dashboards/queries.py).

- the committed JSON is exactly what roles/grafana/dashboards/generate.py produces (Grafana's foundation SDK);
- every dashboard is well formed: unique uids (the file is named after its uid), unique panel ids, a layout inside
  Grafana's 24 columns without overlaps, every panel, target and variable on the provisioned VictoriaMetrics
  datasource (uid hpcobs-vm), the executive board at most six panels;
- every metric a query reads is in the metric contract: the vmalert role's recording rules, the dcgm-exporter
  counters the dcgm_exporter role collects, the Slurm hooks' job info, vmalert's ALERTS;
- every query, with its variables substituted, is valid MetricsQL for the real `vmalert -dryRun`;
- the harness finds every query (rows, collapsed rows), substitutes variables like Grafana, and, against a real
  victoria-metrics loaded with series through /api/v1/import/prometheus, reports exactly the queries that return
  nothing or fail.

Tools (vmalert, victoria-metrics): HPCOBS_TOOLS_BIN, else .cache/tools/bin, else PATH. A missing tool fails.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "dashboards"))

import queries  # noqa: E402
from tooling import tool
from tooling import victoriametrics as running_victoriametrics

DASHBOARD_DIR = REPO / "roles" / "grafana" / "files" / "dashboards"
GENERATOR = REPO / "roles" / "grafana" / "dashboards" / "generate.py"
RULE_TEMPLATES = REPO / "roles" / "vmalert" / "templates" / "rules"
COUNTERS = REPO / "roles" / "dcgm_exporter" / "files" / "hpcobs-counters.csv"
SLURM_HOOK = REPO / "roles" / "slurm_hooks" / "files" / "hpcobs-slurm-prolog"
SLURM_COLLECTOR = REPO / "roles" / "slurm_metrics" / "files" / "hpcobs-slurm-metrics"
SLURM_CAPTURES = REPO / "tests" / "data" / "slurm"
VM_UID = "hpcobs-vm"
# The SDK release the committed JSON was generated with (its "next" build, which follows Grafana 12).
SDK_PIN = "1769699241"
DASHBOARDS = queries.load_dashboards()
ALL_QUERIES = queries.all_queries()
# Values a user would pick; only used where no VictoriaMetrics lists them (syntax check).
SAMPLE_VALUES = {"node": "gpu01", "gpu": "0", "account": "physics", "job": "1001"}


# ------------------------------------------------------------------------------------------------ generated JSON
def _generator():
    spec = importlib.util.spec_from_file_location("hpcobs_dashboard_generator", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as exc:
        pytest.fail("the dashboard generator needs Grafana's foundation SDK (%s): pip install "
                    "grafana-foundation-sdk==%s (pinned in requirements-dev.txt)" % (exc, SDK_PIN))
    return module


def test_committed_json_is_what_the_generator_produces():
    generator = _generator()
    from importlib.metadata import version  # pylint: disable=import-outside-toplevel

    assert version("grafana-foundation-sdk") == SDK_PIN, "regenerate with the pinned SDK release"
    assert sorted(generator.DASHBOARDS) == sorted(p.name for p in DASHBOARD_DIR.glob("*.json")), \
        "every dashboard file must come from the generator and every generated dashboard must be committed"
    stale = [name for name in generator.DASHBOARDS
             if generator.render(name) != (DASHBOARD_DIR / name).read_text(encoding="utf-8")]
    assert not stale, "run `python3 roles/grafana/dashboards/generate.py` and commit: %s differ" % ", ".join(stale)


# ------------------------------------------------------------------------------------------------------ structure
def test_the_dashboards_are_there():
    assert {m["uid"] for m in DASHBOARDS.values()} == {"hpcobs-executive", "hpcobs-gpu-fleet", "hpcobs-job-account",
                                                      "hpcobs-slurm"}


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_file_is_named_after_the_uid(name):
    # the grafana role checks the provisioning through these names
    assert name == DASHBOARDS[name]["uid"] + ".json"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_basics(name):
    model = DASHBOARDS[name]
    assert model["title"] and model["uid"] and re.fullmatch(r"[a-z0-9-]{1,40}", model["uid"])
    assert "hpcobs" in model["tags"]
    assert isinstance(model["schemaVersion"], int) and model["schemaVersion"] >= 36
    assert queries.range_seconds(model) >= 3600
    assert model.get("id") is None, "provisioned dashboards must not carry a database id"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panel_ids_are_unique(name):
    ids = [p["id"] for p in _all_panels(DASHBOARDS[name])]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids)


def _all_panels(container):
    for panel in container.get("panels") or []:
        yield panel
        yield from _all_panels(panel)


def _overlaps(panels):
    boxes = [(p["title"], p["gridPos"]) for p in panels]
    found = []
    for i, (title_a, a) in enumerate(boxes):
        for title_b, b in boxes[i + 1:]:
            if a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and a["y"] < b["y"] + b["h"] \
                    and b["y"] < a["y"] + a["h"]:
                found.append((title_a, title_b))
    return found


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_layout_fits_and_nothing_overlaps(name):
    model = DASHBOARDS[name]
    for panel in _all_panels(model):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        assert pos["h"] > 0 and pos["y"] >= 0, panel["title"]
    assert not _overlaps(model["panels"])
    for row in queries.iter_rows(model):
        assert not _overlaps(row.get("panels") or []), row["title"]
        if row.get("panels"):
            assert row.get("collapsed"), "%s: only a collapsed row may hold panels" % row["title"]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_panel_target_and_variable_uses_the_provisioned_datasource(name):
    model = DASHBOARDS[name]
    panels = list(queries.iter_panels(model))
    assert panels
    for panel in panels:
        assert panel.get("datasource") == {"type": "prometheus", "uid": VM_UID}, panel["title"]
        assert panel.get("targets"), "%s has no query" % panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource") == {"type": "prometheus", "uid": VM_UID}, (panel["title"], target)
            assert target.get("expr") and target.get("refId"), (panel["title"], target)
    for variable in model.get("templating", {}).get("list", []):
        if variable["type"] == "query":
            assert variable["datasource"] == {"type": "prometheus", "uid": VM_UID}, variable["name"]
    assert VM_UID in json.dumps(model)
    assert "${DS_" not in json.dumps(model)


def test_executive_board_has_at_most_six_panels_and_no_rows():
    model = DASHBOARDS["hpcobs-executive.json"]
    assert 1 <= len(model["panels"]) <= 6
    assert not list(queries.iter_rows(model))
    titles = " ".join(p["title"].lower() for p in model["panels"])
    for topic in ("health", "alerts", "use", "power", "energy", "jobs"):
        assert topic in titles, "the executive board should answer: %s" % topic


def test_the_drill_downs_have_their_variables():
    names = lambda model: [v["name"] for v in model["templating"]["list"]]  # noqa: E731
    assert names(DASHBOARDS["hpcobs-gpu-fleet.json"]) == ["node", "gpu"]
    assert names(DASHBOARDS["hpcobs-job-account.json"]) == ["account", "job"]


def test_links_point_at_dashboards_that_exist():
    uids = {m["uid"] for m in DASHBOARDS.values()}
    text = json.dumps(list(DASHBOARDS.values()))
    linked = set(re.findall(r"/d/([a-z0-9-]+)/", text))
    assert linked and linked <= uids


# --------------------------------------------------------------------------------------------- metric contract
def _contract() -> set[str]:
    names = {"ALERTS", "ALERTS_FOR_STATE"}
    for template in RULE_TEMPLATES.glob("*.yml.j2"):
        names |= set(re.findall(r"^\s*- record:\s*(\S+)", template.read_text(encoding="utf-8"), re.M))
    for line in COUNTERS.read_text(encoding="utf-8").splitlines():
        fields = [f.strip() for f in line.split(",")]
        if line.strip() and not line.startswith("#") and len(fields) > 1 and fields[1] != "label":
            names.add(fields[0])
    names |= set(re.findall(r"\b(hpcobs_slurm_job_[a-z_]+)\{", SLURM_HOOK.read_text(encoding="utf-8")))
    names |= _slurm_collector_names()
    return names


def _slurm_collector_names() -> set[str]:
    """What the slurm_metrics collector serves (Slurm's openmetrics names and its own), from its rendering of the
    command output captured on the lab's real Slurm."""
    loader = importlib.machinery.SourceFileLoader("hpcobs_slurm_metrics_contract", str(SLURM_COLLECTOR))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    names = set()
    for capture in sorted(p for p in SLURM_CAPTURES.iterdir() if p.is_dir()):
        outputs = {key: (capture / ("%s.txt" % key)).read_text(encoding="utf-8")
                   for key in ("nodes", "partitions", "jobs", "sdiag", "ping")}
        names |= set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", module.render(outputs, "full"), re.M))
    return names


def test_contract_sources_are_read():
    contract = _contract()
    for expected in ("account:hpcobs_gpu_power_watts:sum", "hpc_job:hpcobs_gpu_hours:increase24h",
                     "fleet:hpcobs_gpus_healthy:count", "DCGM_FI_DEV_GPU_TEMP", "hpcobs_slurm_job_info",
                     "slurm_node_gpus_alloc", "slurm_jobs_pending", "hpcobs_slurm_node_state_info"):
        assert expected in contract


@pytest.mark.parametrize("query", ALL_QUERIES, ids=str)
def test_query_reads_only_metrics_of_the_contract(query):
    names = queries.metric_names(query.expr)
    assert names, "no metric found in %s" % query.expr
    assert names <= _contract(), "%s reads %s, which nothing in hpcobs produces" % (query.id, names - _contract())


def test_variable_queries_read_metrics_of_the_contract():
    for model in DASHBOARDS.values():
        for variable in model.get("templating", {}).get("list", []):
            match = queries._LABEL_VALUES.match(variable["query"])
            assert match, variable
            assert queries.metric_names(match.group("match")) <= _contract(), variable["name"]


def test_metric_names_extraction():
    expr = ('sum by (account) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{hpc_job!="", node=~"$node"}[5m]) / 1e3)'
            ' * on (node, hpc_job) group_left (user, account) hpcobs_slurm_job_info or vector(0)'
            ' - account:x:sum offset 1h > bool 2.5')
    assert queries.metric_names(expr) == {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "hpcobs_slurm_job_info",
                                          "account:x:sum"}


# ------------------------------------------------------------------------------------------------------ syntax
def test_every_query_is_valid_metricsql(tmp_path):
    rules = []
    for index, query in enumerate(ALL_QUERIES):
        model = DASHBOARDS[query.dashboard_file]
        values = dict(queries.builtin_values(model), **SAMPLE_VALUES)
        rules.append({"record": "hpcobs_dashboard_query_%d" % index, "expr": queries.substitute(query.expr, values),
                      "labels": {"query": query.id}})
    rule_file = tmp_path / "dashboard-queries.yml"
    rule_file.write_text(json.dumps({"groups": [{"name": "dashboards", "rules": rules}]}), encoding="utf-8")
    result = subprocess.run([str(tool("vmalert")), "-dryRun", "-rule=%s" % rule_file], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# ----------------------------------------------------------------------------------------------------- harness
def test_harness_finds_every_query_including_collapsed_rows():
    fleet = DASHBOARDS["hpcobs-gpu-fleet.json"]
    nested = [p for row in queries.iter_rows(fleet) for p in row.get("panels") or []]
    assert nested, "the fleet dashboard has collapsed rows with panels"
    expected = sum(len(p["targets"]) for p in _all_panels(fleet) if p["type"] != "row")
    found = queries.panel_queries(fleet, "hpcobs-gpu-fleet.json")
    assert len(found) == expected
    assert {q.panel_title for q in found} >= {p["title"] for p in nested}
    assert len(ALL_QUERIES) == sum(len(p["targets"]) for m in DASHBOARDS.values() for p in _all_panels(m)
                                   if p["type"] != "row")


def test_harness_substitutes_variables_like_grafana():
    values = {"node": "gpu01.site", "gpu": "0", "job": "17", "__rate_interval": "1m"}
    regex_vars = {"node"}
    assert queries.substitute('x{node=~"$node", gpu="${gpu}", j="[[job]]"}[$__rate_interval]', values, regex_vars) \
        == r'x{node=~"gpu01\.site", gpu="0", j="17"}[1m]'
    with pytest.raises(queries.HarnessError, match=r"\$missing has no value"):
        queries.substitute("x{a=\"$missing\"}", values)


def test_harness_builtin_values_follow_the_dashboard_range():
    values = queries.builtin_values({"time": {"from": "now-24h", "to": "now"}})
    assert values["__range"] == "86400s" and values["__range_s"] == "86400"
    assert values["__rate_interval"] == "1m"
    with pytest.raises(queries.HarnessError):
        queries.range_seconds({"time": {"from": "2026-01-01", "to": "now"}})


@pytest.fixture(scope="module")
def victoriametrics(tmp_path_factory):
    """A real victoria-metrics on a free loopback port, loaded with a few GPU series of the last 20 minutes."""
    now = int(time.time())
    lines = []
    for step in range(80):
        ts = (now - 1200 + step * 15) * 1000
        for gpu in ("0", "1"):
            job = '",hpc_job="4242' if gpu == "0" else ""
            lines.append('DCGM_FI_DEV_GPU_TEMP{node="gpu07",gpu="%s%s"} %d %d' % (gpu, job, 50 + step % 7, ts))
            lines.append('DCGM_FI_DEV_POWER_USAGE{node="gpu07",gpu="%s%s"} %.1f %d' % (gpu, job, 300.5, ts))
        lines.append('hpcobs_slurm_job_info{node="gpu07",hpc_job="4242",user="alice",account="physics"} 1 %d' % ts)
    with running_victoriametrics(tmp_path_factory.mktemp("vm"), lines, ["-search.disableCache"], timeout=30) as url:
        yield url


SYNTHETIC = {
    "uid": "harness-test", "title": "harness test", "time": {"from": "now-1h", "to": "now"},
    "templating": {"list": [
        {"name": "node", "type": "query", "query": "label_values(DCGM_FI_DEV_GPU_TEMP, node)", "multi": True,
         "includeAll": True},
        {"name": "job", "type": "query", "query": 'label_values(DCGM_FI_DEV_GPU_TEMP{node=~"$node"}, hpc_job)'},
    ]},
    "panels": [
        {"id": 1, "type": "timeseries", "title": "good range query",
         "targets": [{"refId": "A", "expr": 'max by (gpu) (DCGM_FI_DEV_GPU_TEMP{node=~"$node"})'}]},
        {"id": 2, "type": "row", "title": "collapsed", "collapsed": True, "panels": [
            {"id": 3, "type": "stat", "title": "good instant query with the job variable",
             "targets": [{"refId": "A", "instant": True,
                          "expr": 'sum(DCGM_FI_DEV_POWER_USAGE{hpc_job="$job"}) * on () group_left '
                                  'count(hpcobs_slurm_job_info{hpc_job="$job"})'}]},
            {"id": 4, "type": "stat", "title": "misspelt metric",
             "targets": [{"refId": "A", "instant": True, "expr": 'DCGM_FI_DEV_GPU_TEMPERATURE{node=~"$node"}'}]},
        ]},
        {"id": 5, "type": "timeseries", "title": "label that matches nothing",
         "targets": [{"refId": "A", "expr": 'DCGM_FI_DEV_GPU_TEMP{node=~"$node", hpc_job="no-such-job"}'},
                     {"refId": "B", "expr": "rate(DCGM_FI_DEV_GPU_TEMP[$__rate_interval])"}]},
        {"id": 6, "type": "stat", "title": "syntax error",
         "targets": [{"refId": "A", "instant": True, "expr": "sum(DCGM_FI_DEV_GPU_TEMP"}]},
    ],
}


def test_harness_reports_exactly_the_empty_and_broken_queries(victoriametrics, tmp_path):
    path = tmp_path / "harness-test.json"
    path.write_text(json.dumps(SYNTHETIC), encoding="utf-8")
    results = {ev.query.id: ev for ev in queries.evaluate_all(victoriametrics, [path])}
    assert set(results) == {"harness-test/good range query/A",
                            "harness-test/good instant query with the job variable/A",
                            "harness-test/misspelt metric/A", "harness-test/label that matches nothing/A",
                            "harness-test/label that matches nothing/B", "harness-test/syntax error/A"}
    good = results["harness-test/good range query/A"]
    assert good.ok and good.series == 2 and good.values["node"] == "gpu07"
    instant = results["harness-test/good instant query with the job variable/A"]
    assert instant.ok and instant.values["job"] == "4242" and 'hpc_job="4242"' in instant.rendered
    assert results["harness-test/label that matches nothing/B"].ok
    for broken in ("misspelt metric", "label that matches nothing"):
        ev = results["harness-test/%s/A" % broken]
        assert not ev.ok and not ev.error and ev.points == 0
        assert "returned no data" in ev.describe()
    assert results["harness-test/syntax error/A"].error
    problems = queries.check(victoriametrics, [path])
    assert len(problems) == 3 and all("harness-test/" in p for p in problems)


def test_harness_fails_every_query_of_a_dashboard_whose_variable_lists_nothing(victoriametrics, tmp_path):
    model = json.loads(json.dumps(SYNTHETIC))
    model["templating"]["list"][0]["query"] = "label_values(DCGM_FI_DEV_GPU_TEMP, no_such_label)"
    path = tmp_path / "harness-test.json"
    path.write_text(json.dumps(model), encoding="utf-8")
    results = queries.evaluate_all(victoriametrics, [path])
    assert results and all(not ev.ok and "lists no value" in ev.error for ev in results)


def test_harness_overrides_variables_and_refuses_unknown_ones(victoriametrics, tmp_path):
    path = tmp_path / "harness-test.json"
    path.write_text(json.dumps(SYNTHETIC), encoding="utf-8")
    results = {ev.query.id: ev for ev in queries.evaluate_all(victoriametrics, [path], {"node": "gpu99"})}
    assert not results["harness-test/good range query/A"].ok
    vm = queries.VictoriaMetrics(victoriametrics)
    with pytest.raises(queries.HarnessError, match="no variable"):
        queries.resolve_variables(SYNTHETIC, vm, {"nope": "x"})


def test_harness_command_line(victoriametrics, tmp_path):
    path = tmp_path / "harness-test.json"
    path.write_text(json.dumps(SYNTHETIC), encoding="utf-8")
    script = REPO / "tests" / "dashboards" / "queries.py"
    listed = subprocess.run([sys.executable, str(script), "--list", "--dashboard", str(path)], capture_output=True,
                            text=True, check=True)
    assert len(listed.stdout.splitlines()) == 6
    run = subprocess.run([sys.executable, str(script), "--vm", victoriametrics, "--dashboard", str(path)],
                         capture_output=True, text=True)
    assert run.returncode == 1
    assert "6 queries, 3 returned data, 3 failed or empty" in run.stdout
