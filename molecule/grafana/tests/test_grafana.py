"""Verify the grafana role on both test hosts: release tree, unit, secrets, and the provisioning as the Grafana
stand-in loaded it (through Grafana's own API paths)."""
import json
import re
import sys

import pytest

import hostchecks

from grafana_lib import (COMMUNITY, DATA_HOST, OUR_DASHBOARDS, PORTS, ROOT, SITE_PASSWORD, api, admin_password,
                         bundle_manifest, credential, pki)

sys.path.insert(0, "%s/tests/dashboards" % ROOT)
import queries  # noqa: E402

VM_REF = {"type": "prometheus", "uid": "hpcobs-vm"}


def main_pid(host):
    return hostchecks.main_pid(host, "grafana")


# ------------------------------------------------------------------------------------------------ install
def test_release_tree_from_the_bundle(host):
    grafana = bundle_manifest()["components"]["grafana"]
    arch = {"x86_64": "amd64", "aarch64": "arm64"}[host.system_info.arch]
    tree = host.file("/opt/grafana/%s" % grafana["version"])
    assert tree.is_directory and tree.user == "root"
    assert host.file("/opt/grafana/current").linked_to == tree.path
    marker = host.file("%s/.hpcobs-archive-sha256" % tree.path).content_string.strip()
    assert marker == grafana["files"][arch]["sha256"]
    binary = host.file("%s/bin/grafana" % tree.path)
    assert binary.user == "root" and binary.mode == 0o755
    assert host.file("%s/conf/defaults.ini" % tree.path).is_file
    # what runs here is the test stand-in, and it says so
    assert grafana.get("standin") is True
    assert "STAND-IN" in host.file("%s/STAND-IN.txt" % tree.path).content_string
    assert not host.file("/opt/grafana/.%s.partial" % grafana["version"]).exists
    version = host.run("/opt/grafana/current/bin/grafana --version")
    assert version.rc == 0 and grafana["version"] in version.stdout


def test_service_runs_as_the_dedicated_user(host):
    user = hostchecks.assert_runs_as_its_own_user(host, "grafana", "grafana")
    assert user.home == "/var/lib/grafana"


@pytest.mark.parametrize("setting,expected", [
    ("User", "grafana"),
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "yes"),
    ("PrivateTmp", "yes"),
    ("PrivateDevices", "yes"),
    ("CapabilityBoundingSet", ""),
    ("AmbientCapabilities", ""),
    ("MemoryDenyWriteExecute", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("ReadWritePaths", "/var/lib/grafana /var/log/grafana"),
    ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
])
def test_unit_is_hardened(host, setting, expected):
    value = hostchecks.unit_property(host, "grafana", setting)
    # systemd prints sets in its own order
    assert sorted(value.split()) == sorted(expected.split())


def test_unit_filters_system_calls(host):
    assert host.check_output("systemctl show -p SystemCallFilter --value grafana").strip()
    assert host.check_output("systemctl show -p SystemCallArchitectures --value grafana").strip() == "native"


def test_unit_runs_the_release_with_its_config(host):
    cmdline = host.file("/proc/%s/cmdline" % main_pid(host)).content_string.split("\0")
    assert cmdline[1:6] == ["/opt/grafana/current/bin/grafana", "server", "--homepath=/opt/grafana/current",
                            "--config=/etc/grafana/grafana.ini", "--packaging=tarball"]


def test_data_and_config_directories(host):
    data = host.file("/var/lib/grafana")
    assert data.is_directory and data.user == "grafana" and data.mode == 0o750
    assert host.file("/var/lib/grafana/grafana.db").user == "grafana"
    config = host.file("/etc/grafana")
    assert config.user == "root" and config.group == "grafana" and config.mode == 0o750
    ini = host.file("/etc/grafana/grafana.ini")
    assert ini.user == "root" and ini.group == "grafana" and ini.mode == 0o640


