"""The grafana role's rewrite of community dashboards' datasource inputs (roles/grafana/filter_plugins).

The fixture tests/dashboards/fixtures/community-style.json is our own dashboard, written in the shape grafana.com
exports have (`__inputs`, old string datasources, new `{type, uid}` references, a datasource variable, a constant
input, a collapsed row); it is not a copy of a community dashboard.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "dashboards" / "fixtures" / "community-style.json"
PLUGIN = REPO / "roles" / "grafana" / "filter_plugins" / "grafana_dashboards.py"

REFS = {
    "prometheus": {"type": "prometheus", "uid": "hpcobs-vm"},
    "loki": {"type": "loki", "uid": "hpcobs-loki"},
    "alertmanager": {"type": "alertmanager", "uid": "hpcobs-am"},
}


def _load_plugin():
    spec = importlib.util.spec_from_file_location("grafana_dashboards", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


plugin = _load_plugin()
rewrite = plugin.grafana_rewrite_datasources


@pytest.fixture()
def dashboard():
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def panels(model):
    for panel in model["panels"]:
        yield panel
        yield from panel.get("panels", [])


def by_title(model, title):
    return next(p for p in panels(model) if p["title"] == title)


def test_filter_is_registered_for_ansible():
    assert plugin.FilterModule().filters() == {"grafana_rewrite_datasources": rewrite}


def test_no_input_placeholder_is_left(dashboard):
    assert "${DS_" in json.dumps(dashboard)
    out = rewrite(dashboard, REFS, "synthetic")
    text = json.dumps(out)
    assert "${DS_" not in text
    assert "${VAR_" not in text
    assert "__inputs" not in out


def test_old_string_datasource_becomes_a_reference(dashboard):
    out = rewrite(dashboard, REFS)
    assert by_title(out, "Old schema: datasource as a string")["datasource"] == {"type": "prometheus",
                                                                                  "uid": "hpcobs-vm"}


def test_new_references_get_the_provisioned_uid(dashboard):
    out = rewrite(dashboard, REFS)
    panel = by_title(out, "New schema: datasource reference")
    assert panel["datasource"] == {"type": "prometheus", "uid": "hpcobs-vm"}
    assert panel["targets"][0]["datasource"] == {"type": "prometheus", "uid": "hpcobs-vm"}


def test_panels_of_a_collapsed_row_and_other_plugin_types(dashboard):
    out = rewrite(dashboard, REFS)
    assert by_title(out, "Kernel log lines (Loki)")["datasource"] == {"type": "loki", "uid": "hpcobs-loki"}
    annotation = out["annotations"]["list"][1]
    assert annotation["datasource"] == {"type": "loki", "uid": "hpcobs-loki"}
    # Grafana's built-in annotation keeps its pseudo datasource
    assert out["annotations"]["list"][0]["datasource"] == "-- Grafana --"


def test_template_variables(dashboard):
    out = rewrite(dashboard, REFS)
    variables = {v["name"]: v for v in out["templating"]["list"]}
    assert variables["node"]["datasource"] == {"type": "prometheus", "uid": "hpcobs-vm"}
    assert variables["job"]["query"] == "dcgm"  # the constant input's value
    assert variables["datasource"]["current"] == {"selected": True, "text": "hpcobs-vm", "value": "hpcobs-vm"}
    # a panel that uses the datasource variable keeps using it (it now defaults to the provisioned datasource)
    assert by_title(out, "Uses the datasource variable")["datasource"]["uid"] == "${datasource}"


def test_identity_and_the_rest_are_kept(dashboard):
    original = copy.deepcopy(dashboard)
    out = rewrite(dashboard, REFS)
    assert dashboard == original, "the input must not be modified"
    assert out["id"] is None
    assert out["uid"] == "hpcobs-test-synthetic"
    assert out["title"] == original["title"]
    assert out["__requires"] == original["__requires"]
    assert [t["expr"] for p in panels(out) for t in p.get("targets", [])] == \
        [t["expr"] for p in panels(original) for t in p.get("targets", [])]


def test_a_dashboard_without_inputs_only_loses_its_id():
    model = {"id": 7, "uid": "x", "title": "plain", "panels": [
        {"id": 1, "type": "stat", "datasource": {"type": "prometheus", "uid": "hpcobs-vm"}, "targets": []}]}
    out = rewrite(model, REFS)
    assert out == dict(model, id=None)


def test_a_datasource_type_the_role_does_not_provision_is_an_error(dashboard):
    with pytest.raises(plugin.AnsibleFilterError, match=r"nvidia-dcgm-exporter \(test\) needs a loki datasource \(input DS_LOGS\)"):
        rewrite(dashboard, {"prometheus": REFS["prometheus"]}, "nvidia-dcgm-exporter (test)")


def test_an_undeclared_placeholder_is_an_error(dashboard):
    dashboard["panels"][0]["targets"][0]["datasource"] = "${DS_SOMETHING_ELSE}"
    with pytest.raises(plugin.AnsibleFilterError, match=r"still refers to \$\{DS_SOMETHING_ELSE\}"):
        rewrite(dashboard, REFS, "synthetic")


@pytest.mark.parametrize("bad", [[], "text", {"title": "no panels"}])
def test_something_that_is_not_a_dashboard_is_an_error(bad):
    with pytest.raises(plugin.AnsibleFilterError, match="not a dashboard"):
        rewrite(bad, REFS, "thing")
