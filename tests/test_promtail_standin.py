"""Unit tests of the Promtail stand-in (molecule/standins/promtail/promtail).

Its check, its relabelling (Prometheus semantics, Promtail's __journal_* labels) and, end to end with the Loki
stand-in, the journal and file targets and the positions file. The journal comes from a fake `journalctl` on PATH
that replays canned entries and honours --after-cursor, so the test runs on any machine (with or without journald).
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.parse

import pytest
import yaml

from test_loki_standin import BASE_CONFIG, LOKI, PROMTAIL, QUICK, call, free_port, load, wait_ready

promtail = load(PROMTAIL, "hpcobs_promtail_standin")

JOURNAL_RELABEL = [
    {"source_labels": ["__journal__transport"], "target_label": "transport"},
    {"source_labels": ["__journal_syslog_identifier"], "target_label": "syslog_identifier"},
    {"source_labels": ["__journal__systemd_unit"], "target_label": "unit"},
    {"source_labels": ["__journal_priority_keyword"], "target_label": "priority"},
    {"source_labels": ["__journal__hostname"], "target_label": "host"},
]


def config_for(loki_url, tmp_path, port):
    return {
        "server": {"http_listen_address": "127.0.0.1", "http_listen_port": port, "grpc_listen_address": "127.0.0.1",
                   "grpc_listen_port": 0},
        "positions": {"filename": str(tmp_path / "positions.yaml"), "sync_period": "1s"},
        "clients": [{"url": loki_url + "/loki/api/v1/push", "batchwait": "200ms",
                     "external_labels": {"node": "gpu01"}}],
        "scrape_configs": [
            {"job_name": "systemd-journal",
             "journal": {"json": False, "max_age": "12h", "labels": {"job": "systemd-journal"}},
             "relabel_configs": json.loads(json.dumps(JOURNAL_RELABEL))},
            {"job_name": "slurm", "static_configs": [{"targets": ["localhost"], "labels": {
                "job": "slurm", "__path__": str(tmp_path / "logs" / "*.log")}}]},
        ],
    }


# ---------------------------------------------------------------------------------------------------- check
def test_check_accepts_a_sound_config(tmp_path):
    assert promtail.check_config(config_for("http://mgmt01:3100", tmp_path, 9080)) == []


# What the real Promtail 3.6.15 accepts and an earlier stand-in refused.
@pytest.mark.parametrize("change", [
    lambda c: c.update(clients=[]),
    lambda c: c.pop("clients"),
    lambda c: c["clients"][0]["external_labels"].update({"bad-name": "x"}),
    lambda c: c["clients"][0].update(backoff_config={"min_period": "1s", "max_period": "30s", "max_retries": 20}),
    lambda c: c["server"].update(grpc_listen_address="127.0.0.1", grpc_listen_port=0, health_check_target=False),
])
def test_check_accepts_what_promtail_accepts(tmp_path, change):
    config = config_for("http://mgmt01:3100", tmp_path, 9080)
    change(config)
    assert promtail.check_config(config) == []


# What the real Promtail 3.6.15 rejects, with its wording (strict YAML decoding into its config structs).
@pytest.mark.parametrize("change,message", [
    (lambda c: c.update(bogus=1), "field bogus not found in type config.Config"),
    (lambda c: c["server"].update(foo=1), "field foo not found in type server.Config"),
    (lambda c: c["clients"][0].update(backoff_config={"max_retrie": 3}), "field max_retrie not found in type backoff.Config"),
    (lambda c: c["clients"][0].update(batch_wait="1s"), "field batch_wait not found in type client.Config"),
    (lambda c: c["clients"][0].update(tls_config={"ca_fil": "/x"}), "field ca_fil not found in type config.TLSConfig"),
    (lambda c: c["positions"].update(filname="/x"), "field filname not found in type positions.Config"),
    (lambda c: c["scrape_configs"][1]["static_configs"][0].update(label={}), "field label not found in type targetgroup.Group"),
    (lambda c: c["scrape_configs"][0]["relabel_configs"][0].update(target="x"), "field target not found in type relabel.Config"),
    (lambda c: c["scrape_configs"][0].update(journals={}), "field journals not found in type scrapeconfig.Config"),
    (lambda c: c["clients"][0].update(batchsize="1MB"), "cannot unmarshal !!str `1MB` into int"),
    (lambda c: c["clients"][0].update(url="mgmt01:3100"), "must be an http(s) URL"),
    (lambda c: c["scrape_configs"].append(dict(c["scrape_configs"][1])), "multiple scrape configs"),
    (lambda c: c["scrape_configs"][0]["relabel_configs"].append({"action": "rewrite"}), "unknown relabel action"),
    (lambda c: c["scrape_configs"][0]["relabel_configs"].append({"source_labels": ["a"]}), "requires 'target_label'"),
    (lambda c: c["scrape_configs"][0]["relabel_configs"].append({"regex": "(", "target_label": "a"}), "invalid regex"),
    (lambda c: c["scrape_configs"][0]["journal"].update(max_age="twelve hours"), "invalid duration"),
    (lambda c: c["scrape_configs"][0]["journal"].update(since="1h"),
     "field since not found in type scrapeconfig.JournalTargetConfig"),
    (lambda c: c["scrape_configs"][1].pop("static_configs"), "no target kind"),
    (lambda c: c["server"].update(http_listen_port="9080"), "cannot unmarshal !!str `9080` into int"),
])
def test_check_rejects(tmp_path, change, message):
    config = config_for("http://mgmt01:3100", tmp_path, 9080)
    change(config)
    errors = promtail.check_config(config)
    assert any(message in error for error in errors), errors


def test_check_syntax_cli(tmp_path):
    path = tmp_path / "promtail.yml"
    path.write_text(yaml.safe_dump(config_for("http://mgmt01:3100", tmp_path, 9080)))
    ok = subprocess.run([str(PROMTAIL), "-config.file=%s" % path, "-check-syntax"], capture_output=True, text=True)
    assert ok.returncode == 0 and "Valid config file" in ok.stdout
    path.write_text(path.read_text().replace("target_label: unit", "target_labels: unit"))
    bad = subprocess.run([str(PROMTAIL), "-config.file=%s" % path, "-check-syntax"], capture_output=True, text=True)
    assert bad.returncode == 1 and "field target_labels not found" in bad.stderr


# ------------------------------------------------------------------------------------------------ relabelling
KERNEL_ENTRY = {"__CURSOR": "c1", "__REALTIME_TIMESTAMP": "1700000000000000", "_TRANSPORT": "kernel",
                "SYSLOG_IDENTIFIER": "kernel", "PRIORITY": "3", "_HOSTNAME": "gpu01", "SYSLOG_FACILITY": "0",
                "MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."}


def test_journal_fields_become_promtail_labels():
    labels = promtail.journal_labels(KERNEL_ENTRY)
    assert labels["__journal__transport"] == "kernel"
    assert labels["__journal_syslog_identifier"] == "kernel"
    assert labels["__journal_priority"] == "3"
    assert labels["__journal_priority_keyword"] == "error"
    assert "__journal___cursor" not in labels and "__journal___realtime_timestamp" not in labels


def test_relabel_applies_the_role_contract():
    labels = promtail.relabel({"job": "systemd-journal", **promtail.journal_labels(KERNEL_ENTRY)}, JOURNAL_RELABEL)
    assert promtail.public(labels) == {"job": "systemd-journal", "transport": "kernel", "host": "gpu01",
                                       "syslog_identifier": "kernel", "priority": "error"}


@pytest.mark.parametrize("rules,expected", [
    ([{"source_labels": ["a"], "regex": "x(.*)", "target_label": "b", "replacement": "y$1"}], {"a": "xz", "b": "yz"}),
    ([{"source_labels": ["missing"], "target_label": "a"}], {}),  # empty result deletes the label
    ([{"source_labels": ["a"], "regex": "xz", "action": "keep"}], {"a": "xz"}),
    ([{"source_labels": ["a"], "regex": "no", "action": "keep"}], None),
    ([{"source_labels": ["a"], "regex": "x.*", "action": "drop"}], None),
    ([{"regex": "a", "action": "labeldrop"}], {}),
    ([{"regex": "(a)", "replacement": "copy_$1", "action": "labelmap"}], {"a": "xz", "copy_a": "xz"}),
    ([{"source_labels": ["a"], "target_label": "up", "action": "uppercase"}], {"a": "xz", "up": "XZ"}),
])
def test_relabel_semantics(rules, expected):
    assert promtail.relabel({"a": "xz"}, rules) == expected


# ----------------------------------------------------------------------------------------- end to end (fake)
FAKE_JOURNALCTL = '''#!%s
"""Test double of journalctl -o json --follow: replays entries.json, honours --after-cursor, then waits."""
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "argv.log"), "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
entries = [json.loads(line) for line in open(os.path.join(here, "entries.json"))]
after = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--after-cursor=")]
if after:
    cursors = [e["__CURSOR"] for e in entries]
    entries = entries[cursors.index(after[0]) + 1:]
for entry in entries:
    print(json.dumps(entry), flush=True)
while True:
    time.sleep(1)
''' % sys.executable


def entry(cursor, message, **fields):
    base = {"__CURSOR": cursor, "__REALTIME_TIMESTAMP": str(time.time_ns() // 1000), "_HOSTNAME": "gpu01",
            "_TRANSPORT": "syslog", "SYSLOG_IDENTIFIER": "slurmd", "PRIORITY": "6", "MESSAGE": message}
    base.update(fields)
    return json.dumps(base) + "\n"


def query(loki_url, logql):
    # from 2020 on: the canned kernel entry carries a fixed timestamp of 2023
    params = urllib.parse.urlencode({"query": logql, "start": "1577836800000000000", "direction": "forward"})
    return json.loads(call(loki_url + "/loki/api/v1/query_range?" + params)[1])["data"]["result"]


def wait_for(check, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail("condition not met within %ss" % timeout)


def without_loki_labels(labels):
    return {k: v for k, v in labels.items() if k not in ("service_name", "detected_level")}


def test_journal_and_files_reach_loki_and_positions_survive_a_restart(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "journalctl"
    fake.write_text(FAKE_JOURNALCTL)
    fake.chmod(0o755)
    journal = bin_dir / "entries.json"
    journal.write_text(json.dumps(KERNEL_ENTRY) + "\n" + entry("c2", "slurmd started", _SYSTEMD_UNIT="slurmd.service"))
    (tmp_path / "logs").mkdir()
    slurm_log = tmp_path / "logs" / "slurmd.log"
    slurm_log.write_text("first line\nsecond line\n")

    loki_port, promtail_port = free_port(), free_port()
    loki_config = tmp_path / "loki.yml"
    loki_config.write_text(yaml.safe_dump(dict(BASE_CONFIG, server={"http_listen_address": "127.0.0.1",
                                                                    "http_listen_port": loki_port,
                                                                    "grpc_listen_address": "127.0.0.1",
                                                                    "grpc_listen_port": free_port()},
                                               common={"path_prefix": str(tmp_path / "loki")}, ruler={},
                                               ingester={"lifecycler": QUICK})))
    promtail_config = tmp_path / "promtail.yml"
    loki_url = "http://127.0.0.1:%d" % loki_port
    promtail_config.write_text(yaml.safe_dump(config_for(loki_url, tmp_path, promtail_port)))
    env = {"PATH": "%s:/usr/bin:/bin" % bin_dir}
    procs = [subprocess.Popen([str(LOKI), "-config.file=%s" % loki_config], stderr=subprocess.DEVNULL)]

    def start_promtail():
        proc = subprocess.Popen([sys.executable, str(PROMTAIL), "-config.file=%s" % promtail_config], env=env,
                                stderr=open(tmp_path / "promtail.log", "a"))
        procs.append(proc)
        wait_ready("http://127.0.0.1:%d/ready" % promtail_port)
        return proc

    try:
        wait_ready(loki_url + "/ready")
        first = start_promtail()
        kernel = wait_for(lambda: query(loki_url, '{syslog_identifier="kernel"} |= "NVRM: Xid"'))
        # the labels Promtail sets (Loki adds service_name and detected_level of its own)
        assert without_loki_labels(kernel[0]["stream"]) == {
            "node": "gpu01", "job": "systemd-journal", "transport": "kernel", "syslog_identifier": "kernel",
            "priority": "error", "host": "gpu01"}
        assert kernel[0]["values"][0] == ["1700000000000000000", KERNEL_ENTRY["MESSAGE"]]
        slurmd = wait_for(lambda: query(loki_url, '{unit="slurmd.service"}'))
        assert slurmd[0]["stream"]["priority"] == "info"
        files = wait_for(lambda: query(loki_url, '{job="slurm"}'))
        assert without_loki_labels(files[0]["stream"]) == {"job": "slurm", "node": "gpu01", "filename": str(slurm_log)}
        metrics = call("http://127.0.0.1:%d/metrics" % promtail_port)[1]
        assert "promtail_journal_target_lines_total 2\n" in metrics
        assert [v[1] for v in files[0]["values"]] == ["first line", "second line"]

        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=15) == 0
        positions = yaml.safe_load((tmp_path / "positions.yaml").read_text())["positions"]
        # the real Promtail's key of a journal cursor: "cursor-" + job name
        assert positions == {"cursor-systemd-journal": "c2", str(slurm_log): str(len("first line\nsecond line\n"))}

        with journal.open("a") as handle:
            handle.write(entry("c3", "after the restart"))
        with slurm_log.open("a") as handle:
            handle.write("third line\n")
        start_promtail()
        wait_for(lambda: query(loki_url, '{job="systemd-journal"} |= "after the restart"'))
        wait_for(lambda: len(query(loki_url, '{job="slurm"}')[0]["values"]) == 3)
        # the restart continued from the saved cursor and offset: nothing was sent twice
        argv = [json.loads(line) for line in (bin_dir / "argv.log").read_text().splitlines()]
        assert "--after-cursor=c2" in argv[-1] and not any(a.startswith("--after-cursor") for a in argv[0])
        all_journal = [v[1] for s in query(loki_url, '{job="systemd-journal"}') for v in s["values"]]
        assert sorted(all_journal) == sorted([KERNEL_ENTRY["MESSAGE"], "slurmd started", "after the restart"])
        assert [v[1] for v in query(loki_url, '{job="slurm"}')[0]["values"]] == ["first line", "second line",
                                                                                 "third line"]
        metrics = call("http://127.0.0.1:%d/metrics" % promtail_port)[1]
        assert 'promtail_sent_entries_total{host="127.0.0.1:%d"} 2' % loki_port in metrics
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=15)


DENIED_JOURNALCTL = """#!/bin/sh
echo "No journal files were opened due to insufficient permissions." >&2
exec sleep 3600
"""


def test_an_unreadable_journal_is_ready_and_reads_nothing_like_the_real_one(tmp_path):
    """Real Promtail without the systemd-journal group: /ready 200, journal target "ready", 0 lines read."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "journalctl").write_text(DENIED_JOURNALCTL)
    (bin_dir / "journalctl").chmod(0o755)
    port = free_port()
    config = config_for("http://127.0.0.1:9", tmp_path, port)
    config["scrape_configs"] = config["scrape_configs"][:1]
    path = tmp_path / "promtail.yml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([sys.executable, str(PROMTAIL), "-config.file=%s" % path],
                            env={"PATH": "%s:/usr/bin:/bin" % bin_dir}, stderr=subprocess.DEVNULL)
    try:
        wait_ready("http://127.0.0.1:%d/ready" % port)
        time.sleep(1)
        metrics = call("http://127.0.0.1:%d/metrics" % port)[1]
        assert "promtail_journal_target_lines_total 0\n" in metrics
        assert call("http://127.0.0.1:%d/ready" % port)[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


def test_grpc_port_0_is_a_random_port_on_the_configured_address(tmp_path):
    """Real Promtail always starts its gRPC server; port 0 picks a free port (on every address by default)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "journalctl").write_text(DENIED_JOURNALCTL)
    (bin_dir / "journalctl").chmod(0o755)
    port = free_port()
    config = config_for("http://127.0.0.1:9", tmp_path, port)
    path = tmp_path / "promtail.yml"
    path.write_text(yaml.safe_dump(config))
    log = tmp_path / "promtail.log"
    proc = subprocess.Popen([sys.executable, str(PROMTAIL), "-config.file=%s" % path],
                            env={"PATH": "%s:/usr/bin:/bin" % bin_dir}, stderr=log.open("w"))
    try:
        wait_ready("http://127.0.0.1:%d/ready" % port)
        line = next(line for line in log.read_text().splitlines() if "server listening on addresses" in line)
        host, grpc_port = json.loads(line.split("grpc=")[1].split()[0]).rsplit(":", 1)
        assert host == "127.0.0.1" and int(grpc_port) > 0
        import socket
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", int(grpc_port))) == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


# ---------------------------------------------------------------------------------------------------- client TLS
def test_the_client_verifies_the_server_against_its_ca_file_and_sends_the_password_file(tmp_path):
    """tls_config.ca_file and basic_auth.password_file as the role writes them under hpcobs_security: a server whose
    certificate the CA signed gets the push with the password read from the file; against another CA the handshake
    fails and nothing is sent."""
    import base64
    import ssl
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    standin = sys.modules["standin"]

    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path)

    for name in ("ca", "other"):
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
                "-subj", "/CN=%s" % name, "-keyout", name + ".key", "-out", name + ".crt")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=loki",
            "-keyout", "server.key", "-out", "server.csr")
    (tmp_path / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1",
            "-extfile", "ext", "-out", "server.crt")
    seen = []

    class Loki(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.headers.get("Authorization"))
            self.send_response(204)
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Loki)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "password").write_text("s3cret-from-the-file\n")
    url = "https://127.0.0.1:%d/loki/api/v1/push" % server.server_port
    entries, stopping = [({"job": "x"}, 1, "line")], threading.Event()
    try:
        def client(ca):
            return standin.Client({"url": url, "basic_auth": {"username": "gpu01",
                                                              "password_file": str(tmp_path / "password")},
                                   "tls_config": {"ca_file": str(tmp_path / ca)}, "backoff_config": {"max_retries": 0}})
        good = client("ca.crt")
        good.push(entries, stopping)
        assert good.sent == 1
        assert seen == ["Basic " + base64.b64encode(b"gpu01:s3cret-from-the-file").decode()]
        wrong = client("other.crt")
        wrong.push(entries, stopping)
        assert wrong.sent == 0 and len(seen) == 1
        with pytest.raises(OSError):
            client("missing.crt")
    finally:
        server.shutdown()
