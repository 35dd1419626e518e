"""What the STAND-INS of molecule/standins share (tests only; none is the real program): command-line flags (Go's
flag package, or cobra's), Go durations, logging, the YAML configuration and its strict decoding (Go yaml.v2
UnmarshalStrict wording: "field X not found in type T", "cannot unmarshal !!str `x` into int"), an HTTP server, and
the log shipping engine Promtail and Alloy share: journal and file targets, Prometheus relabelling, positions and the
push client (JSON, where the real ones push protobuf). python3-yaml is in the test images."""
import base64
import glob
import hashlib
import json
import os
import queue
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import yaml

LOG = {"level": "info"}
_LEVELS = {"debug": 0, "info": 1, "warn": 2, "error": 3}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h|d|w|y)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800,
          "y": 31536000}
_GO = {"s": "string", "i": "int", "f": "float64", "b": "bool", "d": "time.Duration", "l": "[]string"}
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
PRIORITIES = ["emerg", "alert", "crit", "error", "warning", "notice", "info", "debug"]


def log(level, msg, **fields):
    if _LEVELS.get(level, 1) >= _LEVELS.get(LOG["level"], 1):
        extra = "".join(" %s=%s" % (k, json.dumps(v) if isinstance(v, str) else v) for k, v in fields.items())
        sys.stderr.write("level=%s caller=standin msg=%s%s\n" % (level, json.dumps(msg), extra))
        sys.stderr.flush()


def duration(value, what="duration"):
    """Seconds of a Go/Prometheus duration ("10m", "1h30m", "744h", "31d"); a bare 0 is accepted."""
    if value in (0, "0"):
        return 0.0
    if not isinstance(value, str) or not value or _DURATION.sub("", value):
        raise ValueError("%s: time: invalid duration %s" % (what, json.dumps(value)))
    return sum(float(number) * _UNITS[unit] for number, unit in _DURATION.findall(value))


def flags(argv, spec, name, cobra=False):
    """{flag: value} and the arguments. Go's flag package (cobra=False): -name, --name, -name=value, -name value,
    booleans only with "=", no argument, misuse exits 2 with the usage. cobra: --name only, positional arguments,
    "Error: ..." and exit 1."""
    values, args, rest = dict(spec), list(argv), []
    while args:
        arg = args.pop(0)
        key, eq, value = arg[2 if cobra else 0:].lstrip("-").partition("=")
        problem = None
        if not arg.startswith("--" if cobra else "-") or arg in ("-", "--"):
            rest.append(arg)
            problem = None if cobra else "unexpected argument %r" % arg
        elif key not in spec:
            problem = ("unknown flag: --%s" if cobra else "flag provided but not defined: -%s") % key
        elif isinstance(spec[key], bool):
            values[key] = value.lower() in ("true", "1", "t") if eq else True
            if eq and value.lower() not in ("true", "false", "1", "0", "t", "f"):
                problem = "invalid boolean value %r for flag -%s" % (value, key)
        elif eq or args:
            values[key] = value if eq else args.pop(0)
        else:
            problem = "flag needs an argument: -%s" % key
        if problem:
            sys.stderr.write("Error: %s\n" % problem if cobra else "%s\nUsage of %s (hpcobs STAND-IN): %s\n" % (
                problem, name, " ".join(sorted(spec))))
            sys.exit(1 if cobra else 2)
    return (values, rest) if cobra else values


def load_config(path):
    try:
        with open(path, encoding="utf-8") as handle:
            config = yaml.safe_load(handle)
    except OSError as err:
        raise ValueError("cannot read config file %s: %s" % (path, err.strerror)) from err
    except yaml.YAMLError as err:
        raise ValueError("%s: %s" % (path, " ".join(str(err).split()))) from err
    if not isinstance(config if config is not None else {}, dict):
        raise ValueError("%s: the configuration must be a YAML mapping" % path)
    return config or {}


def section(config, *path):
    for key in path:
        config = config.get(key) if isinstance(config, dict) else None
    return config if isinstance(config, dict) else {}