# ------------------------------------------------------------------------------------------------ secrets
@pytest.mark.parametrize("path,length", [("/etc/grafana/admin_password", 32), ("/etc/grafana/secret_key", 40)])
def test_secret_files(host, path, length):
    secret = host.file(path)
    assert secret.user == "root" and secret.group == "grafana" and secret.mode == 0o640
    value = secret.content_string
    name = host.backend.name
    if path.endswith("admin_password") and name in SITE_PASSWORD:
        assert value == SITE_PASSWORD[name]
    else:
        assert re.fullmatch(r"[A-Za-z0-9]{%d}" % length, value), "not a generated secret"


def test_grafana_ini_reads_the_secrets_from_files(host):
    ini = host.file("/etc/grafana/grafana.ini").content_string
    assert "admin_password = $__file{/etc/grafana/admin_password}" in ini
    assert "secret_key = $__file{/etc/grafana/secret_key}" in ini
    assert "http_port = %d" % PORTS[host.backend.name] in ini
    assert "reporting_enabled = false" in ini and "check_for_updates = false" in ini
    # the security switch is on: HTTPS with the host's certificate, /metrics behind the grafana-client credential
    for line in ("protocol = https", "cert_file = /etc/grafana/tls/server.crt", "cert_key = /etc/grafana/tls/server.key",
                 "min_tls_version = TLS1.2", "cookie_secure = true", "basic_auth_username = hpcobs",
                 "basic_auth_password = $__file{/etc/grafana/tls/grafana-client}"):
        assert line in ini.splitlines(), line


# what the tls tasks install (roles/service tasks_from: tls): the CA and certificate readable, the key and the
# credentials for root and the grafana group only
# the datasources' credentials of the three secured components it reads, and its own /metrics credential
TLS_FILES = {"ca.crt": 0o644, "server.crt": 0o644, "server.key": 0o640, "grafana-client": 0o640,
             "victoriametrics-client": 0o640, "loki-client": 0o640, "alertmanager-client": 0o640}


def test_tls_files_and_credentials(host):
    tls = host.file("/etc/grafana/tls")
    assert (tls.user, tls.group, tls.mode) == ("root", "grafana", 0o750)
    assert sorted(host.check_output("ls /etc/grafana/tls").split()) == sorted(TLS_FILES)
    for name, mode in TLS_FILES.items():
        item = host.file("/etc/grafana/tls/%s" % name)
        assert (item.user, item.group, item.mode) == ("root", "grafana", mode), name
    # the files are the site PKI's: the host's own certificate, the CA and the credentials of the controller
    with open(pki("ca.crt"), encoding="utf-8") as handle:
        assert host.file("/etc/grafana/tls/ca.crt").content_string.strip() == handle.read().strip()
    with open(pki("hosts/%s.crt" % host.backend.name), encoding="utf-8") as handle:
        assert host.file("/etc/grafana/tls/server.crt").content_string.strip() == handle.read().strip()
    for name in ("grafana-client", "victoriametrics-client", "loki-client", "alertmanager-client"):
        assert host.file("/etc/grafana/tls/%s" % name).content_string.strip() == credential(name)


def test_datasource_provisioning_file_holds_no_secret(host):
    provisioning = host.file("/etc/grafana/provisioning/datasources/hpcobs.yaml")
    assert (provisioning.user, provisioning.group, provisioning.mode) == ("root", "grafana", 0o640)
    text = provisioning.content_string
    # the secrets by reference: Grafana reads the credential and the CA from their files ($__file{})
    assert "basicAuthPassword: $__file{/etc/grafana/tls/victoriametrics-client}" in text
    assert "tlsCACert: $__file{/etc/grafana/tls/ca.crt}" in text
    assert credential("victoriametrics-client") not in text and "BEGIN CERTIFICATE" not in text


