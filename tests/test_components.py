"""The components map (files/components.yml) and what derives from it: every consumer's address of a component
(playbooks/filter_plugins/hpcobs_service.py), the roles' default listen addresses, the scrape targets and the lab's
published ports (scripts/lab-endpoints.py)."""
import glob
import importlib.util
import os
import re

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name, *path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, *path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


service = _load("hpcobs_service", "playbooks", "filter_plugins", "hpcobs_service.py")
lab = _load("lab_endpoints", "scripts", "lab-endpoints.py")
COMPONENTS = service.load_components()


def _defaults(role):
    loader = type("Loader", (yaml.SafeLoader,), {})
    loader.add_constructor("!unsafe", lambda self, node: self.construct_scalar(node))
    values = {}
    for path in glob.glob(os.path.join(ROOT, "roles", role, "defaults", "main.yml")) + sorted(
            glob.glob(os.path.join(ROOT, "roles", role, "defaults", "main", "*.yml"))):
        with open(path, encoding="utf-8") as handle:
            values.update(yaml.load(handle, Loader=loader) or {})
    return values


def test_every_component_is_a_role_and_every_playbook_role_a_component():
    roles = {os.path.basename(path) for path in glob.glob(os.path.join(ROOT, "roles", "*"))}
    # a component is its role's name, or names the role that runs it beside its program (`role`)
    assert {entry.get("role", name) for name, entry in COMPONENTS.items()} <= roles
    assert all(entry["role"] != name for name, entry in COMPONENTS.items() if "role" in entry)
    deployed = set()
    for play in ("gpu_nodes.yml", "management.yml", "slurm.yml"):
        with open(os.path.join(ROOT, "playbooks", play), encoding="utf-8") as handle:
            deployed |= set(re.findall(r"^\s*(?:-\s+)?(?:role|name): (\w+)$", handle.read(), re.M)) & roles
    # the lab's own roles (lab_*) are no part of a site
    assert {role for role in deployed if not role.startswith("lab_")} <= set(COMPONENTS), "a deployed role is not in the map"


@pytest.mark.parametrize("name", sorted(name for name, entry in COMPONENTS.items() if "listen" in entry))
def test_the_roles_listen_defaults_come_from_the_map(name):
    listen, values = COMPONENTS[name]["listen"], _defaults(COMPONENTS[name].get("role", name))
    if "address" in listen:
        default = values[listen["address"]]
        assert "'%s' | hpcobs_component_" % name in default, (listen["address"], default)
    else:
        assert values[listen["port"]] == "{{ '%s' | hpcobs_component_port }}" % name
        assert listen["host"] in values


def test_no_role_hard_codes_the_port_of_another_component():
    ports = {entry["port"]: name for name, entry in COMPONENTS.items() if "port" in entry}
    pattern = re.compile(r"[:'\" ](%s)\b" % "|".join(str(port) for port in ports))
    found = []
    for path in glob.glob(os.path.join(ROOT, "roles", "*", "defaults", "**", "*.yml"), recursive=True) + \
            glob.glob(os.path.join(ROOT, "roles", "*", "vars", "*.yml")):
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.lstrip().startswith("#") and pattern.search(line):
                    found.append("%s:%d: %s" % (os.path.relpath(path, ROOT), number, line.strip()))
    assert not found, found


@pytest.mark.parametrize("data,message", [
    ({"format": 2, "components": {"a": {"groups": ["g"]}}}, "format must be 1"),
    ({"format": 1, "components": {}}, "non-empty map"),
    ({"format": 1, "components": {"a": {"port": 80, "listen": {"address": "a_listen"}, "groups": ["g"]},
                                  "b": {"port": 80, "listen": {"address": "b_listen"}, "groups": ["g"]}}},
     "port 80 is already a's"),
    ({"format": 1, "components": {"a": {"port": 0, "listen": {"address": "x"}, "groups": ["g"]}}}, "1-65535"),
    ({"format": 1, "components": {"a": {"port": 80, "listen": {"port": "x"}, "groups": ["g"]}}}, "listen must be"),
    ({"format": 1, "components": {"a": {"port": 80, "listen": {"address": "x"}, "groups": "g"}}}, "groups must be"),
    ({"format": 1, "components": {"a": {"groups": ["g"], "scrape_job": "a"}}}, "need a port"),
    ({"format": 1, "components": {"a": {"groups": ["g"], "colour": "red"}}}, "unknown key(s) colour"),
])
def test_a_broken_map_is_refused_naming_the_problem(data, message):
    with pytest.raises(service.AnsibleFilterError, match=re.escape(message)):
        service.check_components(data)


