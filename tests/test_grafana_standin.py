"""Unit tests of the Grafana stand-in (molecule/standins/grafana/grafana): what stops its start as it stops
Grafana 12's, the admin password kept from the first start and reset by the cli, and the API the scenario reads."""
from __future__ import annotations

import base64
import json
import signal
import subprocess
from pathlib import Path

import pytest

from test_loki_standin import call, free_port, wait_ready

REPO = Path(__file__).resolve().parents[1]
GRAFANA = REPO / "molecule" / "standins" / "grafana" / "grafana"
DEFAULTS = REPO / "molecule" / "standins" / "grafana" / "tree" / "conf" / "defaults.ini"


def setup(tmp_path, datasources=None, port=3000):
    home = tmp_path / "grafana" / "12.4.4"
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "defaults.ini").write_text(DEFAULTS.read_text())
    (tmp_path / "admin_password").write_text("first-password\n")
    for kind in ("datasources", "dashboards"):
        (tmp_path / "provisioning" / kind).mkdir(parents=True)
    (tmp_path / "dashboards").mkdir()
    (tmp_path / "dashboards" / "ok.json").write_text(json.dumps({"uid": "ok", "title": "OK"}))
    (tmp_path / "dashboards" / "untitled.json").write_text(json.dumps({"uid": "untitled", "title": ""}))
    (tmp_path / "dashboards" / "broken.json").write_text("{")
    (tmp_path / "provisioning" / "dashboards" / "p.yaml").write_text(json.dumps({"providers": [
        {"name": "p", "folder": "HPC", "folderUid": "hpcobs", "options": {"path": str(tmp_path / "dashboards")}}]}))
    (tmp_path / "provisioning" / "datasources" / "d.yaml").write_text(json.dumps({"datasources": datasources or [
        {"name": "VM", "uid": "vm", "type": "prometheus", "url": "http://127.0.0.1:9", "isDefault": True}]}))
    ini = tmp_path / "grafana.ini"
    ini.write_text("[paths]\ndata = %s\nprovisioning = %s\n[server]\nhttp_addr = 127.0.0.1\nhttp_port = %d\n"
                   "[security]\nadmin_password = $__file{%s}\n" % (tmp_path / "data", tmp_path / "provisioning",
                                                                  port, tmp_path / "admin_password"))
    return [str(GRAFANA), "--homepath=%s" % home, "--config=%s" % ini]


def run(argv, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, **kwargs)


@pytest.mark.parametrize("datasources,message", [
    ([{"name": "A", "uid": "x", "type": "prometheus", "isDefault": True},
      {"name": "B", "uid": "y", "type": "loki", "isDefault": True}], "Only one datasource per organization"),
    ([{"name": "A", "uid": "x", "type": "prometheus"}, {"name": "B", "uid": "x", "type": "loki"}],
     "uid x is used twice"),
    ([{"name": "A"}], "needs a name and a type"),
])
def test_provisioning_that_stops_grafana_stops_the_standin(tmp_path, datasources, message):
    argv = setup(tmp_path, datasources)
    result = run([argv[0], "server"] + argv[1:])
    assert result.returncode == 1 and message in result.stderr, result.stderr


def test_an_unreadable_file_reference_stops_the_start(tmp_path):
    argv = setup(tmp_path)
    (tmp_path / "admin_password").unlink()
    result = run([argv[0], "server"] + argv[1:])
    assert result.returncode == 1 and "for $__file{}" in result.stderr


def test_unknown_flags_and_commands_are_refused(tmp_path):
    argv = setup(tmp_path)
    assert "unknown flag: --no-such-flag" in run([argv[0], "server", "--no-such-flag"] + argv[1:]).stderr
    assert run([argv[0], "serve"] + argv[1:]).returncode == 1
    version = run([argv[0], "--version", argv[1]])
    assert version.returncode == 0 and "12.4.4" in version.stdout and "STAND-IN" in version.stdout


def test_api_password_kept_and_reset(tmp_path):
    port = free_port()
    argv = setup(tmp_path, port=port)
    url = "http://127.0.0.1:%d" % port

    def get(path, password):
        auth = base64.b64encode(("admin:%s" % password).encode()).decode()
        status, body = call(url + path, headers={"Authorization": "Basic " + auth})
        return status, json.loads(body)

    proc = subprocess.Popen([argv[0], "server"] + argv[1:], stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(url + "/api/health")
        assert json.loads(call(url + "/api/health")[1]) == {"commit": "hpcobs-standin", "database": "ok",
                                                            "version": "12.4.4"}
        assert get("/api/datasources", "wrong")[0] == 401
        status, (datasource,) = get("/api/datasources", "first-password")
        assert status == 200 and (datasource["uid"], datasource["isDefault"]) == ("vm", True)
        assert get("/api/datasources/uid/vm/health", "first-password")[1]["status"] == "ERROR"  # nothing on :9
        # the dashboard without a title and the invalid one are skipped, as Grafana logs and skips them
        assert [h["uid"] for h in get("/api/search?type=dash-db&folderUIDs=hpcobs", "first-password")[1]] == ["ok"]
        assert get("/api/search?type=dash-db&folderUIDs=other", "first-password")[1] == []
        assert get("/api/dashboards/uid/ok", "first-password")[1]["meta"]["provisioned"] is True
        # a changed file is not taken into account by itself: the database keeps the first password
        (tmp_path / "admin_password").write_text("second-password\n")
        assert get("/api/datasources", "second-password")[0] == 401
        reset = run([argv[0], "cli"] + argv[1:] + ["admin", "reset-admin-password", "--password-from-stdin"],
                    input="second-password\n")
        assert reset.returncode == 0, reset.stderr
        assert get("/api/datasources", "second-password")[0] == 200
        assert get("/api/datasources", "first-password")[0] == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    assert "failed to load dashboard from file" in proc.stderr.read()
