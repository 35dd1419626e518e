"""Tests for the GPU simulator (roles/lab_gpu_simulator/files: the hpcobs-gpusim launcher and its hpcobs_gpusim
package).

Most tests run the real program as a subprocess on a free loopback port and
scrape it over HTTP; pure functions are unit-tested by importing the package.
"""

import importlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = ROOT / "roles" / "lab_gpu_simulator" / "files"
PROG = FILES / "hpcobs-gpusim"
PACKAGE = FILES / "hpcobs_gpusim"
COUNTERS = ROOT / "roles" / "dcgm_exporter" / "files" / "hpcobs-counters.csv"
DATA = Path(__file__).resolve().parent / "data" / "gpusim"
# Run the program under another interpreter (e.g. a Python 3.13) by setting
# HPCOBS_GPUSIM_PYTHON; by default its own #!/usr/bin/python3 line is used.
LAUNCH = ([os.environ["HPCOBS_GPUSIM_PYTHON"], str(PROG)]
          if os.environ.get("HPCOBS_GPUSIM_PYTHON") else [str(PROG)])

BASE_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName"]


def _load_module():
    # no bytecode next to the program: the role ships that directory
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    sys.path.insert(0, str(FILES))
    try:
        module = importlib.import_module("hpcobs_gpusim")
    finally:
        sys.path.remove(str(FILES))
        sys.dont_write_bytecode = saved
    return module


gpusim = _load_module()


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


LINE_RE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\} (\S+)$")
LABEL_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="([^"]*)"(?:,|$)')


def parse_labels(text):
    pairs = []
    pos = 0
    while pos < len(text):
        match = LABEL_RE.match(text, pos)
        assert match, "cannot parse labels at %r" % text[pos:]
        pairs.append((match.group(1), match.group(2)))
        pos = match.end()
    return pairs


class Exposition:
    """A parsed /metrics body, checked for dcgm-exporter's layout."""

    def __init__(self, body):
        self.body = body
        self.help = {}
        self.type = {}
        self.samples = []
        self.family_order = []
        current = None
        for line in body.splitlines():
            if line.startswith("# HELP "):
                name, _, text = line[7:].partition(" ")
                assert name not in self.help, "family %s appears twice" % name
                self.help[name] = text
                self.family_order.append(name)
                current = None
            elif line.startswith("# TYPE "):
                name, _, kind = line[7:].partition(" ")
                assert name == self.family_order[-1], "TYPE must follow its HELP"
                self.type[name] = kind
                current = name
            else:
                match = LINE_RE.match(line)
                assert match, "bad sample line %r" % line
                assert match.group(1) == current, "sample outside its family: %r" % line
                self.samples.append({"name": match.group(1),
                                     "pairs": parse_labels(match.group(2)),
                                     "value": match.group(3)})
        for sample in self.samples:
            sample["labels"] = dict(sample["pairs"])

    def select(self, name, **labels):
        out = []
        for sample in self.samples:
            if sample["name"] != name:
                continue
            if all(sample["labels"].get(k) == v for k, v in labels.items()):
                out.append(sample)
        return out

    def value(self, name, **labels):
        found = self.select(name, **labels)
        assert len(found) == 1, "expected one %s %r, got %d" % (name, labels, len(found))
        return float(found[0]["value"])

    def gpus(self):
        return sorted({s["labels"]["gpu"] for s in self.samples}, key=int)


class Sim:
    """One simulator process with its own state and mapping directories."""

    def __init__(self, base, hostname="testnode", gpus=4, csv=COUNTERS, extra=(),
                 mapping=True, env=None, preexec_fn=None, interval_ms=30000, launch=None):
        self.base = Path(base)
        self.launch = list(launch or LAUNCH)
        self.state = self.base / "state"
        self.map = self.base / "map"
        self.kmsg = self.base / "kmsg"
        self.state.mkdir(exist_ok=True)
        if mapping:
            self.map.mkdir(exist_ok=True)
        self.kmsg.touch()
        self.hostname = hostname
        self.port = None
        self.args = ["-f", str(csv), "-c", str(interval_ms),
                     "--sim-state-dir", str(self.state), "--sim-hostname", hostname,
                     "--sim-gpus", str(gpus)]
        if mapping:
            self.args += ["--hpc-job-mapping-dir", str(self.map)]
        self.args += list(extra)
        self.env = dict(os.environ)
        self.env.pop("DCGM_HPC_JOB_MAPPING_DIR", None)
        self.env.pop("NODE_NAME", None)
        self.env.pop("DCGM_EXPORTER_WEB_CONFIG_FILE", None)
        self.env["HPCOBS_GPUSIM_CONFIG"] = "none"    # never read the host's config
        self.env["HPCOBS_GPUSIM_KMSG"] = str(self.kmsg)
        self.env.update(env or {})
        self.preexec_fn = preexec_fn
        self.proc = None
        self.stderr_path = self.base / "stderr.log"

    def start(self, wait=True):
        self.port = free_port()
        self._stderr = open(self.stderr_path, "ab")
        self.proc = subprocess.Popen(self.launch + ["-a", "127.0.0.1:%d" % self.port] + self.args,
                                     env=self.env, stdout=subprocess.DEVNULL,
                                     stderr=self._stderr, preexec_fn=self.preexec_fn)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("simulator exited with %s: %s"
                                     % (self.proc.returncode, self.stderr_text()))
            try:
                status, body = self.get("/health")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("simulator did not become ready: " + self.stderr_text())

    def stderr_text(self):
        try:
            return self.stderr_path.read_text()
        except OSError:
            return ""

    def get(self, path):
        url = "http://127.0.0.1:%d%s" % (self.port, path)
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status, resp.read().decode("utf-8")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode("utf-8")

    def scrape(self):
        status, body = self.get("/metrics")
        assert status == 200, "scrape failed with %s: %s" % (status, body)
        return Exposition(body)

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_stderr", None):
            self._stderr.close()
            self._stderr = None

    def restart(self, sig=signal.SIGTERM):
        self.stop(sig)
        return self.start()

    def fault(self, *args, check=True, env=None):
        run_env = dict(self.env)
        run_env.update(env or {})
        cmd = LAUNCH + ["fault"] + list(args)
        if args and args[0] in ("set", "clear", "list"):
            cmd += ["--sim-state-dir", str(self.state), "--sim-hostname", self.hostname]
        result = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=30)
        if check:
            assert result.returncode == 0, result.stderr + result.stdout
        return result


@pytest.fixture
def make_sim(tmp_path):
    started = []

    def factory(name="sim", **kwargs):
        base = tmp_path / name
        base.mkdir(exist_ok=True)
        sim = Sim(base, **kwargs)
        started.append(sim)
        return sim

    yield factory
    for sim in started:
        sim.stop(signal.SIGKILL)


@pytest.fixture
def sim(make_sim):
    return make_sim().start()


def csv_rows(path):
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        rows.append([part.strip() for part in line.split(",", 2)])
    return rows


# ---------------------------------------------------------------------------
# documentation and command line
# ---------------------------------------------------------------------------


def test_help_documents_flags_faults_and_mapping():
    out = subprocess.run(LAUNCH + ["--help"], capture_output=True, text=True, check=True).stdout
    for flag in ("--collectors", "--address", "--hpc-job-mapping-dir", "--collect-interval",
                 "--sim-gpus", "--sim-mig", "--sim-config", "--sim-state-dir",
                 "--sim-hostname", "--kubernetes", "--remote-hostengine-info",
                 "--web-config-file", "Ignored dcgm-exporter flags"):
        assert flag in out, flag
    fault_help = subprocess.run(LAUNCH + ["fault", "--help"], capture_output=True,
                                text=True, check=True).stdout
    for kind in ("ecc-dbe", "thermal", "xid", "hang", "power", "pcie", "offbus", "clear"):
        assert kind in fault_help, kind
    doc = gpusim.__doc__
    for topic in ("JOB MAPPING", "FAULTS", "/dev/kmsg", "logger -t kernel", "systemd-journal-remote",
                  "_TRANSPORT=kernel", "HTTP 500", "WEB CONFIG", "WWW-Authenticate: Basic", "python3-bcrypt"):
        assert topic in doc, topic


def test_shebang_and_stdlib_only():
    text = PROG.read_text()
    assert text.startswith("#!/usr/bin/python3\n")
    assert os.access(PROG, os.X_OK)
    stdlib = set(sys.stdlib_module_names)
    sources = [PROG] + sorted(PACKAGE.glob("*.py"))
    assert len(sources) > 5, sources
    found = set()
    for source in sources:
        # absolute imports only: the package's own modules import each other relatively ("from .x import")
        imported = set(re.findall(r"^\s*(?:from|import) ([A-Za-z_][A-Za-z0-9_]*)", source.read_text(), re.M))
        # the web config alone needs PyYAML and bcrypt (Debian python3-yaml, python3-bcrypt), imported on demand
        optional = {"yaml", "bcrypt"} if source.name == "webconfig.py" else set()
        assert imported <= stdlib | {"hpcobs_gpusim"} | optional, (source.name, imported - stdlib)
        found |= imported
    assert len(found) > 10, found