def test_addresses_follow_hpcobs_address_then_ansible_host_then_the_name():
    hostvars = {"a": {"hpcobs_address": "10.0.0.1", "ansible_host": "a-mgmt"}, "b": {"ansible_host": "b-mgmt"},
                "c": {}, "v6": {"hpcobs_address": "fd00::5"}}
    assert [service.host_address(host, hostvars) for host in ("a", "b", "c", "v6", "unknown")] == \
        ["10.0.0.1", "b-mgmt", "c", "[fd00::5]", "unknown"]


def test_a_host_that_moves_a_service_is_reached_on_its_own_port():
    hostvars = {"m1": {"alertmanager_listen_address": ":19093", "loki_http_listen_port": 3200},
                "m2": {"ansible_host": "10.0.0.2"},
                "m3": {"alertmanager_listen_address": "192.0.2.7:9093", "hpcobs_address": "m3.example"}}
    # the security switch is on by default: every component marked tls is reached over https
    assert service.component_urls(["m1", "m2", "m3"], "alertmanager", hostvars) == \
        ["https://m1:19093", "https://10.0.0.2:9093", "https://192.0.2.7:9093"]
    assert service.component_url("loki", hostvars, "m1", "/ready") == "https://m1:3200/ready"
    assert service.component_url("loki", hostvars, "m2", scheme="http") == "http://10.0.0.2:3100"
    assert service.component_url("slurm_metrics", hostvars, "m2", "/metrics") == "https://10.0.0.2:9341/metrics"
    # the host's own clients (Grafana's datasources, vmalert) stay on the host
    assert service.component_local_url("alertmanager", hostvars, "m1") == "https://127.0.0.1:19093"
    assert service.component_local_url("alertmanager", hostvars, "m3") == "https://192.0.2.7:9093"
    assert service.component_local_url("victoriametrics", hostvars, "m2") == "https://127.0.0.1:8428"
    with pytest.raises(service.AnsibleFilterError, match="not a port"):
        service.component_url("loki", {"x": {"loki_http_listen_port": "http"}}, "x")
    with pytest.raises(service.AnsibleFilterError, match="not a component with a port"):
        service.component_url("slurm_hooks", hostvars, "m1")


def test_the_defaults_equal_the_ports_the_roles_had():
    assert {name: service.component_listen(name) for name in ("node_exporter", "dcgm_exporter", "ipmi_exporter",
            "smartctl_exporter", "victoriametrics", "vmalert", "alertmanager")} == {
        "node_exporter": ":9100", "dcgm_exporter": ":9400", "ipmi_exporter": ":9290", "smartctl_exporter": ":9633",
        "victoriametrics": ":8428", "vmalert": ":8880", "alertmanager": ":9093"}
    assert [service.component_port(name) for name in ("loki", "grafana", "promtail", "alloy", "slurm_metrics")] == \
        [3100, 3000, 9080, 12345, 9341]


def test_deployed_components_drop_the_disabled_and_the_unchosen_shipper():
    assert "promtail" in service.deployed_components([], "promtail")
    assert "alloy" not in service.deployed_components([], "promtail")
    deployed = service.deployed_components(["grafana"], "alloy")
    assert "alloy" in deployed and "promtail" not in deployed and "grafana" not in deployed
    with pytest.raises(service.AnsibleFilterError, match="unknown component.*nagios"):
        service.deployed_components(["nagios"], "promtail")
    with pytest.raises(service.AnsibleFilterError, match="hpcobs_log_shipper"):
        service.deployed_components([], "fluentd")