def dicts(value):
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _tag(value):
    return {bool: "!!bool", int: "!!int", float: "!!float", str: "!!str", dict: "!!map"}.get(type(value), "!!seq")


def decode(errors, value, spec, type_name, blocks, names=None):
    """Strict decoding of value into spec, a {key: kind} table. Kinds: s i f b d l (string, int, float, bool,
    duration, list of strings), * (anything), "<block>" / "[<block>]" (a block of blocks, or a list of them; a block
    missing from blocks is not checked), or a dict (an inline block). names: the Go type name of each block."""
    if value is not None and not isinstance(value, dict):
        errors.append("cannot unmarshal %s `%s` into %s" % (_tag(value), value, type_name))
    for key, item in (value or {}).items() if isinstance(value, dict) else ():
        if key not in spec:
            errors.append("field %s not found in type %s" % (key, type_name))
        else:
            _decode_value(errors, item, spec[key], "%s.%s" % (type_name, key), blocks, names or {})


def _decode_value(errors, item, kind, where, blocks, names):
    if item is None or kind == "*":
        return
    if isinstance(kind, dict):
        decode(errors, item, kind, where, blocks, names)
    elif kind.startswith("[<"):
        if not isinstance(item, list):
            errors.append("cannot unmarshal %s into []%s" % (_tag(item), kind[2:-2]))
        for element in item if isinstance(item, list) else []:
            _decode_value(errors, element, kind[1:-1], where, blocks, names)
    elif kind.startswith("<"):
        if kind[1:-1] in blocks:
            decode(errors, item, blocks[kind[1:-1]], names.get(kind[1:-1], kind[1:-1]), blocks, names)
    elif kind == "d" and isinstance(item, str):
        try:
            duration(item, where)
        except ValueError as err:
            errors.append(str(err))
    elif {"s": isinstance(item, (dict, list)), "i": not isinstance(item, int) or isinstance(item, bool),
          "f": not isinstance(item, (int, float)) or isinstance(item, bool), "b": not isinstance(item, bool),
          "d": not isinstance(item, int) or isinstance(item, bool), "l": isinstance(item, dict)}[kind]:
        errors.append("cannot unmarshal %s `%s` into %s" % (_tag(item), item, _GO[kind]))


class _Server(ThreadingHTTPServer):
    """tls: an ssl.SSLContext to serve HTTPS with. A plain HTTP request on that port gets what Go's net/http
    answers it (src/net/http/server.go, Go 1.22+: 400 "Client sent an HTTP request to an HTTPS server."); a failed
    handshake closes the connection."""
    tls = None

    def finish_request(self, request, client_address):
        if self.tls is None:
            return super().finish_request(request, client_address)
        request.settimeout(10)
        try:
            first = request.recv(1, socket.MSG_PEEK)
            if first and first != b"\x16":  # not a TLS handshake record
                request.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
                return None
            secure = self.tls.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):
            return None
        try:
            return super().finish_request(secure, client_address)
        finally:
            secure.close()


# Go crypto/tls ClientAuthType names, as Prometheus exporter-toolkit v0.14 web.TLSConfig (Promtail 3.6.15's dskit
# server http_tls_config) and Alloy 1.18's http { tls { client_auth_type } } spell them. The stand-in serves only the
# three a Python server can do alike; the other two are valid for the real programs and refused here.
CLIENT_AUTH_TYPES = ("NoClientCert", "RequestClientCert", "RequireAnyClientCert", "VerifyClientCertIfGiven",
                     "RequireAndVerifyClientCert")
_CLIENT_AUTH_MODES = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                      "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2,
                "TLS13": ssl.TLSVersion.TLSv1_3}