def test_secrets_are_nowhere_else(host):
    secrets = [admin_password(host), host.file("/etc/grafana/secret_key").content_string,
               credential("victoriametrics-client"), credential("grafana-client")]
    pid = main_pid(host)
    places = {
        "systemctl show": host.check_output("systemctl show grafana"),
        "unit file": host.file("/etc/systemd/system/grafana.service").content_string,
        "grafana.ini": host.file("/etc/grafana/grafana.ini").content_string,
        "cmdline": host.file("/proc/%s/cmdline" % pid).content_string,
        "environ": host.check_output("tr '\\0' '\\n' < /proc/%s/environ" % pid),
        "ps": host.check_output("ps -eo args"),
        "provisioning": host.check_output("cat /etc/grafana/provisioning/*/*.yaml"),
    }
    for secret in secrets:
        assert len(secret) >= 8
        for where, text in places.items():
            assert secret not in text, "a secret appears in %s" % where


def test_admin_login_uses_the_password_file(host):
    status, _ = api(host, "/api/datasources")
    assert status == 200
    assert api(host, "/api/datasources", password="wrong-password")[0] == 401
    assert api(host, "/api/datasources", auth=False)[0] == 401


def test_the_password_grafana_was_created_with_was_kept(host):
    # The stand-in, like Grafana, stores the admin password when it creates its database and never takes a changed
    # file into account by itself. The login above works and the account was never reset: the file of the first
    # converge survived the idempotence run.
    row = host.check_output("python3 -c \"import sqlite3; print(sqlite3.connect('/var/lib/grafana/grafana.db')"
                            ".execute('select created, updated from user where login=\\\"admin\\\"').fetchone())\"")
    created, updated = re.findall(r"'([^']+)'", row)
    assert created == updated


def test_health(host):
    status, body = api(host, "/api/health", auth=False)
    assert status == 200 and body["database"] == "ok"
    assert body["version"] == bundle_manifest()["components"]["grafana"]["version"]


# ------------------------------------------------------------------------------------------------ provisioning
def test_datasources(host):
    status, datasources = api(host, "/api/datasources")
    assert status == 200
    by_uid = {d["uid"]: d for d in datasources}
    assert set(by_uid) == {"hpcobs-vm", "hpcobs-loki", "hpcobs-am"}
    vm, loki, am = by_uid["hpcobs-vm"], by_uid["hpcobs-loki"], by_uid["hpcobs-am"]
    # the data host's Grafana reads its own services by default; the other one is given the data host's URLs
    base = "127.0.0.1" if host.backend.name == DATA_HOST else DATA_HOST
    # VictoriaMetrics, Loki and Alertmanager are secured (tls: true in the components map): https, the client user
    # and each one's credential, the site CA
    assert (vm["type"], vm["url"], vm["isDefault"]) == ("prometheus", "https://%s:8428" % base, True)
    assert vm["jsonData"]["timeInterval"] == "15s" and vm["jsonData"]["httpMethod"] == "POST"
    assert (loki["type"], loki["url"], loki["isDefault"]) == ("loki", "https://%s:3100" % base, False)
    assert (am["type"], am["url"]) == ("alertmanager", "https://%s:9093" % base)
    assert am["jsonData"]["implementation"] == "prometheus"
    for secured in (vm, loki, am):
        assert (secured["basicAuth"], secured["basicAuthUser"], secured["jsonData"]["tlsAuthWithCACert"]) == (
            True, "hpcobs", True), secured["uid"]
        assert secured["secureJsonFields"] == {"basicAuthPassword": True, "tlsCACert": True}, secured["uid"]
    assert all(d["readOnly"] and d["editable"] is False for d in datasources)


@pytest.mark.parametrize("uid", ["hpcobs-vm", "hpcobs-am"])
def test_datasource_reaches_its_service(host, uid):
    # from this Grafana host to the management host's VictoriaMetrics and Alertmanager, over the test network
    status, body = api(host, "/api/datasources/uid/%s/health" % uid)
    assert status == 200, body
    assert body["status"] == "OK"


