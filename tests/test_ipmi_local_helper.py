"""The ipmi_exporter role's local BMC helper (roles/ipmi_exporter/files/ipmi_exporter-local): its allow-list is the
privilege boundary between the unprivileged exporter and FreeIPMI running as uid 0, so every rule is pinned here.
The client and server are run for real: the server against stand-in FreeIPMI tools in a temporary directory."""
import importlib.machinery
import importlib.util
import json
import os
import socket
import stat
import subprocess
import sys
import threading

import pytest

HELPER = os.path.join(os.path.dirname(__file__), "..", "roles", "ipmi_exporter", "files", "ipmi_exporter-local")


def load():
    loader = importlib.machinery.SourceFileLoader("ipmi_exporter_local", HELPER)
    spec = importlib.util.spec_from_loader("ipmi_exporter_local", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


helper = load()

# What ipmi_exporter 1.10.1 executes for each collector (seen with --log.level=debug), without --config-file.
EXPORTER_CALLS = [
    ("ipmimonitoring", ["--quiet-cache", "--ignore-unrecognized-events", "--comma-separated-output",
                        "--no-header-output", "--sdr-cache-recreate", "--output-event-bitmask",
                        "--output-sensor-state"]),
    ("bmc-info", []),
    ("ipmi-chassis", ["--get-chassis-status"]),
    ("ipmi-dcmi", ["--get-system-power-statistics"]),
    ("ipmi-sel", ["--info"]),
    ("ipmi-sel", ["--quiet-cache", "--comma-separated-output", "--no-header-output", "--sdr-cache-recreate",
                  "--output-event-state", "--interpret-oem-data", "--entity-sensor-names"]),
    ("bmc-watchdog", ["--get"]),
    ("ipmi-raw", ["0x0", "0x30", "0x70", "0x0c", "0"]),
]


@pytest.mark.parametrize("tool,flags", EXPORTER_CALLS)
def test_every_exporter_call_is_allowed(tool, flags):
    assert helper.check(tool, flags) is None


@pytest.mark.parametrize("tool,flags", [
    ("ipmi-chassis", ["--chassis-control=power-down"]),
    ("ipmi-chassis", ["--get-chassis-status", "--chassis-control=hard-reset"]),
    ("ipmi-raw", ["0x00", "0x02", "0x02"]),
    ("ipmi-raw", ["0x0", "0x30", "0x70", "0x0c", "1"]),
    ("bmc-info", ["-h", "bmc.example"]),
    ("ipmimonitoring", ["--config-file", "/etc/shadow"]),
    ("ipmimonitoring", ["--sdr-cache-directory=/etc"]),
    ("ipmi-sel", ["--clear"]),
    ("bmc-watchdog", ["--set", "--stop-timer"]),
    ("ipmi-sensors", []),
    ("ipmi-config", ["--commit"]),
    ("../../bin/sh", ["-c", "id"]),
    (None, []),
    ("bmc-info", "not-a-list"),
    ("bmc-info", [1]),
])
def test_anything_else_is_refused(tool, flags):
    assert helper.check(tool, flags)


def run_server(tmp_path, request):
    """Run the server mode as a subprocess with stand-in tools that print their arguments."""
    sbin = tmp_path / "sbin"
    sbin.mkdir()
    for tool in ("ipmimonitoring", "bmc-info", "ipmi-raw"):
        path = sbin / tool
        path.write_text("#!/bin/sh\necho \"%s $*\"\nexit 3\n" % tool)
        path.chmod(0o755)
    code = open(HELPER).read().replace('SBIN = "/usr/sbin"', 'SBIN = %r' % str(sbin))
    code = code.replace('DEVICES = ("/dev/ipmi0", "/dev/ipmi/0", "/dev/ipmidev/0")', 'DEVICES = (%r,)'
                        % str(tmp_path / "ipmi0"))
    script = tmp_path / "helper.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script), "serve", str(tmp_path / "cache")], input=request,
                         capture_output=True, timeout=30, check=True)
    return json.loads(out.stdout)


def test_server_runs_the_tool_through_the_openipmi_driver(tmp_path):
    answer = run_server(tmp_path, json.dumps({"tool": "ipmimonitoring", "flags": ["--quiet-cache"]}).encode() + b"\n")
    assert answer["rc"] == 3
    first = answer["output"].splitlines()[0]
    assert first == "ipmimonitoring --driver-type=OPENIPMI --sdr-cache-directory=%s --quiet-cache" % (tmp_path / "cache")
    assert "this host has no IPMI device" in answer["output"]


def test_server_refuses_and_runs_nothing(tmp_path):
    answer = run_server(tmp_path, json.dumps({"tool": "ipmi-raw", "flags": ["0x00", "0x02", "0x02"]}).encode() + b"\n")
    assert answer["rc"] == 2
    assert "refused" in answer["output"] and "ipmi-raw 0x00" not in answer["output"].split("refused")[0]


def test_server_rejects_garbage(tmp_path):
    assert run_server(tmp_path, b"\x00\xffnot json\n")["rc"] == 2


def test_client_drains_the_settings_fifo_and_relays_the_answer(tmp_path):
    fifo = tmp_path / "ipmi_exporter-0123456789abcdef0123456789abcdef"
    os.mkfifo(fifo)
    sock_path = str(tmp_path / "s.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path)
    server.listen(1)
    received = {}

    def serve_once():
        conn, _ = server.accept()
        data = b""
        while not data.endswith(b"\n"):
            data += conn.recv(4096)
        received.update(json.loads(data))
        conn.sendall(json.dumps({"rc": 0, "output": "1,Fan1A,Fan,Nominal,4800.00,RPM,'OK'\n"}).encode())
        conn.close()

    def write_settings():
        with open(fifo, "w") as handle:  # what ipmi_exporter's writer does: blocks until a reader opens
            handle.write("password must-not-travel\n")

    threads = [threading.Thread(target=serve_once), threading.Thread(target=write_settings)]
    for thread in threads:
        thread.start()
    out = subprocess.run([sys.executable, HELPER, "client", sock_path, "ipmimonitoring", "--quiet-cache",
                          "--config-file", str(fifo)], capture_output=True, text=True, timeout=30)
    for thread in threads:
        thread.join(10)
    server.close()
    assert out.returncode == 0, out.stderr
    assert out.stdout == "1,Fan1A,Fan,Nominal,4800.00,RPM,'OK'\n"
    assert received == {"tool": "ipmimonitoring", "flags": ["--quiet-cache"]}
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_client_refuses_before_connecting(tmp_path):
    fifo = tmp_path / "settings"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: open(fifo, "w").close())
    writer.start()
    out = subprocess.run([sys.executable, HELPER, "client", str(tmp_path / "absent.sock"), "ipmi-chassis",
                          "--chassis-control=power-down", "--config-file", str(fifo)],
                         capture_output=True, text=True, timeout=30)
    writer.join(10)
    assert out.returncode == 2
    assert "refused" in out.stderr