def server_tls(cert_file, key_file, client_auth_type="NoClientCert", client_ca_file="", min_version="TLS12"):
    """An ssl.SSLContext serving cert_file/key_file that asks for a client certificate as client_auth_type says,
    verified against client_ca_file; ValueError with the problem (an unreadable file: OSError, as the real ones fail
    at start)."""
    client_auth_type = client_auth_type or "NoClientCert"
    if client_auth_type not in CLIENT_AUTH_TYPES:
        raise ValueError("invalid ClientAuth %s" % json.dumps(client_auth_type))
    if client_auth_type not in _CLIENT_AUTH_MODES:
        raise ValueError("client_auth_type %s: not implemented by the stand-in" % client_auth_type)
    if client_ca_file and client_auth_type == "NoClientCert":
        raise ValueError("Client CA's have been configured without a Client Auth Policy")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[min_version or "TLS12"]
    context.load_cert_chain(cert_file, key_file)
    context.verify_mode = _CLIENT_AUTH_MODES[client_auth_type]
    if client_ca_file:
        context.load_verify_locations(cafile=client_ca_file)
    return context


def serve(address, port, get, post=None, stop=None, tls=None):
    """Serve HTTP (HTTPS with tls, an ssl.SSLContext) until SIGTERM or SIGINT (then stop() runs first).
    get(path, query, headers) and post(path, headers, body) answer (status, body); a body that is not a string is
    sent as JSON."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def answer(self, status, body):
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            url = urlsplit(self.path)
            self.answer(*get(url.path, {k: v[-1] for k, v in parse_qs(url.query).items()}, self.headers))

        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.answer(*(post or (lambda *_: (404, "404 page not found\n")))(urlsplit(self.path).path, self.headers,
                                                                              body))

    httpd = _Server((address, port), Handler)
    httpd.tls = tls

    def on_signal(*_):
        if stop:
            stop()
        threading.Thread(target=httpd.shutdown).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    httpd.serve_forever()


def hold_port(address, port):
    """Listen on a port without speaking its protocol (the gRPC ports); port 0 picks a free one."""
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(16)
    return sock


# ---------------------------------------------------------------------------- log shipping (Promtail and Alloy)
def _expand(template, match):
    def one(ref):
        name = ref.group(2) or ref.group(3)
        try:
            return match.group(int(name) if name.isdigit() else name) or ""
        except IndexError:
            return ""
    return re.sub(r"\$(\{(\w+)\}|(\w+))", one, template)


def relabel(labels, rules):
    """Prometheus relabel_configs (model/relabel/relabel.go): the new labels, or None when the entry is dropped."""
    labels = dict(labels)
    for rule in rules:
        action, target = rule.get("action", "replace"), rule.get("target_label", "")
        value = rule.get("separator", ";").join(labels.get(name, "") for name in rule.get("source_labels") or [])
        regex, replacement = re.compile("^(?:%s)$" % rule.get("regex", "(.*)")), str(rule.get("replacement", "$1"))
        match = regex.match(value)
        if action == "replace" and match and LABEL_NAME.match(_expand(target, match)):
            labels[_expand(target, match)] = _expand(replacement, match)
        elif (action == "keep" and not match) or (action == "drop" and match) or (
                action == "keepequal" and value != labels.get(target, "")) or (
                action == "dropequal" and value == labels.get(target, "")):
            return None
        elif action == "hashmod":
            digest = hashlib.md5(value.encode()).digest()[8:]
            labels[target] = str(int.from_bytes(digest, "big") % int(rule.get("modulus", 1)))
        elif action == "labelmap":
            labels.update({_expand(replacement, regex.match(k)): v for k, v in labels.items() if regex.match(k)})
        elif action in ("labeldrop", "labelkeep"):
            labels = {k: v for k, v in labels.items() if bool(regex.match(k)) == (action == "labelkeep")}
        elif action in ("lowercase", "uppercase"):
            labels[target] = value.lower() if action == "lowercase" else value.upper()
    return {k: v for k, v in labels.items() if v != ""}


def public(labels):
    return {k: v for k, v in labels.items() if not k.startswith("__")}


def journal_labels(entry):
    """Promtail's labels of a journal entry: __journal_<field, lower case>, and __journal_priority_keyword."""
    labels = {"__journal_" + k.lower(): v for k, v in entry.items() if not k.startswith("__") and isinstance(v, str)}
    if str(entry.get("PRIORITY", "")).isdigit() and int(entry["PRIORITY"]) < len(PRIORITIES):
        labels["__journal_priority_keyword"] = PRIORITIES[int(entry["PRIORITY"])]
    return labels