def test_go_style_and_ignored_flags_are_accepted(make_sim):
    extra = ["--kubernetes", "-r", "localhost:5555",
             "-d", "f", "--xid-count-window-size=300000", "-use-old-namespace",
             "-rbmn", "--no-hostname=false", "--enable-pprof"]
    s = make_sim(extra=extra).start()
    m = s.scrape()
    sample = m.select("DCGM_FI_DEV_GPU_TEMP", gpu="0")[0]
    keys = [k for k, _ in sample["pairs"]]
    assert keys[:2] == ["gpu", "uuid"], keys          # -use-old-namespace honoured
    assert sample["labels"]["modelName"] == "NVIDIA-H100-80GB-HBM3"  # -rbmn honoured
    assert sample["labels"]["Hostname"] == "testnode"


def test_no_hostname_flag_omits_label(make_sim):
    s = make_sim(extra=["-n"]).start()
    for sample in s.scrape().samples:
        assert "Hostname" not in sample["labels"]


def test_mapping_dir_from_environment(make_sim, tmp_path):
    mapdir = tmp_path / "envmap"
    mapdir.mkdir()
    (mapdir / "1").write_text("4242\n")
    s = make_sim(mapping=False, env={"DCGM_HPC_JOB_MAPPING_DIR": str(mapdir)}).start()
    m = s.scrape()
    jobs = [x["labels"].get("hpc_job") for x in m.select("DCGM_FI_DEV_GPU_UTIL", gpu="1")]
    assert jobs == ["4242"]


def test_config_file_supplies_hardware(make_sim, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"gpus": 2, "model": "NVIDIA A100-SXM4-80GB",
                               "driver_version": "535.216.03"}))
    s = make_sim(env={"HPCOBS_GPUSIM_CONFIG": str(cfg)})
    idx = s.args.index("--sim-gpus")         # the GPU count must come from the file
    del s.args[idx:idx + 2]
    s.start()
    m = s.scrape()
    assert m.gpus() == ["0", "1"]
    sample = m.select("DCGM_FI_DEV_SM_CLOCK", gpu="1")[0]["labels"]
    assert sample["modelName"] == "NVIDIA A100-SXM4-80GB"
    assert sample["DCGM_FI_DRIVER_VERSION"] == "535.216.03"
    assert m.value("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", gpu="0") == 400.0


