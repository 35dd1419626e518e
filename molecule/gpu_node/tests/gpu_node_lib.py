"""Shared helpers of the gpu_node verify tests: scraping :9400 inside a test host and parsing the text format."""
import os
import re
import shlex

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


# The host with the site's security switch on (molecule.yml): the simulator serves HTTPS and basic auth there.
SECURED = {"gpu_node-debian13"}
SECURE_EXPORTER = "https://127.0.0.1:9400"
TLS_DIR = "/etc/dcgm-exporter/tls"
WEB_CONFIG = "/etc/dcgm-exporter/web-config.yml"
CLIENT_USER = "hpcobs"

# argv: url, CA file to trust ("-": the system's trust store; "none": plain HTTP), user ("-": no Authorization);
# the password comes in the environment (HPCOBS_TEST_PASSWORD). Prints the status (0: no HTTP answer, the error
# follows), the WWW-Authenticate header, then the body.
_FETCH = (
    "import base64, os, ssl, sys, urllib.request, urllib.error\n"
    "url, ca, user, timeout = sys.argv[1:5]\n"
    "request = urllib.request.Request(url)\n"
    "if user != '-':\n"
    "    token = base64.b64encode((user + ':' + os.environ['HPCOBS_TEST_PASSWORD']).encode()).decode()\n"
    "    request.add_header('Authorization', 'Basic ' + token)\n"
    "ctx = None if ca == 'none' else ssl.create_default_context(cafile=None if ca == '-' else ca)\n"
    "try:\n"
    "    r = urllib.request.urlopen(request, timeout=int(timeout), context=ctx)\n"
    "    code, challenge, body = r.status, r.headers.get('WWW-Authenticate', ''), r.read().decode()\n"
    "except urllib.error.HTTPError as e:\n"
    "    code, challenge, body = e.code, e.headers.get('WWW-Authenticate', ''), e.read().decode()\n"
    "except Exception as e:\n"
    "    code, challenge, body = 0, '', '%s: %s' % (type(e).__name__, e)\n"
    "sys.stdout.write('%d\\n%s\\n' % (code, challenge)); sys.stdout.write(body)\n")


def secured(host):
    return host.backend.name in SECURED


def client_password():
    """The credential dcgm-exporter-client of the scenario's site PKI (on the controller, hpcobs_pki_dir)."""
    path = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "pki", "credentials", "dcgm-exporter-client")
    with open(path, encoding="utf-8") as handle:
        return handle.read().strip()


def fetch(host, url, ca="none", user=None, password=None, timeout=10):
    """(status, WWW-Authenticate, body) of a GET inside the test host; status 0 when nothing answered in HTTP (a
    failed TLS handshake: the body says why)."""
    env = "HPCOBS_TEST_PASSWORD=%s " % shlex.quote(password) if password is not None else ""
    out = host.check_output("%spython3 -c %s %s %s %s %d" % (env, shlex.quote(_FETCH), shlex.quote(url), shlex.quote(ca),
                                                           shlex.quote(user or "-"), timeout))
    status, _, rest = out.partition("\n")
    challenge, _, body = rest.partition("\n")
    return int(status), challenge, body


def http_get(host, path, timeout=10):
    """(status, body) of a GET inside the test host, as a client of the stack asks: on the secured host over HTTPS
    trusting the site CA, with the client credential."""
    if secured(host):
        status, _, body = fetch(host, SECURE_EXPORTER + path, TLS_DIR + "/ca.crt", CLIENT_USER, client_password(),
                                timeout)
    else:
        status, _, body = fetch(host, EXPORTER + path, timeout=timeout)
    return status, body


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


def whole_gpu_index(host):
    """A GPU of the host without MIG instances (its mapping file is "<gpu>")."""
    exp = expected(host)
    return [g for g in exp["gpus"] if g not in exp["mig"]][0]