class Client:
    """One Loki client: external labels, tenant, basic auth (password or password_file), TLS (tls_config: the server
    is verified against ca_file, else the system's CAs, and insecure_skip_verify, as in Prometheus common config's
    TLSConfig that both shippers use), exponential backoff; a 4xx other than 429 drops the batch, as the real
    clients do. A ca_file that cannot be read stops the shipper at start, as the real ones refuse to build the client
    (Prometheus common config NewTLSConfig: "unable to load specified CA cert"); the password file is read once at
    start here, where the real clients read it again for every request."""

    def __init__(self, settings):
        self.url, self.sent, self.external = settings["url"], 0, settings.get("external_labels") or {}
        self.host, self.headers = urlsplit(self.url).netloc, {"Content-Type": "application/json"}
        if settings.get("tenant_id"):
            self.headers["X-Scope-OrgID"] = settings["tenant_id"]
        auth = settings.get("basic_auth") or {}
        if auth.get("username"):
            password = auth.get("password", "")
            if auth.get("password_file"):
                with open(auth["password_file"], encoding="utf-8") as handle:
                    password = handle.read().strip()
            self.headers["Authorization"] = "Basic " + base64.b64encode(
                ("%s:%s" % (auth["username"], password)).encode()).decode()
        tls = settings.get("tls_config") or {}
        self.context = None
        if urlsplit(self.url).scheme == "https":
            self.context = ssl.create_default_context(cafile=tls.get("ca_file") or None)
            if tls.get("insecure_skip_verify") is True:
                self.context.check_hostname, self.context.verify_mode = False, ssl.CERT_NONE
        backoff = settings.get("backoff_config") or {}
        self.backoff = [duration(backoff.get("min_period", "500ms")), duration(backoff.get("max_period", "5m")),
                        int(backoff.get("max_retries", 10))]

    def push(self, entries, stopping):
        streams = {}
        for labels, ts, line in entries:
            merged = {**self.external, **labels}
            streams.setdefault(json.dumps(merged, sort_keys=True), {"stream": merged, "values": []})["values"].append(
                [str(ts), line])
        body, delay = json.dumps({"streams": list(streams.values())}).encode(), self.backoff[0]
        for attempt in range(self.backoff[2] + 1):
            try:
                with urllib.request.urlopen(urllib.request.Request(self.url, body, self.headers), timeout=10,
                                            context=self.context):
                    self.sent += len(entries)
                    return
            except OSError as err:  # HTTPError too
                log("warn", "push failed", host=self.host, attempt=attempt + 1, err=str(err))
                if 400 <= getattr(err, "code", 500) < 500 and getattr(err, "code", 0) != 429 or stopping.wait(delay):
                    return
                delay = min(delay * 2, self.backoff[1])