def test_config_file_unknown_key_is_an_error(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"gpus": 2, "gpu_count": 3}))
    result = subprocess.run(LAUNCH + ["-a", "127.0.0.1:%d" % free_port(), "-f", str(COUNTERS),
                             "--sim-config", str(cfg), "--sim-state-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=20)
    assert result.returncode == 1
    assert "gpu_count" in result.stderr


# ---------------------------------------------------------------------------
# output format
# ---------------------------------------------------------------------------


def test_format_help_type_labels_and_order(sim):
    m = sim.scrape()
    rows = csv_rows(COUNTERS)
    metric_rows = [r for r in rows if r[1] != "label"]
    label_rows = [r[0] for r in rows if r[1] == "label"]
    assert label_rows == ["DCGM_FI_DRIVER_VERSION"]
    # exactly the CSV's metric fields, each with its CSV help and type, in DCGM field-id order (as dcgm-exporter:
    # its template walks a map keyed by counter, field id first), whatever the CSV order
    assert m.family_order == sorted((r[0] for r in metric_rows), key=lambda n: (gpusim.FIELD_IDS[n], n))
    for name, kind, help_text in metric_rows:
        assert m.help[name] == help_text
        assert m.type[name] == kind
        assert "# HELP %s %s\n# TYPE %s %s\n" % (name, help_text, name, kind) in m.body
    # every series: base labels in dcgm-exporter's order, then Hostname, the label rows
    for sample in m.samples:
        keys = [k for k, _ in sample["pairs"]]
        expected = BASE_LABELS + ["Hostname", "DCGM_FI_DRIVER_VERSION"]
        if sample["name"] == "DCGM_FI_DEV_XID_ERRORS":
            expected += ["err_code", "err_msg"]
        assert keys == expected, (sample["name"], keys)
        labels = sample["labels"]
        assert labels["device"] == "nvidia" + labels["gpu"]
        assert labels["modelName"] == "NVIDIA H100 80GB HBM3"
        assert labels["Hostname"] == "testnode"
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                            labels["UUID"])
        assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:00\.0", labels["pci_bus_id"])
    assert m.gpus() == ["0", "1", "2", "3"]
    # every metric family has one series per GPU
    for name in m.family_order:
        assert sorted(s["labels"]["gpu"] for s in m.select(name)) == ["0", "1", "2", "3"], name


def test_number_formatting(sim):
    m = sim.scrape()
    for sample in m.samples:
        ftype = gpusim.FIELD_TYPES[sample["name"]]
        if ftype == "d":
            assert re.fullmatch(r"-?\d+\.\d{6}", sample["value"]), sample
        else:
            assert re.fullmatch(r"-?\d+", sample["value"]), sample
    assert m.select("DCGM_FI_DEV_POWER_USAGE")[0]["value"].count(".") == 1
    xid = m.select("DCGM_FI_DEV_XID_ERRORS", gpu="0")[0]
    assert xid["value"] == "0"
    assert xid["labels"]["err_code"] == "0" and xid["labels"]["err_msg"] == "No Error"


def test_only_csv_fields_are_served(make_sim):
    csv_path = DATA / "three-fields.csv"
    s = make_sim(csv=csv_path).start()
    m = s.scrape()
    assert m.family_order == ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
                              "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    assert m.help["DCGM_FI_DEV_GPU_TEMP"] == "temperature, quoted comma"
    assert m.type["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    for sample in m.samples:
        assert "DCGM_FI_DRIVER_VERSION" not in sample["labels"]
        assert [k for k, _ in sample["pairs"]] == BASE_LABELS + ["Hostname"]


def test_unknown_field_stops_startup(tmp_path):
    csv_path = tmp_path / "bad.csv"
    csv_path.write_text("DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_NO_SUCH_FIELD, gauge, x\n")
    result = subprocess.run(LAUNCH + ["-a", "127.0.0.1:%d" % free_port(), "-f", str(csv_path),
                             "--sim-state-dir", str(tmp_path / "st"), "--sim-gpus", "1"],
                            capture_output=True, text=True, timeout=20,
                            env={**os.environ, "HPCOBS_GPUSIM_CONFIG": "none"})
    assert result.returncode == 1
    assert "could not find DCGM field" in result.stderr
    assert "DCGM_FI_DEV_NO_SUCH_FIELD" in result.stderr


def test_csv_parser_rules():
    text = ("# comment, with commas\n\n"
            "DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock\n"
            "DCGM_FI_DEV_DEC_UTIL ,     gauge, Decoder\n"
            "DCGM_FI_DRIVER_VERSION, label, Driver\n")
    counters = gpusim.parse_counters_csv(text)
    assert [(c.name, c.prom_type, c.help) for c in counters] == [
        ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock"),
        ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder"),
        ("DCGM_FI_DRIVER_VERSION", "label", "Driver")]
    bad = {
        "DCGM_FI_DEV_SM_CLOCK, gauge\n": "expected 3 fields",
        "DCGM_FI_DEV_SM_CLOCK, gauge, a, b\n": "expected 3 fields",
        "DCGM_FI_DEV_SM_CLOCK, gaugy, a\n": "Prometheus metric type 'gaugy'",
        "DCGM_FI_NOPE, gauge, a\n": "unknown ExporterCounter field 'DCGM_FI_NOPE'",
        "DCGM_FI_DEV_SM_CLOCK, gauge, a\nDCGM_FI_DEV_SM_CLOCK, gauge, b\n": "twice",
        "DCGM_EXP_XID_ERRORS_COUNTXXX, gauge, a\n": "could not find DCGM field",
        "DCGM_FI_DEV_FAN_SPEED, gaugy, a\n": "Prometheus metric type 'gaugy'",
    }
    for text, message in bad.items():
        with pytest.raises(gpusim.CsvError, match=re.escape(message)):
            gpusim.parse_counters_csv(text)


def test_canonical_csv_fields_are_all_simulated_and_cover_the_rules():
    rows = csv_rows(COUNTERS)
    names = [r[0] for r in rows]
    assert len(names) == len(set(names))
    for name, kind, help_text in rows:
        assert name in gpusim.FIELD_TYPES, name
        assert kind in ("gauge", "counter", "label"), (name, kind)
        assert help_text and "," not in help_text
    needed = {
        "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_POWER_VIOLATION",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_PCIE_LINK_GEN", "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DRIVER_VERSION",
    }
    assert needed <= set(names), needed - set(names)
    types = {r[0]: r[1] for r in rows}
    assert types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    assert types["DCGM_FI_DEV_XID_ERRORS"] == "gauge"
    assert types["DCGM_FI_DRIVER_VERSION"] == "label"


def test_identity_is_stable_per_host_and_gpu(make_sim):
    a = make_sim("a", hostname="node-a").start()
    ids_a = {s["labels"]["gpu"]: (s["labels"]["UUID"], s["labels"]["pci_bus_id"])
             for s in a.scrape().select("DCGM_FI_DEV_GPU_TEMP")}
    a.restart()
    ids_a2 = {s["labels"]["gpu"]: (s["labels"]["UUID"], s["labels"]["pci_bus_id"])
              for s in a.scrape().select("DCGM_FI_DEV_GPU_TEMP")}
    assert ids_a == ids_a2
    b = make_sim("b", hostname="node-b").start()
    ids_b = {s["labels"]["gpu"]: (s["labels"]["UUID"], s["labels"]["pci_bus_id"])
             for s in b.scrape().select("DCGM_FI_DEV_GPU_TEMP")}
    assert {u for u, _ in ids_a.values()}.isdisjoint({u for u, _ in ids_b.values()})
    assert len({p for _, p in ids_a.values()}) == 4           # distinct bus per GPU
    buses = [int(ids_a[str(i)][1].split(":")[1], 16) for i in range(4)]
    assert buses == sorted(buses)                              # enumeration order
    # pure functions agree with the served labels
    assert gpusim.gpu_uuid("node-a", 2) == ids_a["2"][0]
    assert gpusim.gpu_pci_bus_id("node-a", 2) == ids_a["2"][1]
    assert gpusim.gpu_uuid("node-a", 2) != gpusim.gpu_uuid("node-a", 3)
    assert gpusim.kernel_pci_id("00000000:3B:00.0") == "0000:3b:00"


@pytest.mark.parametrize("emulate", [None, "4.7", "4.8", "main", "4.4.2-4.7.1"])
def test_http_endpoints(make_sim, emulate):
    sim = make_sim(extra=["--emulate", emulate] if emulate else []).start()
    with urllib.request.urlopen("http://127.0.0.1:%d/health" % sim.port) as resp:
        status, body, registry = resp.status, resp.read().decode(), resp.headers["X-Registry-Available"]
    if emulate in ("4.7", "4.4.2-4.7.1"):
        assert (status, body, registry) == (200, "KO", None)   # dcgm-exporter up to 4.7.x
    else:
        assert (status, body, registry) == (200, "OK", "true")  # 4.8.x and later (the default: the newest)
    status, body = sim.get("/")
    assert status == 200 and "/metrics" in body
    status, body = sim.get("/nope")
    assert status == 404
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % sim.port) as resp:
        assert resp.headers["Content-Type"] == "text/plain; charset=utf-8"
        assert resp.headers["X-Content-Type-Options"] == "nosniff"


def test_listen_address_parsing():
    assert gpusim.parse_listen_address(":9400") == ("", 9400)
    assert gpusim.parse_listen_address("127.0.0.1:9401") == ("127.0.0.1", 9401)
    assert gpusim.parse_listen_address("[::1]:9402") == ("::1", 9402)
    for bad in ("9400", "::1:9400", "host:port", "[::1]9400", "h:70000"):
        with pytest.raises(gpusim.ConfigError):
            gpusim.parse_listen_address(bad)


# ---------------------------------------------------------------------------
# values move plausibly
# ---------------------------------------------------------------------------


def test_busy_and_idle_values(sim):
    (sim.map / "1").write_text("777\n")
    m = sim.scrape()
    limit = m.value("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", gpu="1")
    busy_power = m.value("DCGM_FI_DEV_POWER_USAGE", gpu="1")
    idle_power = m.value("DCGM_FI_DEV_POWER_USAGE", gpu="0")
    assert 0.8 * limit < busy_power < limit
    assert idle_power < 0.2 * limit
    assert m.value("DCGM_FI_DEV_GPU_UTIL", gpu="1") >= 85
    assert m.value("DCGM_FI_DEV_GPU_UTIL", gpu="0") == 0
    used = m.value("DCGM_FI_DEV_FB_USED", gpu="1")
    free = m.value("DCGM_FI_DEV_FB_FREE", gpu="1")
    assert used > 0.6 * (used + free)
    assert m.value("DCGM_FI_DEV_FB_USED", gpu="0") == 0
    assert m.value("DCGM_FI_DEV_SM_CLOCK", gpu="1") > 3 * m.value("DCGM_FI_DEV_SM_CLOCK", gpu="0")
    assert m.value("DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu="1") > 0.8
    # the job leaves: the GPU idles again on the next scrape
    (sim.map / "1").write_text("")
    m = sim.scrape()
    assert m.value("DCGM_FI_DEV_GPU_UTIL", gpu="1") == 0
    assert m.value("DCGM_FI_DEV_POWER_USAGE", gpu="1") < 0.2 * limit


def test_power_noise_and_energy_integration(sim):
    (sim.map / "0").write_text("1\n")
    powers, energies = [], []
    for _ in range(6):
        m = sim.scrape()
        powers.append(m.value("DCGM_FI_DEV_POWER_USAGE", gpu="0"))
        energies.append(m.value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="0"))
        time.sleep(0.1)
    assert len(set(powers)) > 1                                   # noisy
    assert all(b > a for a, b in zip(energies, energies[1:]))      # monotonic
    # ~0.5 s at ~600 W is ~300 J = 300000 mJ; allow generous bounds
    gained = energies[-1] - energies[0]
    assert 0.3 * 600 * 1000 * 0.5 < gained < 3 * 700 * 1000 * 0.8


def test_temperature_follows_power_with_lag():
    sim_obj = gpusim.Simulator({"hostname": "unit", "model": gpusim.DEFAULT_MODEL,
                                "driver_version": "550.127.05", "gpus": 1, "mig": {},
                                "busy_gpus": [], "seed": 1})
    empty = gpusim.empty_faults()
    t0 = 1000.0
    sim_obj.tick(t0, {}, empty)
    idle_temp = sim_obj.gpus[0].temp
    sim_obj.tick(t0 + 1.0, {"0": ["job"]}, empty)
    one_second = sim_obj.gpus[0].temp
    for step in range(2, 200):
        sim_obj.tick(t0 + step, {"0": ["job"]}, empty)
    settled = sim_obj.gpus[0].temp
    assert idle_temp < one_second < settled
    assert one_second - idle_temp < 0.25 * (settled - idle_temp)   # it lags
    assert 65 < settled < 85
    assert idle_temp < 40


# ---------------------------------------------------------------------------
# job mapping
# ---------------------------------------------------------------------------


def jobs_by_gpu(m, name="DCGM_FI_DEV_GPU_TEMP"):
    out = {}
    for sample in m.select(name):
        out.setdefault(sample["labels"]["gpu"], []).append(sample["labels"].get("hpc_job"))
    return out


def test_mapping_valid_names_multi_job_and_empty_file(sim):
    (sim.map / "0").write_text("101\n")
    (sim.map / "1").write_text("11\n12\n")
    (sim.map / "2").write_text("")
    m = sim.scrape()
    jobs = jobs_by_gpu(m)
    assert jobs == {"0": ["101"], "1": ["11", "12"], "2": [None], "3": [None]}
    # every family is copied per job, with hpc_job as the last label
    for name in m.family_order:
        assert [s["labels"].get("hpc_job") for s in m.select(name, gpu="1")] == ["11", "12"]
        for sample in m.select(name, gpu="1"):
            assert sample["pairs"][-1][0] == "hpc_job"
    # the copies carry identical values
    values = {s["value"] for s in m.select("DCGM_FI_DEV_POWER_USAGE", gpu="1")}
    assert len(values) == 1


def test_mapping_is_read_on_every_scrape(sim):
    assert jobs_by_gpu(sim.scrape())["0"] == [None]
    (sim.map / "0").write_text("1\n")
    assert jobs_by_gpu(sim.scrape())["0"] == ["1"]
    (sim.map / "0").write_text("1\n2\n")
    assert jobs_by_gpu(sim.scrape())["0"] == ["1", "2"]
    (sim.map / "0").unlink()
    assert jobs_by_gpu(sim.scrape())["0"] == [None]


def test_mapping_ignores_junk_names_and_directories(sim):
    for name in ("foo", "0.txt", "1e5", "+1", "-2", ".5", "1.2.3", "NaN", "01", "0 ", "٣",
                 ".hidden-tmp-0"):
        (sim.map / name).write_text("999\n")
    (sim.map / "2").mkdir()                        # a directory named like a GPU
    (sim.map / "2" / "x").write_text("999\n")
    m = sim.scrape()
    assert all(s["labels"].get("hpc_job") is None for s in m.samples)
    assert m.gpus() == ["0", "1", "2", "3"]


def test_mapping_file_for_missing_gpu_is_ignored(sim):
    (sim.map / "7").write_text("555\n")
    (sim.map / "3.1").write_text("556\n")          # GPU 3 has no MIG instances
    m = sim.scrape()
    assert all("hpc_job" not in s["labels"] for s in m.samples)
    assert m.gpus() == ["0", "1", "2", "3"]


def test_mapping_duplicates_are_deduplicated_in_order(sim):
    (sim.map / "0").write_text("5\n6\n5\n7\n6\n")
    m = sim.scrape()
    assert jobs_by_gpu(m)["0"] == ["5", "6", "7"]
    assert len(m.select("DCGM_FI_DEV_FB_USED", gpu="0")) == 3


def test_mapping_line_handling_matches_go_scanner():
    split = gpusim.split_job_lines
    assert split(b"") == []
    assert split(b"1") == ["1"]
    assert split(b"1\n2\n") == ["1", "2"]
    assert split(b"1\r\n2\r\n") == ["1", "2"]
    assert split(b"1\n\n2\n") == ["1", "", "2"]    # blank line = empty job id (upstream)
    assert split(b" 1 \n") == [" 1 "]              # not trimmed (upstream)
    assert split(b"3\n3\n3") == ["3"]
    with pytest.raises(gpusim.MappingError):
        split(b"x" * 70000)
    assert gpusim.is_mapping_name("12") and gpusim.is_mapping_name("3.10")
    for name in ("", "1.", ".1", "1.2.3", "a", "1\n", "١", "1e5"):
        assert not gpusim.is_mapping_name(name), name


def test_mapping_crlf_file(sim):
    (sim.map / "0").write_bytes(b"77\r\n78\r\n")
    assert jobs_by_gpu(sim.scrape())["0"] == ["77", "78"]


def test_missing_mapping_dir_is_ignored_then_picked_up(make_sim):
    s = make_sim(mapping=False)
    s.args += ["--hpc-job-mapping-dir", str(s.base / "later")]
    s.start()
    m = s.scrape()
    assert all("hpc_job" not in x["labels"] for x in m.samples)
    assert "not found" in s.stderr_text()
    (s.base / "later").mkdir()
    (s.base / "later" / "2").write_text("31337\n")
    assert jobs_by_gpu(s.scrape())["2"] == ["31337"]


@pytest.mark.parametrize("kind", ["dangling-symlink", "symlink-to-dir", "fifo"])
def test_unreadable_mapping_file_fails_scrape(sim, kind):
    (sim.map / "0").write_text("1\n")
    target = sim.map / "1"
    if kind == "dangling-symlink":
        target.symlink_to(sim.base / "does-not-exist")
    elif kind == "symlink-to-dir":
        (sim.base / "adir").mkdir()
        target.symlink_to(sim.base / "adir")
    else:
        os.mkfifo(target)
    status, body = sim.get("/metrics")
    assert status == 500
    assert body == "internal server error\n"
    target.unlink()
    assert sim.get("/metrics")[0] == 200


def _others_can_traverse(path):
    """True when every directory from / down to path is searchable by any user."""
    path = Path(path).resolve()
    return all(os.stat(part).st_mode & stat.S_IXOTH for part in [path, *path.parents])


def test_unreadable_mapping_file_permission_denied(make_sim):
    """A file the service user may not read fails the scrape (as for EACCES upstream).

    The simulator runs as nobody when the tests run as root, so it must not be started from the checkout: the
    checkout may lie below a directory only root can enter (/root is 0700). The program and its counters file are
    copied into a fresh directory that nobody can reach, whatever TMPDIR is.
    """
    parent = tempfile.gettempdir()
    if not _others_can_traverse(parent):
        parent = "/var/tmp"
    base = Path(tempfile.mkdtemp(prefix="gpusim-perm-", dir=parent))
    try:
        os.chmod(base, 0o755)
        assert _others_can_traverse(base), "%s is not reachable by an unprivileged user" % base
        prog = base / "hpcobs-gpusim"
        csv = base / "counters.csv"
        shutil.copy(PROG, prog)
        shutil.copytree(PACKAGE, base / "hpcobs_gpusim", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(COUNTERS, csv)
        os.chmod(prog, 0o755)
        os.chmod(csv, 0o644)
        preexec = None
        if os.geteuid() == 0:
            def preexec():
                os.setgid(65534)
                os.setgroups([])
                os.setuid(65534)
        launch = [LAUNCH[0], str(prog)] if len(LAUNCH) == 2 else [str(prog)]
        s = Sim(base, csv=csv, preexec_fn=preexec, launch=launch)
        os.chmod(s.state, 0o777)
        os.chmod(s.kmsg, 0o666)
        os.chmod(s.base, 0o777)
        (s.map / "0").write_text("1\n")
        secret = s.map / "1"
        secret.write_text("2\n")
        os.chmod(secret, 0)
        s.start()
        try:
            status, body = s.get("/metrics")
            assert status == 500 and body == "internal server error\n"
            os.chmod(secret, 0o644)
            m = s.scrape()
            assert jobs_by_gpu(m)["1"] == ["2"]
        finally:
            s.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_mapping_dir_that_is_a_file_fails_scrape(make_sim):
    s = make_sim(mapping=False)
    (s.base / "afile").write_text("x")
    s.args += ["--hpc-job-mapping-dir", str(s.base / "afile")]
    s.start()
    assert s.get("/metrics")[0] == 500


def test_mig_layout_labels_and_mapping(make_sim):
    s = make_sim(extra=["--sim-mig", "0:2"]).start()
    m = s.scrape()
    gpu0 = m.select("DCGM_FI_DEV_FB_USED", gpu="0")
    assert [(x["labels"]["GPU_I_PROFILE"], x["labels"]["GPU_I_ID"]) for x in gpu0] == \
        [("3g.40gb", "1"), ("3g.40gb", "2")]
    keys = [k for k, _ in gpu0[0]["pairs"]]
    assert keys == BASE_LABELS + ["GPU_I_PROFILE", "GPU_I_ID", "Hostname",
                                  "DCGM_FI_DRIVER_VERSION"]
    # MIG instances report no device utilization; whole GPUs do
    assert m.select("DCGM_FI_DEV_GPU_UTIL", gpu="0") == []
    assert len(m.select("DCGM_FI_DEV_GPU_UTIL", gpu="1")) == 1
    # instance totals add up to less than the GPU
    total = sum(float(x["value"]) for x in m.select("DCGM_FI_DEV_FB_FREE", gpu="0"))
    assert 0 < total <= 81559
    # mapping: <gpu>.<GPU_I_ID> names an instance; the whole-GPU file is ignored
    (s.map / "0.2").write_text("9001\n")
    (s.map / "0").write_text("9999\n")
    (s.map / "0.5").write_text("9998\n")           # no such instance
    m = s.scrape()
    by_gi = {x["labels"]["GPU_I_ID"]: x["labels"].get("hpc_job")
             for x in m.select("DCGM_FI_DEV_FB_USED", gpu="0")}
    assert by_gi == {"1": None, "2": "9001"}
    assert m.value("DCGM_FI_DEV_FB_USED", gpu="0", GPU_I_ID="2") > 0
    assert m.value("DCGM_FI_DEV_FB_USED", gpu="0", GPU_I_ID="1") == 0
    assert m.value("DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu="0", GPU_I_ID="2") > 0.8
    # like newer dcgm-exporter releases, files that match no instance are reported
    warnings = [line for line in s.stderr_text().splitlines() if "does not match" in line]
    assert any('mapping_file="0.5"' in line for line in warnings)
    assert any('mapping_file="0"' in line for line in warnings)
    assert not any('mapping_file="0.2"' in line for line in warnings)


def test_mig_layouts_unit():
    spec = gpusim.model_spec(gpusim.DEFAULT_MODEL)
    seven = gpusim.build_mig_instances(7, spec)
    assert [i.profile for i in seven] == ["1g.10gb"] * 7
    assert len({i.gi_id for i in seven}) == 7
    one = gpusim.build_mig_instances(1, spec)
    assert [(i.profile, i.gi_id) for i in one] == [("7g.80gb", 0)]
    mixed = gpusim.build_mig_instances(["3g.40gb", "2g.20gb", "2g.20gb"], spec)
    assert [i.gi_id for i in mixed] == [1, 3, 4]
    with pytest.raises(gpusim.ConfigError):
        gpusim.build_mig_instances(["4g.40gb", "4g.40gb"], spec)
    with pytest.raises(gpusim.ConfigError):
        gpusim.build_mig_instances(2, gpusim.model_spec("NVIDIA L40S"))
    assert gpusim.parse_mig_spec("0:2,1:3g.40gb+2g.20gb") == {0: 2, 1: ["3g.40gb", "2g.20gb"]}
    assert gpusim.normalize_mig({"3": 2}) == {3: 2}


# ---------------------------------------------------------------------------
# faults
# ---------------------------------------------------------------------------


def test_fault_ecc_dbe_grows_and_clear_resets(sim):
    m = sim.scrape()
    assert m.value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="1") == 0
    sim.fault("set", "--gpu", "1", "ecc-dbe", "--rate", "20")
    first = sim.scrape().value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="1")
    time.sleep(0.3)
    m = sim.scrape()
    second = m.value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="1")
    assert 1 <= first < second
    assert m.value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="0") == 0
    listed = json.loads(sim.fault("list", "--json").stdout)
    assert listed["1"]["ecc-dbe"]["rate"] == 20
    sim.fault("clear", "--gpu", "1")
    assert sim.scrape().value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="1") == 0
    assert json.loads(sim.fault("list", "--json").stdout) == {}


