"""Runs of the role after the scenario's converge: a check run that changes nothing and notices the community
dashboards the bundle lacks, refusals of bad inputs before any change, and a new admin password applied to Grafana's
database (then the site's password restored). They run last: the password test changes state and puts it back."""
import json
import os
import shutil

import pytest

from grafana_lib import PORTS, SITE_PASSWORD, api, host_named, run_playbook, task_results

WATCHED = ["/etc/grafana/grafana.ini", "/etc/grafana/admin_password", "/etc/grafana/secret_key",
           "/etc/grafana/provisioning/datasources/hpcobs.yaml", "/etc/grafana/provisioning/dashboards/hpcobs.yaml",
           "/etc/systemd/system/grafana.service", "/var/lib/grafana/grafana.db", "/etc/grafana/tls/server.key",
           "/etc/grafana/tls/victoriametrics-client", "/etc/grafana/tls/grafana-client"]


def checksums(host):
    return {path: host.file(path).sha256sum for path in WATCHED}


def test_check_run_changes_nothing_and_notices_the_missing_community_dashboards():
    rc, report, tail = run_playbook("converge.yml", "all", "--check")
    assert rc == 0, tail
    for name in PORTS:
        stats = report["stats"][name]
        assert stats["changed"] == 0 and stats["failures"] == 0, tail
    notices = [item["msg"] for result in task_results(report, "Notice the community dashboards")
               for item in result.get("results", [])]
    assert len(notices) == 2 * len(PORTS), notices
    for dashboard in ("nvidia-dcgm-exporter", "node-exporter-full"):
        assert any(n.startswith("NOTICE grafana: community dashboard %s is not in the bundle" % dashboard)
                   and "not fetched" in n for n in notices), notices


@pytest.fixture(scope="module")
def damaged_bundle(tmp_path_factory):
    source = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "bundle")
    target = tmp_path_factory.mktemp("damaged") / "bundle"
    shutil.copytree(source, target, copy_function=os.link)  # hard links; the damaged file is replaced, not edited
    with open(os.path.join(source, "manifest.json"), encoding="utf-8") as handle:
        path = json.load(handle)["dashboards"]["hpcobs-test-synthetic"]["path"]
    damaged = target / path
    damaged.unlink()
    damaged.write_text('{"title": "altered", "panels": []}\n', encoding="utf-8")
    return str(target)


def test_bad_inputs_are_refused_before_anything_changes(damaged_bundle):
    # the cases do not depend on the distribution: one host
    name = "grafana-debian13"
    host = host_named(name)
    before = checksums(host)
    rc, report, tail = run_playbook("refusals.yml", name, "-e", "damaged_bundle=%s" % damaged_bundle)
    assert rc == 0, tail
    assert report["stats"][name]["changed"] == 0, tail
    refusals = task_results(report, "Report the refusals")[0]["_refusals | default({})"]
    assert "is in the gpu_nodes group" in refusals["gpu_node"]
    assert "must not set [paths], the admin user or password" in refusals["ini_password"]
    assert "the server's address, port, protocol, certificate and TLS version" in refusals["ini_protocol"]
    assert "VictoriaMetrics (victoriametrics) at http://grafana-debian12:8428" in refusals["http_datasource"]
    assert "over plain HTTP" in refusals["http_datasource"]
    assert "grafana_http_port 1-65535 (got 70000)" in refusals["port"]
    assert "names and uids must be unique" in refusals["duplicate_uid"]
    assert "community dashboard hpcobs-test-synthetic" in refusals["damaged_dashboard"]
    assert "but manifest.json says" in refusals["damaged_dashboard"]
    for message in refusals.values():
        assert "Nothing was changed" in message or "nothing was changed" in message
    assert checksums(host) == before


def test_a_new_admin_password_is_applied_then_the_old_one_restored():
    # on the host whose password the site gives (the other one's is generated)
    name = "grafana-debian12"
    host = host_named(name)
    new = "Rotated-Passw0rd-From-The-Vault"
    rc, report, tail = run_playbook("converge.yml", name, "-e", "grafana_admin_password=%s" % new)
    assert rc == 0, tail
    applied = task_results(report, "Apply the new admin password")
    assert applied and applied[0].get("changed") is True, tail
    assert host.file("/etc/grafana/admin_password").content_string == new
    assert api(host, "/api/datasources", password=new)[0] == 200
    assert api(host, "/api/datasources", password=SITE_PASSWORD[name])[0] == 401
    rc, report, tail = run_playbook("converge.yml", name)
    assert rc == 0, tail
    assert api(host, "/api/datasources", password=SITE_PASSWORD[name])[0] == 200
    assert api(host, "/api/datasources", password=new)[0] == 401