class Shipper:
    """Runs a Promtail-shaped configuration: journal targets (journalctl -o json --follow from the saved cursor,
    else max_age back), file targets (static_configs __path__), one batch queue, positions ("cursor-<job_name>",
    file paths) synced after each batch."""

    def __init__(self, config):
        self.config, self.stopping, self.queue, self.children = config, threading.Event(), queue.Queue(), []
        self.clients = [Client(c) for c in config.get("clients") or [config.get("client")] if c]
        self.batchwait = duration((config.get("clients") or [{}])[0].get("batchwait", "1s"))
        self.positions_file = section(config, "positions").get("filename", "/var/log/positions.yaml")
        try:
            with open(self.positions_file, encoding="utf-8") as handle:
                self.positions = {str(k): str(v) for k, v in yaml.safe_load(handle)["positions"].items()}
        except (OSError, TypeError, KeyError, AttributeError, yaml.YAMLError):
            self.positions = {}
        self.jobs, self.lines, self.started, self.active = dicts(config.get("scrape_configs")), {}, False, set()

    def save(self):
        with open(self.positions_file + ".tmp", "w", encoding="utf-8") as handle:
            yaml.safe_dump({"positions": dict(self.positions)}, handle)
        os.replace(self.positions_file + ".tmp", self.positions_file)

    def journal(self, job):
        settings, key, name = job.get("journal") or {}, "cursor-" + job["job_name"], job["job_name"]
        cursor, self.lines[name] = self.positions.get(key), 0
        while not self.stopping.is_set():
            since = ["--after-cursor=%s" % cursor] if cursor else [
                "--since=@%d" % (time.time() - duration(settings.get("max_age", "7h")))]
            proc = subprocess.Popen(["journalctl", "--output=json", "--follow", "--no-tail", "--all", "--no-pager"]
                                    + (["--directory=" + settings["path"]] if settings.get("path") else []) + since
                                    + str(settings.get("matches") or "").split(), stdout=subprocess.PIPE, text=True)
            self.children.append(proc)
            self.started = True  # the real journal target is ready from its start, whether it can read or not
            for raw in proc.stdout:
                entry = json.loads(raw)
                cursor, message = entry.get("__CURSOR", cursor), entry.get("MESSAGE")
                labels = relabel({**(settings.get("labels") or {}), **journal_labels(entry)},
                                 job.get("relabel_configs") or [])
                if isinstance(message, list):
                    message = bytes(message).decode("utf-8", "replace")
                if settings.get("json"):
                    message = json.dumps({k: v for k, v in entry.items() if not k.startswith("__")})
                ok = labels and public(labels) and isinstance(message, str)
                self.lines[name] += 1 if ok else 0
                self.queue.put((key, cursor, public(labels) if ok else None, int(entry["__REALTIME_TIMESTAMP"]) * 1000,
                                message))
            proc.wait()
            self.stopping.wait(5)

    def files(self):
        offsets = {}
        while not self.stopping.is_set():
            active = set()
            for job in self.jobs:
                for static in dicts(job.get("static_configs")):
                    for target in static.get("targets") or [""]:
                        labels = relabel({**(static.get("labels") or {}), "__address__": str(target)},
                                         job.get("relabel_configs") or []) or {}
                        for path in sorted(glob.glob(labels.get("__path__", ""), recursive=True)):
                            active.add(path)
                            offsets[path] = self.read(path, {**public(labels), "filename": path},
                                                      offsets.get(path, int(self.positions.get(path, 0))))
            self.active = active
            self.stopping.wait(1)

    def read(self, path, labels, offset):
        size = os.path.getsize(path)
        offset = 0 if size < offset else offset  # truncated: from the start
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read(min(size - offset, 1 << 20))
        for raw in data[:data.rfind(b"\n") + 1].splitlines():
            offset += len(raw) + 1
            self.queue.put((path, str(offset), labels, time.time_ns(), raw.decode("utf-8", "replace")))
        return offset

    def send(self):
        while not (self.stopping.is_set() and self.queue.empty()):
            batch, deadline = [], time.time() + self.batchwait
            while time.time() < deadline and len(batch) < 5000:
                try:
                    batch.append(self.queue.get(timeout=max(0.05, deadline - time.time())))
                except queue.Empty:
                    break
            entries = [item[2:] for item in batch if item[2] is not None]
            for client in self.clients if entries else []:
                client.push(entries, self.stopping)
            self.positions.update({key: position for key, position, *_ in batch})
            if batch:
                self.save()

    def run(self, address, port, pages, tls=None):
        """Run the targets and the sender, serve pages ({path: callable -> (status, text)}) until SIGTERM; over
        HTTPS with tls (an ssl.SSLContext, server_tls)."""
        sender = threading.Thread(target=self.send)
        for target in [sender, threading.Thread(target=self.files, daemon=True)] + [threading.Thread(
                target=self.journal, args=(job,), daemon=True) for job in self.jobs if "journal" in job]:
            target.start()
        serve(address, port, lambda path, *_: pages.get(path, lambda: (404, "404 page not found\n"))(), tls=tls,
              stop=lambda: [self.stopping.set()] + [child.terminate() for child in self.children])
        sender.join(timeout=30)
        self.save()
        return 0