def test_scrape_targets_take_each_hosts_own_port_and_the_components_groups():
    groups = {"gpu_nodes": ["gpu01.cluster", "gpu02.cluster"], "management": ["mgmt01"], "slurm_controllers": ["ctl"]}
    hostvars = {"gpu01.cluster": {"ansible_host": "10.1.0.1"},
                "gpu02.cluster": {"ansible_host": "10.1.0.2", "node_exporter_listen_address": ":19100"},
                "mgmt01": {}, "ctl": {}}
    targets = service.scrape_targets("node", {"component": "node_exporter"}, groups, hostvars)
    assert targets == [{"targets": ["10.1.0.1:9100"], "labels": {"node": "gpu01"}},
                       {"targets": ["10.1.0.2:19100"], "labels": {"node": "gpu02"}},
                       {"targets": ["ctl:9100"], "labels": {"node": "ctl"}},
                       {"targets": ["mgmt01:9100"], "labels": {"node": "mgmt01"}}]
    # an explicit port and groups win; extra hosts are scraped once each
    job = {"component": "node_exporter", "port": 9999, "groups": ["management"], "hosts": ["mgmt01", "ext.site"]}
    assert service.scrape_targets("x", job, groups, hostvars) == [
        {"targets": ["mgmt01:9999"], "labels": {"node": "mgmt01"}},
        {"targets": ["ext.site:9999"], "labels": {"node": "ext"}}]
    with pytest.raises(service.AnsibleFilterError, match="neither a port nor a component"):
        service.scrape_targets("bare", {"groups": ["management"]}, groups, hostvars)
    with pytest.raises(service.AnsibleFilterError, match="not a component"):
        service.scrape_targets("odd", {"component": "nagios"}, groups, hostvars)


@pytest.mark.parametrize("hv,active", [
    ({"hpcobs_slurm_native_metrics": False, "slurm_metrics_native_active": True}, False),
    ({"slurm_metrics_native_active": True}, True),
    ({"hpcobs_slurm_native_metrics": "auto", "slurm_metrics_native_active": False}, False),
    ({"hpcobs_slurm_native_metrics": True}, True),
    ({"ansible_local": {"hpcobs_slurm_metrics": {"native": True}}}, True),
    ({"ansible_local": {"hpcobs_slurm_metrics": {"native": False}}}, False),
    ({}, False),
])
def test_slurm_native_jobs_scrape_only_the_controllers_that_serve_them(hv, active):
    job = {"component": "slurm_metrics", "port": 6817, "slurm_native": True}
    targets = service.scrape_targets("slurmctld_nodes", job, {"slurm_controllers": ["ctl"]}, {"ctl": hv})
    assert targets == ([{"targets": ["ctl:6817"], "labels": {"node": "ctl"}}] if active else [])


def test_the_lab_publishes_each_service_once_on_a_port_of_its_own():
    published = lab.load()
    host_ports = [entry[2] for entry in published]
    assert len(host_ports) == len(set(host_ports)), "two lab services share a published port"
    by_host = {(host, name): port for host, name, port, _, _ in published}
    assert by_host[("mgmt01", "grafana")] == 3000 and by_host[("mgmt01", "victoriametrics")] == 8428
    assert by_host[("gpu01", "dcgm_exporter")] == 29402 and by_host[("gpu02", "node_exporter")] == 29103
    assert ("gpu01", "alloy") not in by_host and ("gpu01", "slurm_metrics") not in by_host


def test_xid_paging_codes_are_one_list_for_both_rules():
    assert service.shared_fact("xid_page_codes") == [48, 63, 64, 74, 79, 94, 95]
    expected = "{{ hpcobs_xid_page_codes | default('xid_page_codes' | hpcobs_shared) }}"
    assert _defaults("loki")["loki_xid_page_codes"] == expected
    assert _defaults("vmalert")["vmalert_gpu_xid_page_codes"] == expected
    with pytest.raises(service.AnsibleFilterError, match="not a shared fact"):
        service.shared_fact("xid_ignore_codes")
    with pytest.raises(service.AnsibleFilterError, match="unknown top-level key"):
        service.check_components({"format": 1, "colours": {}, "components": {"a": {"groups": ["g"]}}})