def test_fault_thermal(sim):
    before = sim.scrape()
    assert before.value("DCGM_FI_DEV_GPU_TEMP", gpu="2") < 60
    sim.fault("set", "--gpu", "2", "thermal")
    a = sim.scrape()
    time.sleep(0.2)
    b = sim.scrape()
    assert b.value("DCGM_FI_DEV_GPU_TEMP", gpu="2") >= 88
    assert b.value("DCGM_FI_DEV_MEMORY_TEMP", gpu="2") >= 95
    v1 = a.value("DCGM_FI_DEV_THERMAL_VIOLATION", gpu="2")
    v2 = b.value("DCGM_FI_DEV_THERMAL_VIOLATION", gpu="2")
    assert 0 < v1 < v2
    assert v2 - v1 >= 0.15e9                      # real time, in ns
    assert b.value("DCGM_FI_DEV_THERMAL_VIOLATION", gpu="0") == 0
    assert b.value("DCGM_FI_DEV_GPU_TEMP", gpu="0") < 60
    sim.fault("clear", "--gpu", "2", "thermal")
    c = sim.scrape()
    assert c.value("DCGM_FI_DEV_GPU_TEMP", gpu="2") < 60
    # throttle time is a counter since boot: it stays
    assert c.value("DCGM_FI_DEV_THERMAL_VIOLATION", gpu="2") >= v2


