"""Unit tests of the Loki stand-in (molecule/standins/loki/loki).

The stand-ins replace Loki and Promtail in the Molecule scenarios, where the real binaries cannot be had. These tests
keep them honest: the stand-in checks must reject
what the real tools reject for the keys they know, and the HTTP API must answer as Loki's does for the calls the
scenarios make.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
LOKI = REPO / "molecule" / "standins" / "loki" / "loki"
PROMTAIL = REPO / "molecule" / "standins" / "promtail" / "promtail"


def load(path: Path, name: str):
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


loki = load(LOKI, "hpcobs_loki_standin")

def standin_modules(path: Path) -> list[Path]:
    """The modules a stand-in imports besides the standard library (its MODULES file, packed with it)."""
    listing = path.parent / "MODULES"
    if not listing.exists():
        return []
    return [REPO / line.split("#")[0].partition(" as ")[0].strip() for line in listing.read_text().splitlines()
            if line.split("#")[0].strip()]


def test_standins_use_only_the_standard_library_and_yaml():
    """What the test images have: python3 and python3-yaml (scripts/build-images.sh)."""
    for path in (LOKI, PROMTAIL, REPO / "molecule" / "standins" / "alloy" / "alloy"):
        modules = standin_modules(path)
        allowed = set(sys.stdlib_module_names) | {module.stem for module in modules} | {"yaml"}
        for source in [path] + modules:
            imported = re.findall(r"^(?:import|from) ([a-zA-Z_][\w]*)", source.read_text(), re.M)
            assert set(imported) <= allowed | {"ansible"}, (source, set(imported) - allowed)
        assert path.read_text().splitlines()[0] == "#!/usr/bin/env python3"
        assert os.access(path, os.X_OK)
        assert "STAND-IN" in path.read_text()[:300]


# ------------------------------------------------------------------------------------------ stand-in checks
BASE_CONFIG = {
    "auth_enabled": False,
    "server": {"http_listen_port": 3100, "grpc_listen_port": 9095},
    "common": {"path_prefix": "/var/lib/loki"},
    "schema_config": {"configs": [{"from": "2025-01-01", "store": "tsdb", "object_store": "filesystem",
                                   "schema": "v13", "index": {"prefix": "index_", "period": "24h"}}]},
    "compactor": {"retention_enabled": True, "delete_request_store": "filesystem"},
    "limits_config": {"retention_period": "744h"},
    "ruler": {"storage": {"type": "local", "local": {"directory": "/etc/loki/rules"}},
              "alertmanager_url": "http://a:9093,http://b:9093"},
}
# keys a test Loki needs besides BASE_CONFIG: free ports, a short readiness delay (default 15s), fast rule polling
QUICK = {"min_ready_duration": "1s"}


def mutate(path, value):
    config = json.loads(json.dumps(BASE_CONFIG))
    node = config
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return config


def test_verify_config_accepts_a_sound_config():
    assert loki.verify_config(BASE_CONFIG) == []


# What the real Loki 3.7.6 rejects, with its wording (strict YAML decoding into its config structs).
@pytest.mark.parametrize("path,value,message", [
    (("unknown_section",), {}, "field unknown_section not found in type loki.Config"),
    (("server", "foo"), 1, "field foo not found in type server.Config"),
    (("limits_config", "ingestion_rate_mbs"), 16, "field ingestion_rate_mbs not found in type validation.plain"),
    (("limits_config", "ingestion_rate_mb"), "abc", "cannot unmarshal !!str `abc` into float64"),
    (("limits_config", "max_global_streams_per_user"), "many", "cannot unmarshal !!str `many` into int"),
    (("ruler", "storage", "local", "directry"), "/x", "field directry not found in type ruler.Config.storage.local"),
    (("ruler", "wal"), {"dri": "/x"}, "field dri not found in type ruler.Config.wal"),
    (("schema_config", "configs", 0, "index", "perod"), "24h", "field perod not found in type config.PeriodConfig.index"),
    (("schema_config", "configs", 0, "shema"), "v13", "field shema not found in type config.PeriodConfig"),
    (("common", "ring"), {"kvstore": {"stor": "inmemory"}}, "field stor not found in type common.Config.ring.kvstore"),
    (("compactor", "compaction_interval"), "often", 'time: invalid duration "often"'),
    (("compactor", "delete_request_store"), KeyError, "delete-request-store should be configured"),
    (("limits_config", "retention_period"), "31 days", 'time: invalid duration "31 days"'),
    (("schema_config", "configs"), [], "at least one period config"),
    (("schema_config", "configs", 0, "schema"), "v99", "schema must be one of"),
    (("server", "http_listen_port"), "3100", "cannot unmarshal !!str `3100` into int"),
    (("ruler", "storage", "local"), {}, "ruler.storage.local.directory is required"),
    (("auth_enabled",), "no", "cannot unmarshal !!str `no` into bool"),
    (("server",), "x", "cannot unmarshal !!str `x` into server.Config"),
])
def test_verify_config_rejects(path, value, message):
    errors = loki.verify_config(mutate(path, value))
    assert any(message in error for error in errors), errors


# What the real Loki 3.7.6 accepts and an earlier stand-in refused.
@pytest.mark.parametrize("path,value", [
    (("limits_config", "retention_period"), "12h"),
    (("ruler", "alertmanager_url"), "mgmt01:9093"),
    (("limits_config", "discover_service_name"), []),
    (("ingester",), {"lifecycler": {"min_ready_duration": "1s"}, "wal": {"dir": "/x"}}),
    (("query_range",), {"max_retries": 3, "results_cache": {"cache": {"embedded_cache": {"enabled": True}}}}),
])
def test_verify_config_accepts_what_loki_accepts(path, value):
    assert loki.verify_config(mutate(path, value)) == []


def test_the_key_table_is_loki_3_7():
    keys = loki.loki_config_keys
    assert keys.VERSION == "3.7.6"
    assert keys.BLOCKS["limits_config"]["ingestion_rate_mb"] == "f"
    assert keys.BLOCKS["limits_config"]["discover_service_name"] == "l"
    assert keys.BLOCKS["ingester"]["lifecycler"]["min_ready_duration"] == "d"
    assert keys.BLOCKS["loki.Config"]["server"] == "<server>"


def test_rule_file_check():
    good = {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": '{a="b"} |= "x"', "for": "1m",
                                                "labels": {"severity": "critical"},
                                                "annotations": {"summary": "s"}}]}]}
    assert loki.check_rule_file(good)[1] == []
    bad = json.loads(json.dumps(good))
    bad["groups"][0]["rules"][0].update({"record": "r", "bogus": 1})
    bad["groups"].append({"name": "g", "rules": []})
    errors = loki.check_rule_file(bad)[1]
    assert any("exactly one of alert and record" in e for e in errors)
    assert any("field bogus not found" in e for e in errors)
    assert any("repeated" in e for e in errors)
    assert any("a group needs rules" in e for e in errors)
    assert loki.check_rule_file({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up == 0"}]}]})[1]
    # the unbalanced parenthesis that made a real Loki load no rule group at all
    broken = {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": 'sum(count_over_time({a="b"}[5m]) > 0'}]}]}
    (error,) = loki.check_rule_file(broken)[1]
    assert "could not parse expression: parse error at line 1" in error


# --------------------------------------------------------------------------------------------- LogQL subset
def test_query_parser_selects_like_logql():
    matchers, filters = loki.parse_query('{syslog_identifier="kernel", node=~"gpu0[12]", unit!="x"} '
                                         '|= "NVRM: Xid" != "ignore" |~ `\\): (79|48),` !~ "debug"')
    labels = {"syslog_identifier": "kernel", "node": "gpu01"}
    line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
    assert loki.matches(labels, line, matchers, filters)
    assert not loki.matches(dict(labels, node="gpu011"), line, matchers, filters)
    assert not loki.matches(labels, line.replace("79", "13"), matchers, filters)
    assert not loki.matches(labels, line + " debug", matchers, filters)


@pytest.mark.parametrize("query", [
    'count_over_time({a="b"}[5m])', '{a="b"} | json', "{}", 'rate({a="b"}[1m])', "a"])
def test_query_parser_refuses_what_the_standin_cannot_answer(query):
    with pytest.raises(ValueError):
        loki.parse_query(query)


# ------------------------------------------------------------------------------------------------- HTTP API
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def call(url, data=None, headers=None, method=None):
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def wait_ready(url, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if call(url)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    pytest.fail("%s never answered 200" % url)


@pytest.fixture
def loki_server(tmp_path):
    port = free_port()
    rules = tmp_path / "rules" / "fake"
    rules.mkdir(parents=True)
    (rules / "hpcobs.yml").write_text(yaml.safe_dump({"groups": [{"name": "hpcobs-kernel-log", "rules": [
        {"alert": "HpcobsGpuXidKernelLogCritical", "expr": '{transport="kernel"} |= "NVRM: Xid"',
         "labels": {"severity": "critical", "audience": "oncall"},
         "annotations": {"summary": "{{ $labels.node }}", "description": "d", "runbook": "r"}}]}]}))
    grpc = free_port()
    config = dict(BASE_CONFIG, server={"http_listen_address": "127.0.0.1", "http_listen_port": port,
                                       "grpc_listen_address": "127.0.0.1", "grpc_listen_port": grpc},
                  common={"path_prefix": str(tmp_path / "data"),
                          "storage": {"filesystem": {"chunks_directory": str(tmp_path / "data" / "chunks")}}},
                  ingester={"lifecycler": QUICK},
                  ruler={"storage": {"type": "local", "local": {"directory": str(tmp_path / "rules")}},
                         "poll_interval": "1s"})
    path = tmp_path / "loki.yml"
    path.write_text(yaml.safe_dump(config))

    def start():
        proc = subprocess.Popen([str(LOKI), "-config.file=%s" % path, "-target=all"], stderr=subprocess.PIPE,
                                text=True)
        wait_ready("http://127.0.0.1:%d/ready" % port)
        return proc

    server = {"url": "http://127.0.0.1:%d" % port, "start": start, "config": path, "data": tmp_path / "data",
              "rules": rules, "grpc": grpc}
    server["proc"] = start()
    yield server
    server["proc"].send_signal(signal.SIGTERM)
    server["proc"].wait(timeout=10)


def push(url, streams, content_type="application/json"):
    body = json.dumps({"streams": streams}).encode()
    return call(url + "/loki/api/v1/push", body, {"Content-Type": content_type}, "POST")


def test_cli_verify_config_and_flags(loki_server, tmp_path):
    ok = subprocess.run([str(LOKI), "--config.file", str(loki_server["config"]), "-verify-config"],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and "config is valid" in ok.stderr
    bad = tmp_path / "bad.yml"
    bad.write_text(loki_server["config"].read_text().replace("delete_request_store: filesystem", "x: 1"))
    failed = subprocess.run([str(LOKI), "-config.file=%s" % bad, "-verify-config"], capture_output=True, text=True)
    assert failed.returncode == 1
    assert "delete-request-store" in failed.stderr
    unknown = subprocess.run([str(LOKI), "-config.file=x", "-no-such-flag"], capture_output=True, text=True)
    assert unknown.returncode == 2 and "flag provided but not defined: -no-such-flag" in unknown.stderr


def test_push_query_labels_and_persistence(loki_server):
    url = loki_server["url"]
    now = time.time_ns()
    status, _ = push(url, [{"stream": {"node": "gpu01", "syslog_identifier": "kernel", "transport": "kernel"},
                            "values": [[str(now), "NVRM: Xid (PCI:0000:3b:00): 79, pid=1"],
                                       [str(now + 1), "something else"]]},
                           {"stream": {"node": "gpu02", "job": "slurm"}, "values": [[str(now), "slurm line"]]}])
    assert status == 204
    params = urllib.parse.urlencode({"query": '{transport="kernel"} |= "NVRM: Xid"',
                                     "start": str(now - 10 ** 9)})
    status, body = call(url + "/loki/api/v1/query_range?" + params)
    result = json.loads(body)["data"]["result"]
    assert status == 200 and len(result) == 1
    assert result[0]["stream"] == {"node": "gpu01", "syslog_identifier": "kernel", "transport": "kernel"}
    assert [v[1] for v in result[0]["values"]] == ["NVRM: Xid (PCI:0000:3b:00): 79, pid=1"]
    params_slurm = urllib.parse.urlencode({"query": '{job="slurm"} != "other"', "start": str(now - 10 ** 9)})
    (slurm,) = json.loads(call(url + "/loki/api/v1/query_range?" + params_slurm)[1])["data"]["result"]
    assert slurm["stream"] == {"node": "gpu02", "job": "slurm"}
    # stored in the chunks directory: a restart keeps them
    loki_server["proc"].send_signal(signal.SIGTERM)
    loki_server["proc"].wait(timeout=10)
    loki_server["proc"] = loki_server["start"]()
    status, body = call(url + "/loki/api/v1/query_range?" + params)
    assert len(json.loads(body)["data"]["result"]) == 1
    assert (loki_server["data"] / "chunks" / "standin-entries.jsonl").exists()


def test_push_refusals(loki_server):
    url = loki_server["url"]
    assert push(url, [{"stream": {"a": "b"}, "values": [["1", "x"]]}], "application/x-protobuf")[0] == 415
    assert push(url, [{"stream": {}, "values": [["1", "x"]]}])[0] == 400
    assert push(url, [{"stream": {"bad-name": "x"}, "values": [["1", "x"]]}])[0] == 400
    assert push(url, [{"stream": {"a": "b"}, "values": [["soon", "x"]]}])[0] == 400
    status, body = call(url + "/loki/api/v1/query_range?query=" + urllib.parse.quote('sum(rate({a="b"}[1m]))'))
    assert status == 400 and "log queries only" in body


def test_rules_are_loaded_and_listed(loki_server):
    url = loki_server["url"]
    groups = json.loads(call(url + "/prometheus/api/v1/rules")[1])["data"]["groups"]
    assert [(g["name"], g["file"]) for g in groups] == [("hpcobs-kernel-log", "hpcobs.yml")]
    rule = groups[0]["rules"][0]
    assert rule["name"] == "HpcobsGpuXidKernelLogCritical" and rule["type"] == "alerting"
    assert rule["labels"] == {"severity": "critical", "audience": "oncall"}
    # a log query loads but the real ruler fails every evaluation of it
    assert rule["health"] == "err" and rule["lastError"] == "rule result is not a vector or scalar"


def test_one_broken_rule_file_leaves_the_tenant_without_any_group(loki_server):
    """Real Loki 3.7.6: 'unable to list rules ... could not parse expression', and no group of the tenant loads."""
    url = loki_server["url"]
    (loki_server["rules"] / "site.yml").write_text(yaml.safe_dump({"groups": [{"name": "site", "rules": [
        {"alert": "SiteOom", "expr": 'sum(count_over_time({unit="kernel"} |= "Out of memory" [5m]) > 0'}]}]}))
    deadline = time.time() + 10
    while time.time() < deadline and "hpcobs_standin_rule_files_failed 1" not in call(url + "/metrics")[1]:
        time.sleep(0.3)
    assert "hpcobs_standin_rule_files_failed 1" in call(url + "/metrics")[1]
    assert json.loads(call(url + "/prometheus/api/v1/rules")[1])["data"]["groups"] == []
    (loki_server["rules"] / "site.yml").unlink()
    deadline = time.time() + 10
    while time.time() < deadline and not json.loads(call(url + "/prometheus/api/v1/rules")[1])["data"]["groups"]:
        time.sleep(0.3)
    assert [g["name"] for g in json.loads(call(url + "/prometheus/api/v1/rules")[1])["data"]["groups"]] == [
        "hpcobs-kernel-log"]


def test_grpc_port_is_held_on_the_configured_address(loki_server):
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", loki_server["grpc"])) == 0


def test_ready_answers_503_until_the_ingester_waited(tmp_path):
    """Real Loki: 503 "Ingester not ready: waiting for 15s after being ready" for about 16 s after start."""
    assert loki.Loki(dict(BASE_CONFIG, common={"path_prefix": str(tmp_path)})).min_ready == "15s"
    port = free_port()
    config = dict(BASE_CONFIG, server={"http_listen_address": "127.0.0.1", "http_listen_port": port,
                                       "grpc_listen_address": "127.0.0.1", "grpc_listen_port": free_port()},
                  common={"path_prefix": str(tmp_path)}, ingester={"lifecycler": {"min_ready_duration": "3s"}},
                  ruler={})
    path = tmp_path / "loki.yml"
    path.write_text(yaml.safe_dump(config))
    started = time.time()
    proc = subprocess.Popen([str(LOKI), "-config.file=%s" % path], stderr=subprocess.DEVNULL)
    try:
        url = "http://127.0.0.1:%d/ready" % port
        deadline = time.time() + 10
        while True:
            try:
                status, body = call(url)
                break
            except OSError:
                assert time.time() < deadline
                time.sleep(0.1)
        assert (status, body) == (503, "Ingester not ready: waiting for 3s after being ready\n")
        wait_ready(url)
        assert time.time() - started >= 3
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def test_auth_enabled_needs_a_tenant(tmp_path):
    port = free_port()
    config = dict(BASE_CONFIG, auth_enabled=True, server={"http_listen_address": "127.0.0.1", "http_listen_port": port,
                                                          "grpc_listen_port": free_port()},
                  common={"path_prefix": str(tmp_path)}, ruler={}, ingester={"lifecycler": QUICK})
    path = tmp_path / "loki.yml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([str(LOKI), "-config.file=%s" % path], stderr=subprocess.DEVNULL)
    try:
        url = "http://127.0.0.1:%d" % port
        wait_ready(url + "/ready")
        query = "/loki/api/v1/query?query=" + urllib.parse.quote('{a="b"}')
        assert call(url + query)[0] == 401
        assert call(url + query, headers={"X-Scope-OrgID": "site"})[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


# --------------------------------------------------------------------------------------------- ruler evaluation
XID_RULE = ('sum by (node, pci, xid) (count_over_time({transport="kernel"} |= "NVRM: Xid" '
            '| regexp `NVRM: Xid \\((?:PCI:)?(?P<pci>[^)]+)\\):\\s*(?P<xid>\\d+)` '
            '| xid =~ "48|63|64|74|79|94|95" [5m])) > 0')


def xid_rules(expr=XID_RULE, hold=None):
    rule = {"alert": "HpcobsGpuXidKernelLogCritical", "expr": expr,
            "labels": {"severity": "critical", "audience": "oncall"},
            "annotations": {"summary": "XID {{ $labels.xid }} on {{ $labels.node }} ({{ $labels.pci }})"}}
    if hold:
        rule["for"] = hold
    return {"fake": {"hpcobs.yml": [{"name": "hpcobs-kernel-log", "rules": [rule]}]}}


def standin(tmp_path, rules):
    store = loki.Loki(dict(BASE_CONFIG, common={"path_prefix": str(tmp_path)}))
    store.rules = rules
    return store


def entry(ts, line, **labels):
    return {"tenant": "fake", "stream": dict({"node": "gpu01", "job": "systemd-journal"}, **labels), "ts": str(ts),
            "line": line}


def test_compile_rule_takes_the_shipped_shape_only():
    by, matchers, filters, stages, window, op, threshold = loki.compile_rule(XID_RULE)
    assert by == ["node", "pci", "xid"] and matchers == [("transport", "=", "kernel")]
    assert filters == [("|=", "NVRM: Xid")] and window == 300 * 10 ** 9 and (op, threshold) == (">", 0.0)
    assert [s[0] for s in stages] == ["regexp", "label"] and stages[1][1:] == ("xid", "=~", "48|63|64|74|79|94|95")
    for other in ['sum(rate({a="b"}[5m])) > 0', 'count_over_time({a="b"}[5m]) > 0', '{a="b"} |= "x"',
                  'sum by (node) (count_over_time({a="b"} | json [5m])) > 0']:
        assert loki.compile_rule(other) is None, other


def test_only_kernel_transport_lines_fire_the_xid_rule(tmp_path):
    now = time.time_ns()
    store = standin(tmp_path, xid_rules())
    forged = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
    store.entries = [
        entry(now - 10 ** 9, forged, transport="syslog", syslog_identifier="kernel"),
        entry(now - 10 ** 9, "NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
              "the bus.", transport="kernel", syslog_identifier="kernel"),
        entry(now - 10 ** 9, "NVRM: Xid (PCI:0000:87:00): 13, pid=1, name=x, Graphics SM Warp Exception",
              transport="kernel", syslog_identifier="kernel"),
        entry(now - 400 * 10 ** 9, "NVRM: Xid (PCI:0000:88:00): 79, old", transport="kernel"),
    ]
    (alert,) = store.evaluate(now)
    assert alert["labels"] == {"node": "gpu01", "pci": "0000:86:00", "xid": "79", "severity": "critical",
                               "audience": "oncall", "alertname": "HpcobsGpuXidKernelLogCritical"}
    assert alert["annotations"]["summary"] == "XID 79 on gpu01 (0000:86:00)"
    assert [a["labels"]["pci"] for a in store.alerts("fake")] == ["0000:86:00"]
    (group,) = store.groups("fake")
    assert group["rules"][0]["state"] == "firing" and group["rules"][0]["health"] == "ok"
    # the forged line alone fires nothing
    store.entries = store.entries[:1]
    assert store.evaluate(now) == [] and store.alerts("fake") == []
    assert store.groups("fake")[0]["rules"][0]["state"] == "inactive"


def test_for_keeps_an_alert_pending_and_the_regexp_renames_stream_labels(tmp_path):
    now = time.time_ns()
    store = standin(tmp_path, xid_rules(hold="1m"))
    store.entries = [entry(now - 10 ** 9, "NVRM: Xid (0000:3b:00): 79, x", transport="kernel", pci="stream")]
    assert store.evaluate(now) == [] and store.alerts("fake")[0]["state"] == "pending"
    assert store.evaluate(now + 30 * 10 ** 9) == [] and store.alerts("fake")[0]["state"] == "pending"
    (alert,) = store.evaluate(now + 61 * 10 ** 9)
    assert alert["state"] == "firing" and alert["labels"]["pci"] == "stream"  # the stream's own label stays
    assert loki.run_stages({"pci": "s"}, "NVRM: Xid (PCI:0000:3b:00): 79", loki.compile_rule(XID_RULE)[3]) == {
        "pci": "s", "pci_extracted": "0000:3b:00", "xid": "79"}


def test_the_ruler_posts_firing_alerts_to_alertmanager(tmp_path):
    import http.server
    import threading
    received = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            received.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_):
            pass

    receiver = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    port, grpc = free_port(), free_port()
    rules = tmp_path / "rules" / "fake"
    rules.mkdir(parents=True)
    (rules / "hpcobs.yml").write_text(yaml.safe_dump({"groups": xid_rules()["fake"]["hpcobs.yml"]}))
    config = dict(BASE_CONFIG, server={"http_listen_address": "127.0.0.1", "http_listen_port": port,
                                       "grpc_listen_address": "127.0.0.1", "grpc_listen_port": grpc},
                  common={"path_prefix": str(tmp_path / "data")}, ingester={"lifecycler": QUICK},
                  ruler={"storage": {"type": "local", "local": {"directory": str(tmp_path / "rules")}},
                         "evaluation_interval": "1s",
                         "alertmanager_url": "http://127.0.0.1:%d" % receiver.server_address[1]})
    (tmp_path / "loki.yml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([str(LOKI), "-config.file=%s" % (tmp_path / "loki.yml")], stderr=subprocess.PIPE,
                            text=True)
    try:
        url = "http://127.0.0.1:%d" % port
        wait_ready(url + "/ready")
        now = time.time_ns()
        assert push(url, [{"stream": {"node": "gpu01", "transport": "syslog", "syslog_identifier": "kernel"},
                           "values": [[str(now), "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x"]]}])[0] == 204
        time.sleep(2.5)
        assert received == []
        assert json.loads(call(url + "/prometheus/api/v1/alerts")[1])["data"]["alerts"] == []
        assert push(url, [{"stream": {"node": "gpu01", "transport": "kernel", "syslog_identifier": "kernel"},
                           "values": [[str(now), "NVRM: Xid (PCI:0000:86:00): 79, pid=1, name=x"]]}])[0] == 204
        deadline = time.time() + 10
        while not received and time.time() < deadline:
            time.sleep(0.2)
        path, (alert,) = received[0]
        assert path == "/api/v2/alerts" and alert["labels"]["pci"] == "0000:86:00"
        (listed,) = json.loads(call(url + "/prometheus/api/v1/alerts")[1])["data"]["alerts"]
        assert listed["state"] == "firing" and listed["labels"]["alertname"] == "HpcobsGpuXidKernelLogCritical"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        receiver.shutdown()


def _ca_and_server_cert(directory: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA of its own and a certificate for 127.0.0.1 signed by it (the real openssl), as (ca, cert, key)."""
    directory.mkdir()
    run = lambda *args: subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "ca.key",
        "-out", "ca.crt", "-days", "2", "-subj", "/CN=%s" % name)
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "server.key", "-out",
        "server.csr", "-subj", "/CN=am")
    (directory / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out",
        "server.crt", "-days", "2", "-extfile", "ext")
    return directory / "ca.crt", directory / "server.crt", directory / "server.key"