def test_the_preflight_problem_names_unknown_components_and_shippers():
    assert service.components_problem(["grafana"], "alloy") == ""
    assert "unknown component(s) nagios" in service.components_problem(["nagios"], "promtail")
    assert "hpcobs_log_shipper" in service.components_problem([], "fluentd")


def test_the_security_switch_is_a_boolean_and_refuses_no_component():
    """Every deployed component has its credentials under the switch (the Slurm tools read VictoriaMetrics' read-only
    front): the preflight refuses only a switch that is not a boolean."""
    assert service.components_problem([], "promtail", True) == ""
    assert service.components_problem(["grafana"], "promtail", "true") == ""
    assert service.components_problem([], "promtail", False) == ""
    assert service.components_problem([], "promtail", "False") == ""
    assert "hpcobs_security must be true or false" in service.components_problem([], "promtail", "yes please")


def test_the_security_switch_makes_the_scheme_https_for_components_that_serve_tls():
    assert service.shared_fact("security") is True  # on by default; hpcobs_security: false opts out
    secured = {"m1": {"hpcobs_security": True}, "m2": {"hpcobs_security": "false"}, "m3": {}}
    assert [name for name, entry in COMPONENTS.items() if entry.get("tls")] == [
        "node_exporter", "dcgm_exporter", "ipmi_exporter", "smartctl_exporter", "promtail", "alloy", "slurm_metrics",
        "victoriametrics", "victoriametrics_reader", "vmagent", "vmalert", "alertmanager", "loki", "grafana"]
    assert service.component_url("node_exporter", secured, "m1", "/metrics") == "https://m1:9100/metrics"
    assert service.component_url("node_exporter", secured, "m2", "/metrics") == "http://m2:9100/metrics"
    assert service.component_url("smartctl_exporter", secured, "m1", "/metrics") == "https://m1:9633/metrics"
    assert service.component_urls(["m1", "m2"], "ipmi_exporter", secured) == ["https://m1:9290", "http://m2:9290"]
    assert service.component_url("victoriametrics", secured, "m1", "/health") == "https://m1:8428/health"
    assert service.component_local_url("victoriametrics", secured, "m1") == "https://127.0.0.1:8428"
    assert service.component_urls(["m1", "m2", "m3"], "victoriametrics", secured) == [
        "https://m1:8428", "http://m2:8428", "https://m3:8428"]  # m3 sets nothing: the default
    assert service.component_urls(["m1", "m2"], "alertmanager", secured) == ["https://m1:9093", "http://m2:9093"]
    # an explicit scheme still wins
    assert service.component_url("vmalert", secured, "m1") == "https://m1:8880"
    assert service.component_url("slurm_metrics", secured, "m1") == "https://m1:9341"
    assert service.component_url("victoriametrics", secured, "m1", scheme="http") == "http://m1:8428"
    with pytest.raises(service.AnsibleFilterError, match="true or false"):
        service.component_scheme("victoriametrics", {"x": {"hpcobs_security": "maybe"}}, "x")


def test_secured_components_are_those_a_host_reaches_over_https():
    hosts = {"m1": {"hpcobs_security": True}, "m2": {"hpcobs_security": False}}
    names = ["victoriametrics", "loki", "alertmanager", "grafana", "victoriametrics"]
    assert service.secured_components(names, hosts, "m1") == ["victoriametrics", "loki", "alertmanager", "grafana"]
    assert service.secured_components(names, hosts, "m2") == []
    assert service.secured_components([], hosts, "m1") == []
    # a map of this test where only Grafana serves TLS
    components = {name: dict(entry, tls=(name == "grafana")) if "port" in entry else entry
                  for name, entry in COMPONENTS.items()}
    assert service.secured_components(names, hosts, "m1", components) == ["grafana"]
    with pytest.raises(service.AnsibleFilterError, match="not a component with a port"):
        service.secured_components(["slurm_hooks"], hosts, "m1")