def test_fault_xid_metric_and_kernel_line(sim):
    sim.fault("set", "--gpu", "0", "xid", "--code", "79")
    m = sim.scrape()
    sample = m.select("DCGM_FI_DEV_XID_ERRORS", gpu="0")[0]
    assert sample["value"] == "79"
    assert sample["labels"]["err_code"] == "79"
    assert sample["labels"]["err_msg"] == "GPU has fallen off the bus"
    assert m.value("DCGM_FI_DEV_XID_ERRORS", gpu="1") == 0
    bus = sample["labels"]["pci_bus_id"].split(":")[1].lower()
    line = sim.kmsg.read_text()
    assert line == ("<11>kernel: NVRM: Xid (PCI:0000:%s:00): 79, pid='<unknown>', "
                    "name=<unknown>, GPU has fallen off the bus.\n" % bus)
    sim.fault("set", "--gpu", "3", "xid", "--code", "48")
    bus3 = m.select("DCGM_FI_DEV_XID_ERRORS", gpu="3")[0]["labels"]["pci_bus_id"]
    second = sim.kmsg.read_text().splitlines()[1]
    assert second.startswith("<11>kernel: NVRM: Xid (PCI:0000:%s:00): 48, "
                             % bus3.split(":")[1].lower())
    assert "double bit error (DBE)" in second
    sim.fault("set", "--gpu", "2", "xid", "--code", "13", "--pid", "4321", "--process", "train.py")
    third = sim.kmsg.read_text().splitlines()[2]
    assert ": 13, pid=4321, name=train.py, Graphics SM Warp Exception" in third
    m = sim.scrape()
    assert m.value("DCGM_FI_DEV_XID_ERRORS", gpu="3") == 48
    xid3 = m.select("DCGM_FI_DEV_XID_ERRORS", gpu="3")[0]["labels"]
    assert xid3["err_msg"] == "Double Bit ECC Error"
    sim.fault("clear", "--gpu", "0")
    assert sim.scrape().value("DCGM_FI_DEV_XID_ERRORS", gpu="0") == 0


