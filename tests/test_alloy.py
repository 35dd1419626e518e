"""Unit tests of the alloy role's configuration (roles/alloy/filter_plugins/hpcobs_alloy.py) and of the Alloy stand-in
(molecule/standins/alloy/alloy): what the role writes, what the stand-in refuses as Alloy 1.18 does, and a run that
ships a journal line and a file line with the project's labels and basic-auth credentials."""
from __future__ import annotations

import base64
import importlib.util
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from test_loki_standin import call, free_port, load, wait_ready
from test_promtail_standin import FAKE_JOURNALCTL, KERNEL_ENTRY

REPO = Path(__file__).resolve().parents[1]
ROLE = REPO / "roles" / "alloy"
ALLOY = REPO / "molecule" / "standins" / "alloy" / "alloy"
spec = importlib.util.spec_from_file_location("hpcobs_alloy", ROLE / "filter_plugins" / "hpcobs_alloy.py")
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)
alloy = load(ALLOY, "hpcobs_alloy_standin")

JOURNAL_LABELS = {"__journal__transport": "transport", "__journal_syslog_identifier": "syslog_identifier",
                  "__journal__systemd_unit": "unit", "__journal_priority_keyword": "priority",
                  "__journal__hostname": "host"}


def settings(**changes):
    base = {"loki_urls": ["http://mgmt01:3100"], "tenant_id": "", "username": "", "has_password": False,
            "password_file": "/etc/alloy/loki-password", "node_label": "gpu01", "external_labels": {},
            "journal_labels": dict(JOURNAL_LABELS), "journal_enabled": True, "journal_max_age": "12h",
            "file_targets": [{"job": "slurm", "paths": ["/var/log/slurm/*.log"]}], "batchwait": "1s",
            "batchsize": "1MiB", "log_level": "info"}
    base.update(changes)
    return base


def test_the_default_config_is_valid_alloy():
    text = plugin.alloy_config(settings())
    components = alloy.load(text, "config.alloy")
    assert set(components) == {"logging", "loki.write.default", "loki.relabel.journal", "loki.source.journal.journal",
                               "local.file_match.slurm", "loki.source.file.slurm"}
    config = alloy.promtail_config(components, "/var/lib/alloy", "0.0.0.0:12345")
    (client,) = config["clients"]
    assert client["url"] == "http://mgmt01:3100/loki/api/v1/push" and client["external_labels"] == {"node": "gpu01"}
    journal, files = config["scrape_configs"]
    assert journal["journal"]["labels"] == {"job": "systemd-journal"}
    assert {r["source_labels"][0]: r["target_label"] for r in journal["relabel_configs"]} == JOURNAL_LABELS
    # every transport is kept: nothing filters the kernel's own lines out
    assert journal["journal"]["matches"] == ""
    assert files["static_configs"] == [{"targets": ["localhost"],
                                        "labels": {"__path__": "/var/log/slurm/*.log", "job": "slurm"}}]


def test_credentials_tenant_and_labels_are_written():
    text = plugin.alloy_config(settings(username="node", has_password=True, tenant_id="hpc",
                                        external_labels={"cluster": "hpc1"},
                                        loki_urls=["http://a:3100/", "https://b:443/prefix"]))
    assert text.count("endpoint {") == 2
    assert 'url = "https://b:443/prefix/loki/api/v1/push"' in text
    assert 'basic_auth {\n      username = "node"\n      password_file = "/etc/alloy/loki-password"' in text
    assert 'tenant_id = "hpc"' in text and '"cluster" = "hpc1"' in text
    assert "password =" not in text  # only the file is named
    alloy.load(text, "config.alloy")


def test_strings_are_quoted_for_alloy():
    text = plugin.alloy_config(settings(external_labels={"site": 'a "quoted" \\ value'}))
    components = alloy.load(text, "c")
    assert alloy.attrs(components["loki.write.default"][2])["external_labels"]["site"] == 'a "quoted" \\ value'


