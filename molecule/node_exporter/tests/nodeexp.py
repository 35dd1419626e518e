"""Helpers shared by the node_exporter scenario's tests (no tests here): which host runs with the security switch on,
and HTTP requests made inside a test container the way a client of node_exporter makes them."""
import base64
import os
import shlex

# molecule.yml: hpcobs_security is on for this host only; the other one keeps today's plain HTTP.
SECURED = "ne-debian13"
PLAIN = "ne-debian12"
CONFIG_DIR = "/etc/node_exporter"
TLS_DIR = CONFIG_DIR + "/tls"
CA = TLS_DIR + "/ca.crt"
WEB_CONFIG = CONFIG_DIR + "/web.yml"
USER = "hpcobs"
# The client credential node-exporter-client, copied from the controller's site PKI into the container by the tests
# (node_exporter itself holds only its bcrypt hash): what VictoriaMetrics presents.
PASSWORD_FILE = "/root/node-exporter-client"
WRONG_PASSWORD_FILE = "/root/node-exporter-wrong"

# argv: url, CA file (- for none: the system's trust store), user (- for none), password file; prints the status
# (0 when nothing answered: a failed handshake or a refused connection, the body says why), then the body.
_FETCH = (
    "import base64,ssl,sys,urllib.request,urllib.error\n"
    "url,ca,user,pwfile=sys.argv[1:5]\n"
    "headers={}\n"
    "if user!='-': headers['Authorization']='Basic '+base64.b64encode((user+':'+open(pwfile).read().strip()).encode()).decode()\n"
    "ctx=ssl.create_default_context(cafile=None if ca=='-' else ca)\n"
    "try:\n"
    "  resp=urllib.request.urlopen(urllib.request.Request(url,headers=headers),timeout=10,context=ctx)\n"
    "  code,body=resp.status,resp.read()\n"
    "except urllib.error.HTTPError as err:\n"
    "  code=err.code\n"
    "  try: body=err.read()\n"
    "  except OSError: body=b''\n"
    "except Exception as err:\n"
    "  code,body=0,repr(err).encode()\n"
    "sys.stdout.write('%d\\n' % code + body.decode('utf-8','replace'))\n"
)


def fetch(host, url, ca=None, user=None, password_file=None):
    """(status, body) of a GET made inside the test host's container."""
    words = [url, ca or "-", user or "-", password_file or "-"]
    out = host.check_output("python3 -c %s %s" % (shlex.quote(_FETCH), " ".join(shlex.quote(w) for w in words)))
    status, _, body = out.partition("\n")
    return int(status), body


def controller_credential():
    """The client credential as the controller's site PKI holds it (the scenario's ephemeral directory)."""
    path = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "pki", "credentials", "node-exporter-client")
    with open(path, encoding="utf-8") as handle:
        return handle.read().strip()


def write_secret(host, path, content):
    """A file only root reads, in the test host's container."""
    encoded = base64.b64encode(content.encode()).decode()
    host.check_output("umask 077 && echo %s | base64 -d > %s" % (encoded, shlex.quote(path)))


def is_secured(host):
    return host.backend.name == SECURED


def scrape(host):
    """/metrics of the host as its clients read it: plain HTTP with the switch off; with it on, HTTPS trusting the
    site CA with the client credential."""
    if is_secured(host):
        write_secret(host, PASSWORD_FILE, controller_credential())
        status, body = fetch(host, "https://127.0.0.1:9100/metrics", ca=CA, user=USER, password_file=PASSWORD_FILE)
    else:
        status, body = fetch(host, "http://127.0.0.1:9100/metrics")
    assert status == 200, "HTTP %d %s" % (status, body[:300])
    return body