def test_tls_key_of_the_map_is_checked():
    data = {"format": 1, "components": {"a": {"port": 1, "listen": {"address": "v"}, "groups": ["g"], "tls": "yes"}}}
    with pytest.raises(service.AnsibleFilterError, match="tls must be true or false"):
        service.check_components(data)


def test_peer_name_of_the_map_is_checked():
    def entry(**extra):
        return {"format": 1, "components": {"a": dict({"port": 1, "listen": {"address": "v"}, "groups": ["g"]}, **extra)}}
    assert service.check_components(entry(tls=True, peer_name="a-gossip.site.invalid"))
    for bad in (entry(peer_name="a.invalid"), entry(tls=True, peer_name="nodot"), entry(tls=True, peer_name="a,b.c"),
                entry(tls=True, peer_name=["a.b"])):
        with pytest.raises(service.AnsibleFilterError, match="peer_name must be a DNS name"):
            service.check_components(bad)


def test_pki_paths_stay_inside_the_pki_directory():
    assert service.pki_path("", "/srv/pki") == "/srv/pki"
    assert service.pki_path("credentials/x", "/srv/pki") == "/srv/pki/credentials/x"
    assert service.pki_path("ca.crt").startswith(os.path.expanduser("~/"))
    for bad in ("/etc/shadow", "../x", "credentials/../../x"):
        with pytest.raises(service.AnsibleFilterError):
            service.pki_path(bad, "/srv/pki")


def test_component_hosts_are_every_host_of_its_groups_once():
    groups = {"gpu_nodes": ["g1", "g2"], "slurm_controllers": ["c1", "g1"], "management": ["m1"]}
    assert service.component_hosts("promtail", groups) == ["g1", "g2", "c1", "m1"]
    assert service.component_hosts("loki", groups) == ["m1"]
    assert service.component_hosts("loki", {}) == []
    with pytest.raises(service.AnsibleFilterError, match="not a component"):
        service.component_hosts("nope", groups)



def test_the_log_shippers_take_a_client_certificate_and_get_no_basic_auth_credential():
    """Promtail and Alloy take no basic auth on their own HTTP server (auth: client_cert): their clients present a
    site certificate, so roles/pki makes no <component>-client for them and no client sends one."""
    assert [name for name, entry in COMPONENTS.items() if "port" in entry
            and service.component_auth(name) == "client_cert"] == ["promtail", "alloy"]
    assert service.component_auth("node_exporter") == "basic"
    flagged = service.components_flagged("tls")
    assert "promtail" in flagged and "alloy" in flagged
    assert service.basic_auth_components(flagged) == [name for name in flagged if name not in ("promtail", "alloy")]
    assert "promtail-client" not in service.client_credential(service.basic_auth_components(flagged))
    secured = {"n1": {"hpcobs_security": True}}
    assert service.component_url("promtail", secured, "n1", "/metrics") == "https://n1:9080/metrics"
    assert service.component_url("alloy", secured, "n1", "/-/ready") == "https://n1:12345/-/ready"


@pytest.mark.parametrize("entry,problem", [
    ({"auth": "client_cert"}, "auth must be basic or client_cert, on a component with tls: true"),
    ({"tls": True, "auth": "mtls"}, "auth must be basic or client_cert"),
    ({"tls": False, "auth": "basic"}, "auth must be basic or client_cert"),
])
def test_auth_is_checked(entry, problem):
    data = {"format": 1, "components": {"x": dict({"port": 1, "listen": {"address": "x_listen"}, "groups": ["g"]},
                                                  **entry)}}
    with pytest.raises(service.AnsibleFilterError, match=problem):
        service.check_components(data)
    good = {"format": 1, "components": {"x": {"port": 1, "listen": {"address": "x_listen"}, "groups": ["g"],
                                              "tls": True, "auth": "client_cert"}}}
    assert service.check_components(good)["x"]["auth"] == "client_cert"
