"""Shared helpers of the gpu_node verify tests: scraping :9400 inside a test host and parsing the text format."""
import re

EXPORTER = "http://127.0.0.1:9400"
MAPPING_DIR = "/run/hpcobs/dcgm-job-mapping"
COUNTERS = "/etc/dcgm-exporter/hpcobs-counters.csv"
SIM = "/usr/local/bin/hpcobs-gpusim"

# What molecule.yml configures on each test host (lab_gpu_simulator_* variables).
EXPECTED = {
    "gpu_node-debian12": {
        "gpus": [0, 1, 2, 3],
        "model": "NVIDIA H100 80GB HBM3",
        "driver": "550.127.05",
        "mig": {},
    },
    "gpu_node-debian13": {
        "gpus": [0, 1],
        "model": "NVIDIA A100-SXM4-80GB",
        "driver": "570.133.20",
        # GPU 1 split in two GPU instances: (GPU_I_PROFILE, GPU_I_ID)
        "mig": {1: [("3g.40gb", "1"), ("3g.40gb", "2")]},
    },
}

BASE_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName"]
MIG_LABELS = ["GPU_I_PROFILE", "GPU_I_ID"]

_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\} (\S+)$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)",?')


def expected(host):
    return EXPECTED[host.backend.name]


def http_get(host, path, timeout=10):
    """(status, body) of a GET inside the test host."""
    script = (
        "import sys, urllib.request, urllib.error\n"
        "try:\n"
        "    r = urllib.request.urlopen('%s%s', timeout=%d); code, body = r.status, r.read()\n"
        "except urllib.error.HTTPError as e:\n"
        "    code, body = e.code, e.read()\n"
        "sys.stdout.write('%%d\\n' %% code); sys.stdout.write(body.decode())\n" % (EXPORTER, path, timeout))
    out = host.check_output("python3 -c %s", script)
    status, _, body = out.partition("\n")
    return int(status), body


def scrape(host):
    status, body = http_get(host, "/metrics")
    assert status == 200, body
    return body


class Sample:
    __slots__ = ("name", "labels", "value")

    def __init__(self, name, labels, value):
        self.name = name
        self.labels = labels  # list of (key, value) in the order served
        self.value = value

    @property
    def d(self):
        return dict(self.labels)

    @property
    def keys(self):
        return [k for k, _ in self.labels]

    @property
    def entity(self):
        d = self.d
        return (d["gpu"], d.get("GPU_I_ID"))


def parse(body):
    """Samples of a dcgm-exporter text page; HELP/TYPE as {name: (help, type)}."""
    samples, meta = [], {}
    helps = {}
    for line in body.splitlines():
        if line.startswith("# HELP "):
            name, _, text = line[7:].partition(" ")
            helps[name] = text
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            meta[name] = (helps.get(name), kind)
        elif line and not line.startswith("#"):
            match = _LINE.match(line)
            assert match, "not a sample line: %r" % line
            labels_text = match.group(2)
            labels = _LABEL.findall(labels_text)
            assert "".join('%s="%s",' % kv for kv in labels).rstrip(",") == labels_text, line
            samples.append(Sample(match.group(1), labels, float(match.group(3))))
    return samples, meta


def series(samples, name, gpu=None):
    return [s for s in samples if s.name == name and (gpu is None or s.d["gpu"] == str(gpu))]


def expected_entities(exp):
    """[(gpu, GPU_I_ID or None)] the exporter must report."""
    out = []
    for gpu in exp["gpus"]:
        if gpu in exp["mig"]:
            out.extend((str(gpu), gi) for _, gi in exp["mig"][gpu])
        else:
            out.append((str(gpu), None))
    return out


def csv_fields(host):
    """(field, type, help) rows of the counters CSV installed on the host."""
    rows = []
    for line in host.file(COUNTERS).content_string.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        field, kind, help_text = [part.strip() for part in line.split(",")]
        rows.append((field, kind, help_text))
    return rows