@pytest.mark.parametrize("changes,problem", [
    ({"loki_urls": []}, "alloy_loki_urls must be a non-empty list"),
    ({"loki_urls": "http://a:3100"}, "alloy_loki_urls must be a non-empty list"),
    ({"loki_urls": ["mgmt01:3100"]}, "alloy_loki_urls must be a non-empty list"),
    ({"username": "u"}, "go together"),
    ({"has_password": True}, "go together"),
    ({"external_labels": {"node": "x"}}, "alloy_external_labels"),
    ({"external_labels": {"bad-name": "x"}}, "alloy_external_labels"),
    ({"journal_labels": {"_TRANSPORT": "transport"}}, "alloy_journal_labels"),
    ({"journal_labels": {"__journal__transport": "job"}}, "alloy_journal_labels"),
    ({"journal_max_age": "12 hours"}, "alloy_journal_max_age"),
    ({"file_targets": [{"job": "a b", "paths": ["/x"]}]}, "must match"),
    ({"file_targets": [{"job": "x", "paths": ["rel/*.log"]}]}, "is not absolute"),
    ({"file_targets": [{"job": "x", "paths": []}]}, "paths must be a non-empty list"),
    ({"file_targets": [{"job": "x", "paths": ["/x"], "path": "/y"}]}, "unknown key path"),
    ({"file_targets": [{"job": "x", "paths": ["/x"]}, {"job": "x", "paths": ["/y"]}]}, "used twice"),
    ({"journal_enabled": False, "file_targets": []}, "nothing to read"),
    ({"batchsize": "1 MB"}, "alloy_batchsize"),
    ({"log_level": "trace"}, "alloy_log_level"),
])
def test_problems(changes, problem):
    problems = plugin.alloy_problems(settings(**changes))
    assert any(problem in p for p in problems), problems


def test_good_settings_have_no_problem_and_the_filter_refuses_bad_ones():
    assert plugin.alloy_problems(settings()) == []
    with pytest.raises(plugin.AnsibleFilterError, match="alloy_loki_urls"):
        plugin.alloy_config_filter(settings(loki_urls=[]))


# ------------------------------------------------------------------------------------------------ the stand-in
GOOD = plugin.alloy_config(settings())


@pytest.mark.parametrize("change,message", [
    (lambda t: t.replace("max_age =", "max_agee ="), 'unrecognized attribute name "max_agee"'),
    (lambda t: t.replace('    url = "http://mgmt01:3100/loki/api/v1/push"\n', ""), 'missing required attribute "url"'),
    (lambda t: t.replace("  rule {", "  rules {", 1), 'unrecognized block name "rules"'),
    (lambda t: t.replace('loki.source.journal "journal"', 'loki.source.jornal "journal"'),
     'cannot find the definition of component name "loki.source.jornal"'),
    (lambda t: t.replace("loki.relabel.journal.rules", "loki.relabel.jornal.rules"),
     'component "loki.relabel.jornal.rules" does not exist or is out of scope'),
    (lambda t: t.replace("local.file_match.slurm.targets", "local.file_match.slurm.target"),
     'component "local.file_match.slurm.target" does not exist or is out of scope'),
    (lambda t: t + '\nloki.relabel "journal" {\n  forward_to = []\n}\n', "block loki.relabel.journal already declared"),
    (lambda t: t.replace('loki.write "default" {', 'loki.write "default" {{'), "expected identifier"),
    (lambda t: t.replace('"job" = "systemd-journal",', '"job" = "systemd-journal"\n "x" = "y"'),
     "missing ',' in field list"),
    (lambda t: t.replace('loki.write "default"', 'loki.write "de-fault"'), "expected block label to be a valid"),
    (lambda t: t.replace('max_age = "12h"', 'max_age = "12h'), "illegal character"),
    (lambda t: t + "\nstray = 1\n", 'unrecognized attribute name "stray"'),
])
def test_the_standin_refuses_what_alloy_refuses(tmp_path, change, message):
    path = tmp_path / "config.alloy"
    path.write_text(change(GOOD))
    result = subprocess.run([str(ALLOY), "validate", str(path)], capture_output=True, text=True)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert result.stderr.startswith("Error: %s:" % path)


def test_cli(tmp_path):
    path = tmp_path / "config.alloy"
    path.write_text(GOOD)
    assert subprocess.run([str(ALLOY), "validate", str(path)], capture_output=True).returncode == 0
    fmt = subprocess.run([str(ALLOY), "fmt", str(path)], capture_output=True, text=True)
    assert fmt.returncode == 0 and fmt.stdout == GOOD
    unknown = subprocess.run([str(ALLOY), "run", "--no-such-flag", str(path)], capture_output=True, text=True)
    assert unknown.returncode == 1 and "Error: unknown flag: --no-such-flag" in unknown.stderr
    missing = subprocess.run([str(ALLOY), "validate", str(tmp_path / "none.alloy")], capture_output=True, text=True)
    assert missing.returncode == 1 and "reading config path" in missing.stderr
    assert "STAND-IN" in subprocess.run([str(ALLOY), "--version"], capture_output=True, text=True).stdout


class Capture(BaseHTTPRequestHandler):
    pushes = []

    def log_message(self, *args):
        pass

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Capture.pushes.append((dict(self.headers), json.loads(body)))
        self.send_response(204)
        self.end_headers()