def test_dashboards_are_loaded_in_their_folders(host):
    status, hits = api(host, "/api/search?type=dash-db")
    assert status == 200
    loaded = {h["uid"]: h for h in hits}
    assert set(loaded) == OUR_DASHBOARDS | COMMUNITY[host.backend.name]
    for uid in OUR_DASHBOARDS:
        assert (loaded[uid]["folderUid"], loaded[uid]["folderTitle"]) == ("hpcobs", "HPC observability")
    for uid in COMMUNITY[host.backend.name]:
        assert (loaded[uid]["folderUid"], loaded[uid]["folderTitle"]) == ("hpcobs-community", "Community")


def test_every_dashboard_file_on_the_host_is_loaded(host):
    files = host.check_output("find /etc/grafana/dashboards -type f -name '*.json' | sort").split()
    assert len(files) == len(OUR_DASHBOARDS | COMMUNITY[host.backend.name])
    loaded = {h["uid"] for h in api(host, "/api/search?type=dash-db")[1]}
    for path in files:
        uid = json.loads(host.file(path).content_string)["uid"]
        assert uid in loaded, "%s was not loaded (see journalctl -u grafana)" % path


@pytest.mark.parametrize("uid", sorted(OUR_DASHBOARDS))
def test_dashboard_is_the_role_s_file(host, uid):
    status, body = api(host, "/api/dashboards/uid/%s" % uid)
    assert status == 200
    assert body["meta"]["provisioned"] is True and body["meta"]["canSave"] is False
    with open("%s/roles/grafana/files/dashboards/%s.json" % (ROOT, uid), encoding="utf-8") as handle:
        committed = json.load(handle)
    served = {k: v for k, v in body["dashboard"].items() if k not in ("id", "version")}
    assert served == {k: v for k, v in committed.items() if k not in ("id", "version")}


@pytest.mark.parametrize("uid", sorted(OUR_DASHBOARDS))
def test_every_panel_uses_the_provisioned_victoriametrics(host, uid):
    model = api(host, "/api/dashboards/uid/%s" % uid)[1]["dashboard"]
    panels = list(queries.iter_panels(model))
    assert panels
    for panel in panels:
        assert panel["datasource"] == VM_REF, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == VM_REF, (panel["title"], target["refId"])
    if uid == "hpcobs-executive":
        assert len(model["panels"]) <= 6


def test_home_dashboard_is_the_executive_board(host):
    ini = host.file("/etc/grafana/grafana.ini").content_string
    assert "default_home_dashboard_path = /etc/grafana/dashboards/hpcobs/hpcobs-executive.json" in ini


# ------------------------------------------------------------------------------------------------ community
def test_community_dashboards_per_the_bundle(host):
    files = set(host.check_output("ls /etc/grafana/dashboards/community").split())
    assert files == {"%s.json" % name for name in COMMUNITY[host.backend.name]}
    # the real community dashboards are not in the test bundle: listed as missing, never provisioned
    missing = {m["component"] for m in bundle_manifest().get("missing", [])}
    assert {"dashboard:nvidia-dcgm-exporter", "dashboard:node-exporter-full"} <= missing


def test_synthetic_community_dashboard_was_rewritten(host):
    if "hpcobs-test-synthetic" not in COMMUNITY[host.backend.name]:
        assert api(host, "/api/dashboards/uid/hpcobs-test-synthetic")[0] == 404
        return
    text = host.file("/etc/grafana/dashboards/community/hpcobs-test-synthetic.json").content_string
    assert "${DS_" not in text and "__inputs" not in text
    model = api(host, "/api/dashboards/uid/hpcobs-test-synthetic")[1]["dashboard"]
    refs = {p["title"]: p["datasource"] for p in queries.iter_panels(model)}
    assert refs["Old schema: datasource as a string"] == VM_REF
    assert refs["New schema: datasource reference"] == VM_REF
    assert refs["Kernel log lines (Loki)"] == {"type": "loki", "uid": "hpcobs-loki"}
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["datasource"]["current"]["value"] == "hpcobs-vm"
    assert variables["job"]["query"] == "dcgm"
