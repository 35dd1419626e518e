"""The grafana role's datasources under the site's security switch (roles/grafana/filter_plugins/
grafana_datasources.py): every datasource of a secured component gets the client user, its credential and the site CA
as $__file{} references, generically by component (VictoriaMetrics today; Loki and Alertmanager once the components
map marks them tls: true, as a map of this test does)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ds = _load("grafana_datasources", REPO / "roles" / "grafana" / "filter_plugins" / "grafana_datasources.py")
service = _load("hpcobs_service", REPO / "playbooks" / "filter_plugins" / "hpcobs_service.py")
ROLE_VARS = yaml.safe_load((REPO / "roles" / "grafana" / "vars" / "main.yml").read_text())
COMPONENT_OF = ROLE_VARS["_grafana_datasource_components"]
TLS_DIR = "/etc/grafana/tls"
HOSTS = {"mgmt01": {"hpcobs_security": True}, "mgmt02": {"hpcobs_security": False}}


def datasources(scheme_of):
    """The role's three datasources (as vars/main.yml builds them) at this host's URLs, plus a site's own."""
    return [
        {"name": "VictoriaMetrics", "uid": "hpcobs-vm", "type": "prometheus",
         "url": "%s://127.0.0.1:8428" % scheme_of("victoriametrics"), "jsonData": {"httpMethod": "POST"}},
        {"name": "Loki", "uid": "hpcobs-loki", "type": "loki", "url": "%s://127.0.0.1:3100" % scheme_of("loki"),
         "jsonData": {"maxLines": 1000}},
        {"name": "Alertmanager", "uid": "hpcobs-am", "type": "alertmanager",
         "url": "%s://127.0.0.1:9093" % scheme_of("alertmanager"), "jsonData": {"implementation": "prometheus"}},
        {"name": "Site Prometheus", "uid": "site", "type": "prometheus", "url": "http://prom:9090",
         "secureJsonData": {"httpHeaderValue1": "token"}},
    ]


def provisioned(host, components=None):
    secured = service.secured_components(list(COMPONENT_OF.values()), HOSTS, host, components)
    scheme = lambda name: service.component_scheme(name, HOSTS, host, components)  # noqa: E731
    given = datasources(scheme)
    return secured, given, ds.secure_datasources(given, COMPONENT_OF, secured, "hpcobs", TLS_DIR)


def assert_secured(entry, component):
    assert entry["url"].startswith("https://")
    assert (entry["basicAuth"], entry["basicAuthUser"]) == (True, "hpcobs")
    assert entry["jsonData"]["tlsAuthWithCACert"] is True
    assert entry["secureJsonData"]["basicAuthPassword"] == "$__file{/etc/grafana/tls/%s-client}" % component
    assert entry["secureJsonData"]["tlsCACert"] == "$__file{/etc/grafana/tls/ca.crt}"


def test_the_role_maps_each_of_its_datasources_to_its_component():
    assert COMPONENT_OF == {"hpcobs-vm": "victoriametrics", "hpcobs-loki": "loki", "hpcobs-am": "alertmanager"}
    components = service.load_components()
    assert all(name in components for name in COMPONENT_OF.values())


def test_with_todays_map_every_datasource_of_the_stack_is_secured():
    secured, given, out = provisioned("mgmt01")
    assert secured == ["victoriametrics", "loki", "alertmanager"]
    for entry, component in zip(out, ["victoriametrics", "loki", "alertmanager"]):
        assert_secured(entry, component)
    assert out[0]["jsonData"]["httpMethod"] == "POST"  # the role's own settings kept
    assert out[1]["jsonData"] == {"maxLines": 1000, "tlsAuthWithCACert": True}
    assert out[3] == given[3]  # the site's own datasource as it was
    assert "basicAuth" not in given[0] and "secureJsonData" not in given[0]  # the input is not changed
    assert ds.datasource_credentials(given, COMPONENT_OF, secured) == [
        "victoriametrics-client", "loki-client", "alertmanager-client"]


def test_a_component_the_map_does_not_secure_keeps_its_datasource():
    components = {name: dict(entry, tls=False) if name in ("loki", "alertmanager") else entry
                  for name, entry in service.load_components().items()}
    secured, given, out = provisioned("mgmt01", components)
    assert secured == ["victoriametrics"]
    assert_secured(out[0], "victoriametrics")
    assert out[1:] == given[1:]
    assert ds.datasource_credentials(given, COMPONENT_OF, secured) == ["victoriametrics-client"]


def test_without_the_switch_nothing_changes():
    secured, given, out = provisioned("mgmt02")
    assert secured == [] and out == given
    assert ds.datasource_credentials(given, COMPONENT_OF, secured) == []


def test_a_site_s_secure_json_data_is_kept_beside_the_credential():
    given = [{"name": "VM", "uid": "hpcobs-vm", "type": "prometheus", "url": "https://vm:8428",
              "secureJsonData": {"httpHeaderValue1": "x"}}]
    (entry,) = ds.secure_datasources(given, COMPONENT_OF, ["victoriametrics"], "hpcobs", TLS_DIR + "/")
    assert entry["secureJsonData"]["httpHeaderValue1"] == "x"
    assert_secured(entry, "victoriametrics")


def test_a_plain_http_url_of_a_secured_component_is_refused():
    given = [{"name": "VictoriaMetrics", "uid": "hpcobs-vm", "type": "prometheus", "url": "http://mgmt01:8428"}]
    problem = ds.datasources_tls_problem(given, COMPONENT_OF, ["victoriametrics"])
    assert "VictoriaMetrics (victoriametrics) at http://mgmt01:8428" in problem
    assert "over plain HTTP" in problem
    assert ds.datasources_tls_problem(given, COMPONENT_OF, []) == ""
    with pytest.raises(ds.AnsibleFilterError, match="over plain HTTP"):
        ds.secure_datasources(given, COMPONENT_OF, ["victoriametrics"], "hpcobs", TLS_DIR)


@pytest.mark.parametrize("tls_dir", ["", "tls", "/etc/grafana/${X}", "/etc/{x}"])
def test_the_tls_directory_must_be_an_absolute_plain_path(tls_dir):
    given = [{"name": "VM", "uid": "hpcobs-vm", "type": "prometheus", "url": "https://vm:8428"}]
    with pytest.raises(ds.AnsibleFilterError, match="absolute path"):
        ds.secure_datasources(given, COMPONENT_OF, ["victoriametrics"], "hpcobs", tls_dir)