def test_run_ships_the_journal_and_files_with_the_contract_labels_and_credentials(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "journalctl").write_text(FAKE_JOURNALCTL)
    (bin_dir / "journalctl").chmod(0o755)
    (bin_dir / "entries.json").write_text(json.dumps(KERNEL_ENTRY) + "\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "slurmd.log").write_text("slurmd started\n")
    (tmp_path / "password").write_text("s3cret\n")
    Capture.pushes = []
    loki = ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    threading.Thread(target=loki.serve_forever, daemon=True).start()
    text = plugin.alloy_config(settings(loki_urls=["http://127.0.0.1:%d" % loki.server_address[1]],
                                        username="node", has_password=True, password_file=str(tmp_path / "password"),
                                        file_targets=[{"job": "slurm", "paths": [str(tmp_path / "logs" / "*.log")]}]))
    path = tmp_path / "config.alloy"
    path.write_text(text)
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ALLOY), "run", "--server.http.listen-addr=127.0.0.1:%d" % port,
                             "--storage.path", str(tmp_path / "data"), "--disable-reporting", str(path)],
                            env={"PATH": "%s:/usr/bin:/bin" % bin_dir}, stderr=subprocess.DEVNULL)
    try:
        wait_ready("http://127.0.0.1:%d/-/ready" % port)
        deadline = time.time() + 15
        while time.time() < deadline and sum(len(p[1]["streams"]) for p in Capture.pushes) < 2:
            time.sleep(0.2)
        streams = {s["stream"]["job"]: s for _, push in Capture.pushes for s in push["streams"]}
        assert streams["systemd-journal"]["stream"] == {"job": "systemd-journal", "node": "gpu01", "transport": "kernel",
                                                        "syslog_identifier": "kernel", "priority": "error",
                                                        "host": "gpu01"}
        assert streams["slurm"]["stream"] == {"job": "slurm", "node": "gpu01",
                                              "filename": str(tmp_path / "logs" / "slurmd.log")}
        auth = {headers.get("Authorization") for headers, _ in Capture.pushes}
        assert auth == {"Basic " + base64.b64encode(b"node:s3cret").decode()}
        metrics = call("http://127.0.0.1:%d/metrics" % port)[1]
        assert 'loki_source_journal_target_lines_total{component_id="loki.source.journal.journal",' \
               'component_path="/"} 1' in metrics
        assert (tmp_path / "data").is_dir()
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        loki.shutdown()


def test_role_defaults_match_argument_specs_and_readme():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert set(specs) == set(defaults)
    for name, item in specs.items():
        if "default" in item:
            assert item["default"] == defaults[name], name
    readme = (ROLE / "README.md").read_text()
    assert not [name for name in defaults if "`%s`" % name not in readme]


def test_with_the_security_switch_the_host_credential_and_the_site_ca_are_presented():
    secured = settings(loki_urls=["https://mgmt01:3100"], security=True, username="gpu01", has_password=True,
                       password_file="/etc/alloy/tls/loki-push-gpu01", ca_file="/etc/alloy/tls/ca.crt",
                       site_username="", site_password=False)
    assert plugin.alloy_problems(secured) == []
    text = plugin.alloy_config(secured)
    assert ('basic_auth {\n      username = "gpu01"\n      password_file = "/etc/alloy/tls/loki-push-gpu01"\n    }\n'
            '    tls_config {\n      ca_file = "/etc/alloy/tls/ca.crt"\n    }') in text
    assert any("must stay empty" in p for p in plugin.alloy_problems(dict(secured, site_username="proxy")))
    assert any("must stay empty" in p for p in plugin.alloy_problems(dict(secured, site_password="True")))
    assert any("https://" in p for p in plugin.alloy_problems(dict(secured, loki_urls=["http://mgmt01:3100"])))
    assert "tls_config" not in plugin.alloy_config(settings())


def test_the_stand_in_hands_the_endpoints_tls_config_and_credentials_to_its_client(tmp_path):
    """The stand-in's client gets tls_config { ca_file } and basic_auth { username, password_file } of every
    endpoint (what the role writes under hpcobs_security), and refuses an argument Alloy's blocks do not have."""
    from test_loki_standin import load
    standin = load(ALLOY, "hpcobs_alloy_standin")
    text = plugin.alloy_config(settings(loki_urls=["https://mgmt01:3100"], username="gpu01", has_password=True,
                                        password_file="/etc/alloy/tls/loki-push-gpu01", ca_file="/etc/alloy/tls/ca.crt"))
    config = standin.promtail_config(standin.load(text, "config.alloy"), str(tmp_path), "127.0.0.1:12345")
    (client,) = config["clients"]
    assert client["tls_config"] == {"ca_file": "/etc/alloy/tls/ca.crt"}
    assert client["basic_auth"] == {"username": "gpu01", "password_file": "/etc/alloy/tls/loki-push-gpu01"}
    with pytest.raises(standin.AlloyError, match='unrecognized attribute name "ca_fil"'):
        standin.load(text.replace("ca_file", "ca_fil"), "config.alloy")