def test_fault_xid_via_logger_fallback(sim, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "logger-args"
    fake = bindir / "logger"
    fake.write_text("#!/bin/sh\nprintf '%%s\\n' \"$@\" > %s\n" % record)
    fake.chmod(0o755)
    env = {"PATH": "%s:%s" % (bindir, os.environ.get("PATH", "")),
           "HPCOBS_GPUSIM_KMSG": str(tmp_path / "no-such-dir" / "kmsg"),
           "HPCOBS_GPUSIM_JOURNAL_REMOTE": str(tmp_path / "no-such-dir" / "systemd-journal-remote")}
    result = sim.fault("set", "--gpu", "1", "xid", "--code", "79", env=env)
    assert "[logger]" in result.stdout
    # auto warns: a logger line carries _TRANSPORT=syslog, which the Loki XID rules ignore
    assert "the Loki XID rules ignore" in result.stderr
    args = record.read_text().splitlines()
    assert args[:5] == ["-t", "kernel", "-p", "kern.err", "--"]
    assert args[5].startswith("NVRM: Xid (PCI:0000:") and args[5].endswith(
        "79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    forced = sim.fault("set", "--gpu", "1", "xid", "--code", "31", "--journal", "none")
    assert "[none]" in forced.stdout


def fake_journal_remote(tmp_path):
    """A systemd-journal-remote that records its arguments and the export stream it was given."""
    fake = tmp_path / "systemd-journal-remote"
    fake.write_text("#!/bin/sh\nprintf '%%s\\n' \"$@\" > %s/args\ncat > %s/export\n" % (tmp_path, tmp_path))
    fake.chmod(0o755)
    return fake


def parse_export(data):
    """[{field: value}] of a journal export stream (text and binary fields)."""
    entries, entry, pos = [], {}, 0
    while pos < len(data):
        end = data.index(b"\n", pos)
        line = data[pos:end]
        pos = end + 1
        if not line:
            entries.append(entry)
            entry = {}
        elif b"=" in line:
            name, _, value = line.partition(b"=")
            entry[name.decode()] = value.decode()
        else:
            size = int.from_bytes(data[pos:pos + 8], "little")
            entry[line.decode()] = data[pos + 8:pos + 8 + size].decode()
            pos += 8 + size + 1
    return entries


def test_fault_xid_via_journal_remote_is_a_kernel_transport_entry(sim, tmp_path):
    fake = fake_journal_remote(tmp_path)
    journal = tmp_path / "journal" / "0123456789abcdef0123456789abcdef"
    env = {"HPCOBS_GPUSIM_KMSG": str(tmp_path / "no-such-dir" / "kmsg"), "HPCOBS_GPUSIM_JOURNAL_REMOTE": str(fake),
           "HPCOBS_GPUSIM_JOURNAL_DIR": str(journal)}
    result = sim.fault("set", "--gpu", "1", "xid", "--code", "79", env=env)
    assert "[journal-remote]" in result.stdout
    assert (tmp_path / "args").read_text().splitlines() == [
        "--split-mode=none", "--output=%s/hpcobs-gpusim-kernel.journal" % journal, "-"]
    assert journal.is_dir()
    (entry,) = parse_export((tmp_path / "export").read_bytes())
    assert (entry["_TRANSPORT"], entry["SYSLOG_IDENTIFIER"], entry["SYSLOG_FACILITY"], entry["PRIORITY"]) == (
        "kernel", "kernel", "0", "3")
    assert entry["MESSAGE"].startswith("NVRM: Xid (PCI:0000:") and entry["MESSAGE"].endswith(
        "79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    assert abs(int(entry["__REALTIME_TIMESTAMP"]) / 1e6 - time.time()) < 60
    assert int(entry["__MONOTONIC_TIMESTAMP"]) > 0 and entry["_HOSTNAME"] == os.uname().nodename
    # forced: fails clearly when the program is missing, and auto takes it when /dev/kmsg is not writable
    missing = dict(env, HPCOBS_GPUSIM_JOURNAL_REMOTE=str(tmp_path / "none"))
    failed = sim.fault("set", "--gpu", "1", "xid", "--code", "79", "--journal", "journal-remote", env=missing,
                       check=False)
    assert failed.returncode == 1 and "install the Debian package systemd-journal-remote" in failed.stderr


def test_kernel_export_entry_uses_the_binary_form_for_a_newline():
    data = gpusim.faults.kernel_export_entry("a\nb", now_ns=5 * 10 ** 9, monotonic_ns=7 * 10 ** 9)
    (entry,) = parse_export(data)
    assert entry["MESSAGE"] == "a\nb" and entry["__REALTIME_TIMESTAMP"] == "5000000"
    assert entry["__MONOTONIC_TIMESTAMP"] == "7000000" and entry["_TRANSPORT"] == "kernel"


def test_fault_hang(sim):
    (sim.map / "1").write_text("50\n")
    sim.fault("set", "--gpu", "1", "hang")
    sim.fault("set", "--gpu", "2", "hang")        # hung with no job either
    m = sim.scrape()
    for gpu in ("1", "2"):
        assert m.value("DCGM_FI_DEV_GPU_UTIL", gpu=gpu) <= 1
        used = m.value("DCGM_FI_DEV_FB_USED", gpu=gpu)
        free = m.value("DCGM_FI_DEV_FB_FREE", gpu=gpu)
        assert used > 0.8 * (used + free)
    assert m.value("DCGM_FI_DEV_FB_USED", gpu="0") == 0
    sim.fault("clear", "--gpu", "1", "hang")
    assert sim.scrape().value("DCGM_FI_DEV_GPU_UTIL", gpu="1") >= 85


def test_fault_power(sim):
    sim.fault("set", "--gpu", "3", "power")
    a = sim.scrape()
    time.sleep(0.2)
    b = sim.scrape()
    limit = b.value("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", gpu="3")
    assert b.value("DCGM_FI_DEV_POWER_USAGE", gpu="3") > limit
    assert b.value("DCGM_FI_DEV_POWER_USAGE", gpu="0") < limit
    v1 = a.value("DCGM_FI_DEV_POWER_VIOLATION", gpu="3")
    v2 = b.value("DCGM_FI_DEV_POWER_VIOLATION", gpu="3")
    assert v2 > v1 > 0
    assert b.value("DCGM_FI_DEV_POWER_VIOLATION", gpu="0") == 0


def test_fault_pcie(sim):
    sim.fault("set", "--gpu", "0", "pcie")
    m = sim.scrape()
    assert m.value("DCGM_FI_DEV_PCIE_LINK_WIDTH", gpu="0") == 8
    assert m.value("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", gpu="0") == 16
    assert m.value("DCGM_FI_DEV_PCIE_LINK_WIDTH", gpu="1") == 16
    assert m.value("DCGM_FI_DEV_PCIE_LINK_GEN", gpu="0") == 5
    assert m.value("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", gpu="0") == 5
    sim.fault("clear")
    assert sim.scrape().value("DCGM_FI_DEV_PCIE_LINK_WIDTH", gpu="0") == 16


def test_fault_offbus(sim):
    (sim.map / "2").write_text("66\n")
    bus = sim.scrape().select("DCGM_FI_DEV_GPU_TEMP", gpu="2")[0]["labels"]["pci_bus_id"]
    result = sim.fault("set", "--gpu", "2", "offbus")
    assert "GPU has fallen off the bus." in result.stdout
    m = sim.scrape()
    assert m.gpus() == ["0", "1", "3"]
    assert all(s["labels"]["gpu"] != "2" for s in m.samples)
    assert all(s["labels"].get("hpc_job") != "66" for s in m.samples)
    assert sim.kmsg.read_text() == ("<11>kernel: NVRM: Xid (PCI:0000:%s:00): 79, "
                                    "pid='<unknown>', name=<unknown>, GPU has fallen off the "
                                    "bus.\n" % bus.split(":")[1].lower())
    sim.fault("set", "--gpu", "2", "clear")       # "clear" as a kind
    assert sim.scrape().gpus() == ["0", "1", "2", "3"]


def test_fault_nvlink_and_row_remap(sim):
    sim.fault("set", "--gpu", "1", "nvlink", "--rate", "100")
    sim.fault("set", "--gpu", "1", "row-remap", "--rate", "50")
    sim.fault("set", "--gpu", "2", "row-remap-failure")
    sim.scrape()
    time.sleep(0.2)
    m = sim.scrape()
    assert m.value("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", gpu="1") > 0
    assert m.value("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", gpu="1") > 0
    assert m.value("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", gpu="0") == 0
    rows = m.value("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", gpu="1")
    assert rows >= 2
    assert m.value("DCGM_FI_DEV_ROW_REMAP_PENDING", gpu="1") == 1
    assert m.value("DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="2") == 1
    assert m.value("DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="1") == 0
    sim.fault("clear")
    m = sim.scrape()
    # remapped rows are permanent; the pending flag and failure go with the reset
    assert m.value("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", gpu="1") >= rows
    assert m.value("DCGM_FI_DEV_ROW_REMAP_PENDING", gpu="1") == 0
    assert m.value("DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="2") == 0


def test_faults_survive_restart_and_file_is_world_readable(sim):
    sim.fault("set", "--gpu", "1", "thermal")
    sim.fault("set", "--gpu", "3", "pcie")
    path = sim.state / "faults.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert set(json.loads(path.read_text())["faults"]) == {"1", "3"}
    before = sim.scrape().value("DCGM_FI_DEV_THERMAL_VIOLATION", gpu="1")
    sim.restart()
    m = sim.scrape()
    assert m.value("DCGM_FI_DEV_GPU_TEMP", gpu="1") >= 88
    assert m.value("DCGM_FI_DEV_PCIE_LINK_WIDTH", gpu="3") == 8
    assert m.value("DCGM_FI_DEV_THERMAL_VIOLATION", gpu="1") > before
    assert "thermal" in sim.fault("list").stdout
    # no temp files left behind by the atomic writes
    assert not [p for p in sim.state.iterdir() if p.name.endswith(".tmp")]


def test_fault_cli_validation(sim):
    assert sim.fault("set", "--gpu", "9", "thermal", check=False).returncode == 2
    assert sim.fault("set", "--gpu", "0", "xid", check=False).returncode == 2
    assert sim.fault("set", "--gpu", "0", "melt", check=False).returncode == 2
    assert sim.fault("set", "--gpu", "0", "ecc-dbe", "--rate", "0", check=False).returncode == 2
    assert sim.fault("list").stdout.strip() == "no active faults"


def test_energy_monotonic_across_restarts(sim):
    (sim.map / "0").write_text("8\n")
    e1 = sim.scrape().value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="0")
    time.sleep(0.2)
    e2 = sim.scrape().value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="0")
    assert e2 > e1
    sim.restart()                                  # clean stop (SIGTERM)
    e3 = sim.scrape().value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="0")
    assert e3 > e2
    time.sleep(0.1)
    e4 = sim.scrape().value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="0")
    sim.restart(signal.SIGKILL)                    # crash: nothing saved at exit
    e5 = sim.scrape().value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="0")
    assert e5 > e4 > e3
    saved = json.loads((sim.state / "state.json").read_text())
    assert len(saved["gpus"]) == 4


# ---------------------------------------------------------------------------
# dcgm-exporter releases (--emulate), field order, tolerant counters CSV
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("emulate,label", [("4.7", "Hostname"), ("4.8", "Hostname"), ("main", "hostname"),
                                           (None, "Hostname")])
def test_emulate_host_label(make_sim, emulate, label):
    s = make_sim(extra=["--emulate", emulate] if emulate else []).start()
    for sample in s.scrape().samples:
        keys = [k for k, _ in sample["pairs"]]
        assert keys[5] == label and sample["labels"][label] == "testnode", keys
        assert {"Hostname", "hostname"} - {label} <= {"Hostname", "hostname"} - set(keys)


def test_emulate_choices_and_release_names():
    resolve = gpusim.resolve_emulation
    assert gpusim.DEFAULT_EMULATION == "4.8"
    assert resolve("4.4.2-4.7.1").name == "4.7" and resolve("3.3.9-3.6.1").name == "4.7"
    assert resolve("4.5.3-4.8.2").name == "4.8" and resolve("4.8.0").name == "4.8"
    assert resolve("main").hostname_label == "hostname"
    assert resolve("4.8").health_headers == (("X-Registry-Available", "true"),)
    for bad in ("4.9.0", "latest", "", "4", "4.8.2-"):
        with pytest.raises(gpusim.ConfigError):
            resolve(bad)


def test_emulate_bad_value_stops_startup(tmp_path):
    result = subprocess.run(LAUNCH + ["-a", "127.0.0.1:%d" % free_port(), "-f", str(COUNTERS),
                             "--sim-state-dir", str(tmp_path), "--emulate", "5.0"],
                            capture_output=True, text=True, timeout=20,
                            env={**os.environ, "HPCOBS_GPUSIM_CONFIG": "none"})
    assert result.returncode == 1 and "emulate must be one of" in result.stderr


def test_families_in_field_id_order_whatever_the_csv_order(make_sim, tmp_path):
    csv_path = tmp_path / "reversed.csv"
    csv_path.write_text("DCGM_FI_PROF_DRAM_ACTIVE, gauge, d\nDCGM_FI_DEV_XID_ERRORS, gauge, x\n"
                        "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DRIVER_VERSION, label, v\n"
                        "DCGM_FI_DEV_SM_CLOCK, gauge, c\n")
    m = make_sim(csv=csv_path).start().scrape()
    assert m.family_order == ["DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS",
                              "DCGM_FI_PROF_DRAM_ACTIVE"]                      # ids 100, 150, 230, 1005
    assert [gpusim.FIELD_IDS[n] for n in m.family_order] == [100, 150, 230, 1005]


def test_csv_exporter_and_unsimulated_rows_are_skipped_with_a_warning():
    warnings = []
    counters = gpusim.parse_counters_csv(
        "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_EXP_XID_ERRORS_COUNT, gauge, x\nDCGM_EXP_P2P_STATUS, counter, p\n"
        "DCGM_FI_DEV_FAN_SPEED, gauge, fan\nDCGM_FI_DEV_NVLINK_BANDWIDTH_L0, counter, legacy name\n",
        warn=warnings.append)
    assert [c.name for c in counters] == ["DCGM_FI_DEV_GPU_TEMP"]
    assert len(warnings) == 4
    assert "DCGM_EXP_XID_ERRORS_COUNT is computed by dcgm-exporter itself" in warnings[0]
    assert "DCGM_FI_DEV_FAN_SPEED (id 191) is not simulated" in warnings[2]
    assert gpusim.dcgm_field_id("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") == 449    # a legacy name, still valid


def test_csv_with_exporter_and_unsimulated_rows_starts(make_sim, tmp_path):
    csv_path = tmp_path / "mixed.csv"
    csv_path.write_text("DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_EXP_CLOCK_EVENTS_COUNT, gauge, c\n"
                        "DCGM_FI_DEV_FAN_SPEED, gauge, fan\n")
    s = make_sim(csv=csv_path).start()
    assert s.scrape().family_order == ["DCGM_FI_DEV_GPU_TEMP"]
    log = s.stderr_text()
    assert "DCGM_EXP_CLOCK_EVENTS_COUNT" in log and "DCGM_FI_DEV_FAN_SPEED (id 191) is not simulated" in log
    assert "level=WARN" in log


# ---------------------------------------------------------------------------
# counters, XID texts
# ---------------------------------------------------------------------------

CUMULATIVE = ["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
              "DCGM_FI_PROF_PCIE_TX_BYTES_TOTAL", "DCGM_FI_PROF_PCIE_RX_BYTES_TOTAL",
              "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION",
              "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
              "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"]


def test_counters_never_go_down():
    sim_obj = gpusim.Simulator({"hostname": "unit", "model": gpusim.DEFAULT_MODEL,
                                "driver_version": "550.127.05", "gpus": 2, "mig": {0: 2},
                                "busy_gpus": [], "seed": 7})
    faults = gpusim.empty_faults()
    faults["faults"]["1"] = {"nvlink": {"since": 1000.0, "rate": 10}, "thermal": {"since": 1000.0},
                             "pcie": {"since": 1000.0}}
    history = []
    for step in range(60):
        busy = {"0.1": ["7"], "1": ["8"]} if (step // 5) % 2 == 0 else {}   # load comes and goes
        sim_obj.tick(1000.0 + step, busy, faults)
        history.append({(e.key, n): gpusim.render.field_value(n, e)
                        for g in sim_obj.gpus for e in g.entities for n in CUMULATIVE})
    for key in history[0]:
        values = [h[key] for h in history]
        assert all(b >= a for a, b in zip(values, values[1:])), (key, values)
    nvlink = [h[("1", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")] for h in history]
    assert nvlink[4] > nvlink[1] > 0 and nvlink[9] == nvlink[6]     # grows while busy, flat while idle
    for key in ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_THERMAL_VIOLATION"):
        assert history[-1][("1", key)] > history[0][("1", key)]


def test_traffic_counters_persist_across_restarts(sim):
    (sim.map / "0").write_text("9\n")
    a = sim.scrape()
    time.sleep(0.2)
    b = sim.scrape()
    sim.restart()
    c = sim.scrape()
    for gpu in ("0",):
        va, vb, vc = (x.value("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", gpu=gpu) for x in (a, b, c))
        assert va < vb <= vc


def test_xid_texts_are_the_exporters_table():
    texts = gpusim.xid_texts()
    assert sorted(texts) == list(range(173))                     # 0-172, every code of the upstream table
    assert texts[0] == "No Error" and texts[48] == "Double Bit ECC Error"
    assert texts[79] == "GPU has fallen off the bus" and texts[94] == "Contained ECC error"
    assert texts[119] == "GSP RPC Timeout" and texts[154] == "GPU Recovery Action Changed"
    assert texts[172] == "Uncorrectable SRAM Error"
    assert gpusim.xid_name(173) == gpusim.xid_name(999) == "Unknown Error"
    assert all(t and "\t" not in t and '"' not in t for t in texts.values())


def test_xid_err_msg_for_any_code(sim):
    sim.fault("set", "--gpu", "1", "xid", "--code", "140")
    sim.fault("set", "--gpu", "2", "xid", "--code", "500")
    m = sim.scrape()
    assert m.select("DCGM_FI_DEV_XID_ERRORS", gpu="1")[0]["labels"]["err_msg"] == "Unrecovered ECC Error"
    assert m.select("DCGM_FI_DEV_XID_ERRORS", gpu="2")[0]["labels"]["err_msg"] == "Unknown Error"


# ---------------------------------------------------------------------------
# fault rates and hostile fault files
# ---------------------------------------------------------------------------


def test_fault_rate_rejects_inf_nan_and_huge(sim):
    for bad in ("inf", "-inf", "nan", "1e7", "1e309", "-1", "abc"):
        result = sim.fault("set", "--gpu", "0", "ecc-dbe", "--rate", bad, check=False)
        assert result.returncode == 2, (bad, result.stderr)
        assert "rate" in result.stderr
    assert not (sim.state / "faults.json").exists()
    sim.fault("set", "--gpu", "0", "ecc-dbe", "--rate", "1e6")
    assert sim.scrape().value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="0") >= 1
    sim.fault("clear")
    for bad in (float("inf"), float("nan"), 1e6 + 1, 0, True, "5"):
        with pytest.raises(ValueError):
            gpusim.check_rate(bad) if not isinstance(bad, str) else gpusim.check_rate("x" + bad)


HOSTILE = {
    "version": 1,
    "faults": {
        "0": {"ecc-dbe": {"since": 1.0, "rate": float("inf")}, "thermal": {"since": 1.0}},
        "1": {"ecc-sbe": {"since": "yesterday"}, "xid": {"since": 1.0, "code": 5000}, "melt": {"since": 1.0}},
        "2": {"pcie": {"since": 1.0, "rate": 1e300}, "nvlink": {"since": float("nan")}},
        "x": {"thermal": {"since": 1.0}},
        "3": "nonsense",
    },
    "retired": {"0": {"ecc_dbe_agg": "lots", "ecc_sbe_agg": 5}, "9": [1]},
}


def test_sanitize_faults_keeps_only_usable_entries():
    doc, problems = gpusim.sanitize_faults(json.loads(json.dumps(HOSTILE)))
    assert doc["faults"] == {"0": {"thermal": {"since": 1.0}}}
    assert doc["retired"] == {"0": {"ecc_sbe_agg": 5}}
    assert len(problems) == 10, problems
    assert gpusim.sanitize_faults([1, 2])[0] == gpusim.empty_faults()
    doc, problems = gpusim.sanitize_faults({"faults": {"1": {"pcie": {"since": 5, "rate": "2.5"}}}})
    assert doc["faults"]["1"]["pcie"] == {"since": 5.0, "rate": 2.5} and problems == []


def test_hostile_faults_file_does_not_take_metrics_down(sim):
    (sim.state / "faults.json").write_text(json.dumps(HOSTILE))     # inf/nan are written as Infinity/NaN
    m = sim.scrape()
    assert m.value("DCGM_FI_DEV_GPU_TEMP", gpu="0") >= 88                   # the one usable fault applies
    assert m.value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="0") == 0
    assert m.value("DCGM_FI_DEV_PCIE_LINK_WIDTH", gpu="2") == 16
    assert "ignoring unusable faults" in sim.stderr_text()
    listed = sim.fault("list", "--json")
    assert json.loads(listed.stdout) == {"0": {"thermal": {"since": 1.0}}} and "ignored" in listed.stderr
    sim.fault("clear", "--gpu", "1")                                       # repairs the file
    assert gpusim.sanitize_faults(json.loads((sim.state / "faults.json").read_text()))[1] == []
    sim.fault("clear")
    assert sim.scrape().value("DCGM_FI_DEV_GPU_TEMP", gpu="0") < 60


def test_unparsable_faults_file(sim):
    sim.fault("set", "--gpu", "1", "thermal")
    assert sim.scrape().value("DCGM_FI_DEV_GPU_TEMP", gpu="1") >= 88
    (sim.state / "faults.json").write_text("{not json")
    assert sim.scrape().value("DCGM_FI_DEV_GPU_TEMP", gpu="1") >= 88       # keeps the previous faults
    assert sim.fault("list", check=False).returncode == 1
    assert sim.fault("set", "--gpu", "0", "pcie", check=False).returncode == 1
    sim.fault("clear")                                                     # clear-all starts a new file
    assert json.loads(sim.fault("list", "--json").stdout) == {}
    assert sim.scrape().value("DCGM_FI_DEV_GPU_TEMP", gpu="1") < 60


# ---------------------------------------------------------------------------
# --web-config-file (exporter-toolkit's HTTPS and basic auth)
# ---------------------------------------------------------------------------

# PyYAML and bcrypt: the interpreter running the tests has them (requirements.txt); /usr/bin/python3 may not
WEB_LAUNCH = [sys.executable, str(PROG)]
WEB_USER, WEB_PASSWORD = "hpcobs", "s3cret-Passw0rd"


def _openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def web_pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 signed by it, and a second CA the server does not use."""
    d = tmp_path_factory.mktemp("webpki")
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
                 "-subj", "/CN=%s" % ca, "-keyout", ca + ".key", "-out", ca + ".crt", cwd=d)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=127.0.0.1",
             "-keyout", "server.key", "-out", "server.csr", cwd=d)
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-extfile", "ext.cnf", "-out", "server.crt", cwd=d)
    return d


def _bcrypt_hash(password):
    import bcrypt
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


def write_web_config(path, pki, tls=True, users=True, **tls_extra):
    import yaml
    doc = {}
    if tls:
        doc["tls_server_config"] = dict({"cert_file": str(pki / "server.crt"), "key_file": str(pki / "server.key")},
                                        **tls_extra)
    if users:
        doc["basic_auth_users"] = {WEB_USER: _bcrypt_hash(WEB_PASSWORD)}
    Path(path).write_text(yaml.safe_dump(doc))
    return path


def web_get(port, path="/metrics", scheme="https", cafile=None, auth=None, ctx=None):
    """(status, headers, body) of one request; TLS trusting cafile only."""
    import base64
    import ssl
    if scheme == "https" and ctx is None:
        ctx = ssl.create_default_context(cafile=str(cafile))
    request = urllib.request.Request("%s://127.0.0.1:%d%s" % (scheme, port, path))
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(("%s:%s" % auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5, context=ctx if scheme == "https" else None) as resp:
            return resp.status, resp.headers, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read().decode()


def start_web_sim(make_sim, config, name="web"):
    s = make_sim(name=name, extra=["--web-config-file", str(config)], launch=WEB_LAUNCH)
    s.start(wait=False)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert s.proc.poll() is None, s.stderr_text()
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", s.port)) == 0:
                return s
        time.sleep(0.05)
    raise AssertionError("simulator did not listen: " + s.stderr_text())


def run_with_web_config(config, env=None):
    run_env = dict(os.environ, HPCOBS_GPUSIM_CONFIG="none", **(env or {}))
    return subprocess.run(WEB_LAUNCH + ["-a", "127.0.0.1:%d" % free_port(), "-f", str(COUNTERS),
                                        "--sim-state-dir", tempfile.mkdtemp(), "--web-config-file", str(config)],
                          env=run_env, capture_output=True, text=True, timeout=20)


def test_web_config_serves_https_with_basic_auth(make_sim, web_pki, tmp_path):
    import ssl
    s = start_web_sim(make_sim, write_web_config(tmp_path / "web.yml", web_pki))
    ca = web_pki / "ca.crt"
    status, _, body = web_get(s.port, cafile=ca, auth=(WEB_USER, WEB_PASSWORD))
    assert status == 200
    m = Exposition(body)
    assert m.gpus() == ["0", "1", "2", "3"] and m.select("DCGM_FI_DEV_GPU_TEMP")
    assert web_get(s.port, "/health", cafile=ca, auth=(WEB_USER, WEB_PASSWORD))[:1] == (200,)
    # the job mapping still labels the series behind TLS and auth
    (s.map / "2").write_text("777\n")
    _, _, body = web_get(s.port, cafile=ca, auth=(WEB_USER, WEB_PASSWORD))
    assert [x["labels"].get("hpc_job") for x in Exposition(body).select("DCGM_FI_DEV_GPU_TEMP", gpu="2")] == ["777"]
    # no credentials, a wrong password, an unknown user, another scheme: 401 with the challenge, as exporter-toolkit
    for auth in (None, (WEB_USER, "wrong"), ("someone", WEB_PASSWORD), (WEB_USER, "")):
        status, headers, body = web_get(s.port, cafile=ca, auth=auth)
        assert (status, headers["WWW-Authenticate"], body) == (401, "Basic", "Unauthorized\n"), auth
        assert "DCGM_FI" not in body
    # a client that does not trust the site CA fails the handshake; plain HTTP gets no metrics either
    with pytest.raises(urllib.error.URLError) as err:
        web_get(s.port, cafile=web_pki / "other-ca.crt", auth=(WEB_USER, WEB_PASSWORD))
    assert isinstance(err.value.reason, ssl.SSLCertVerificationError)
    with pytest.raises((OSError, http_client_errors())):
        web_get(s.port, scheme="http", auth=(WEB_USER, WEB_PASSWORD))
    assert s.proc.poll() is None          # and the server keeps serving
    assert web_get(s.port, cafile=ca, auth=(WEB_USER, WEB_PASSWORD))[0] == 200


def http_client_errors():
    import http.client
    return http.client.HTTPException


def test_web_config_min_version_is_enforced(make_sim, web_pki, tmp_path):
    import ssl
    s = start_web_sim(make_sim, write_web_config(tmp_path / "web.yml", web_pki, min_version="TLS13"))
    ctx = ssl.create_default_context(cafile=str(web_pki / "ca.crt"))
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(urllib.error.URLError) as err:
        web_get(s.port, ctx=ctx, auth=(WEB_USER, WEB_PASSWORD))
    assert isinstance(err.value.reason, ssl.SSLError)
    ctx13 = ssl.create_default_context(cafile=str(web_pki / "ca.crt"))
    ctx13.minimum_version = ssl.TLSVersion.TLSv1_3
    assert web_get(s.port, ctx=ctx13, auth=(WEB_USER, WEB_PASSWORD))[0] == 200


def test_web_config_basic_auth_without_tls_stays_plain_http(make_sim, web_pki, tmp_path):
    s = start_web_sim(make_sim, write_web_config(tmp_path / "web.yml", web_pki, tls=False))
    assert web_get(s.port, scheme="http")[0] == 401
    assert web_get(s.port, scheme="http", auth=(WEB_USER, WEB_PASSWORD))[0] == 200


def test_web_config_from_the_environment(make_sim, web_pki, tmp_path):
    config = write_web_config(tmp_path / "web.yml", web_pki)
    s = make_sim(name="envweb", env={"DCGM_EXPORTER_WEB_CONFIG_FILE": str(config)}, launch=WEB_LAUNCH)
    s.start(wait=False)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            status = web_get(s.port, cafile=web_pki / "ca.crt", auth=(WEB_USER, WEB_PASSWORD))[0]
            if status == 200:
                break
        except OSError:
            assert s.proc.poll() is None, s.stderr_text()
        time.sleep(0.05)
    else:
        raise AssertionError(s.stderr_text())


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(tls_config={}), "tls_config"),                                     # top-level typo
    (lambda d: d["tls_server_config"].update(certfile="x"), "certfile"),                    # tls typo
    (lambda d: d.update(http_server_config={"http3": True}), "http3"),
    (lambda d: d["tls_server_config"].pop("key_file"), "missing one of key or key_file"),
    (lambda d: d["tls_server_config"].pop("cert_file"), "missing one of cert or cert_file"),
    (lambda d: d["tls_server_config"].update(min_version="TLS14"), "TLS14"),
    (lambda d: d["tls_server_config"].update(client_auth_type="Sometimes"), "invalid ClientAuth: Sometimes"),
    (lambda d: d["tls_server_config"].update(client_ca_file="/etc/hostname"), "without a Client Auth Policy"),
    (lambda d: d["basic_auth_users"].update(hpcobs="plaintext"), "bcrypt hash"),
    (lambda d: d["tls_server_config"].update(key_file="/nonexistent/server.key"), "X509KeyPair"),
])
def test_web_config_errors_stop_startup(web_pki, tmp_path, mutate, message):
    import yaml
    config = write_web_config(tmp_path / "web.yml", web_pki)
    doc = yaml.safe_load(config.read_text())
    mutate(doc)
    config.write_text(yaml.safe_dump(doc))
    result = run_with_web_config(config)
    assert result.returncode == 1, result.stderr
    assert message in result.stderr and "web config" in result.stderr


def test_web_config_repeated_key_and_missing_file_stop_startup(web_pki, tmp_path):
    config = tmp_path / "web.yml"
    config.write_text("basic_auth_users:\n  a: x\nbasic_auth_users:\n  b: y\n")
    result = run_with_web_config(config)
    assert result.returncode == 1 and "already set" in result.stderr
    result = run_with_web_config(tmp_path / "absent.yml")
    assert result.returncode == 1 and "cannot read web config" in result.stderr


def test_web_config_without_bcrypt_is_a_clear_error(web_pki, tmp_path):
    shadow = tmp_path / "shadow" / "bcrypt"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('bcrypt hidden by the test')\n")
    config = write_web_config(tmp_path / "web.yml", web_pki)
    result = run_with_web_config(config, env={"PYTHONPATH": str(shadow.parent)})
    assert result.returncode == 1
    assert "bcrypt" in result.stderr and "python3-bcrypt" in result.stderr
    # without basic_auth_users bcrypt is not needed
    config = write_web_config(tmp_path / "tls-only.yml", web_pki, users=False)
    result = subprocess.run(WEB_LAUNCH + ["-a", "127.0.0.1:%d" % free_port(), "--help"],
                            env=dict(os.environ, PYTHONPATH=str(shadow.parent)), capture_output=True, text=True)
    assert result.returncode == 0 and "--web-config-file" in result.stdout
    loaded = _web_module().load_web_config(str(config))
    assert loaded.tls and not loaded.users


def _web_module():
    return importlib.import_module("hpcobs_gpusim.webconfig")


def test_bcrypt_check_against_the_projects_own_hashes():
    sys.path.insert(0, str(ROOT / "playbooks" / "filter_plugins"))
    try:
        webconfig_filter = importlib.import_module("hpcobs_webconfig")
    finally:
        sys.path.remove(str(ROOT / "playbooks" / "filter_plugins"))
    import bcrypt
    web = _web_module()
    hashed = webconfig_filter.bcrypt_hash(WEB_PASSWORD, "dcgm-exporter-client")
    assert web.BCRYPT_HASH.match(hashed)
    assert web.check_password(bcrypt, WEB_PASSWORD, hashed)
    assert not web.check_password(bcrypt, WEB_PASSWORD + "x", hashed)
    assert not web.check_password(bcrypt, "", hashed)
    assert not web.check_password(bcrypt, WEB_PASSWORD, "$2b$10$" + "x" * 53)    # a malformed hash is no match
    assert web.check_password(bcrypt, "pw", bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode().replace("$2b$", "$2y$"))
    config = web.WebConfig("web.yml", None, {"hpcobs": hashed}, {}, [])
    good = "Basic " + __import__("base64").b64encode(("hpcobs:" + WEB_PASSWORD).encode()).decode()
    assert config.check_basic_auth(good) and config.check_basic_auth(good)       # the second from the cache
    wrong = "Basic " + __import__("base64").b64encode(("hpcobs:" + WEB_PASSWORD[:-1]).encode()).decode()
    assert not config.check_basic_auth(wrong)
    assert not config.check_basic_auth(None) and not config.check_basic_auth("Bearer abc")
    assert web.parse_basic_auth("Basic " + __import__("base64").b64encode(b"u:p:q").decode()) == ("u", "p:q")
    assert web.parse_basic_auth("Basic !!!") == (None, None)