@pytest.mark.parametrize("client,ok,message", [
    ({"basic_auth_username": "hpcobs", "basic_auth_password": "pw"}, True, ""),
    ({"tls_ca_path": "CA", "basic_auth_username": "hpcobs", "basic_auth_password": "pw"}, True, ""),
    ({"tls_ca_path": "CA", "basic_auth_username": "hpcobs", "tls_server_name": "am"}, False, "not implemented"),
    ({"tls_ca_path": "CA", "tls_cipher_suites": "TLS_AES_128_GCM_SHA256"}, False, "not implemented"),
    ({"tls_min_version": "TLS12"}, False, "unknown TLS version"),
    ({"tls_min_version": "VersionTLS13"}, True, ""),
    ({"tls_cert_path": "/x.crt"}, False, "tls_cert_path and tls_key_path go together"),
    ({"basic_auth_passwd": "pw"}, False, "field basic_auth_passwd not found"),
    ({"tls_insecure_skip_verify": "no"}, False, "into bool"),
])
def test_verify_config_of_the_alertmanager_client(client, ok, message):
    errors = loki.verify_config(mutate(("ruler", "alertmanager_client"), client))
    assert (errors == []) if ok else any(message in error for error in errors), errors


def test_the_notifier_presents_the_client_settings_over_https(tmp_path):
    """ruler.alertmanager_client as Loki's ruler uses it: the CA of tls_ca_path verifies the Alertmanager (another
    CA fails the handshake and nothing is sent), basic_auth_* are sent (over the URL's user info)."""
    import http.server
    import ssl
    import threading
    ca, cert, key = _ca_and_server_cert(tmp_path / "site", "site CA")
    other_ca, _, _ = _ca_and_server_cert(tmp_path / "other", "another CA")
    received = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            received.append((self.path, self.headers.get("Authorization"),
                             json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = "https://ruler:urlpw@127.0.0.1:%d/" % server.server_address[1]
    alert = {"labels": {"alertname": "X"}, "annotations": {}, "since": time.time_ns()}
    try:
        loki.notify([url], [alert], {"tls_ca_path": str(other_ca), "basic_auth_username": "hpcobs",
                                     "basic_auth_password": "pw"})
        assert received == []
        loki.notify([url], [alert], {"tls_ca_path": str(ca), "basic_auth_username": "hpcobs",
                                     "basic_auth_password": "pw"})
        loki.notify([url], [alert], {"tls_ca_path": str(ca)})
        assert [(path, auth) for path, auth, _ in received] == [
            ("/api/v2/alerts", "Basic aHBjb2JzOnB3"),  # hpcobs:pw, the config over the URL's user info
            ("/api/v2/alerts", "Basic cnVsZXI6dXJscHc=")]  # ruler:urlpw, the URL's
        assert received[0][2][0]["labels"] == {"alertname": "X"}
        # a CA file that cannot be read: nothing is sent (as Loki fails to build the client)
        loki.notify([url], [alert], {"tls_ca_path": str(tmp_path / "missing.crt")})
        assert len(received) == 2
    finally:
        server.shutdown()
