"""What the STAND-INS of molecule/standins share (tests only; none is the real program): Go flags and durations,
logging, the configuration file (yaml.safe_load: python3-yaml is in the test images), an HTTP server, and the strict
decoding Loki and Promtail do (Go yaml.v2 UnmarshalStrict into their config structs) with its wording: "field X not
found in type T", "cannot unmarshal !!str `x` into int"."""
import json
import re
import signal
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import yaml

LOG = {"level": "info"}
_LEVELS = {"debug": 0, "info": 1, "warn": 2, "error": 3}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h|d|w|y)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800,
          "y": 31536000}
_TAGS = {bool: "!!bool", int: "!!int", float: "!!float", str: "!!str"}
_GO = {"s": "string", "i": "int", "f": "float64", "b": "bool", "d": "time.Duration", "l": "[]string"}
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


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


def flags(argv, spec, name):
    """Go's flag package: -name, --name, -name=value, -name value; booleans take only the = form; exit 2 on misuse."""
    values = {key: default for key, (kind, default) in spec.items()}
    args = list(argv)
    while args:
        arg = args.pop(0)
        key, eq, value = arg.lstrip("-").partition("=")
        problem = None
        if not arg.startswith("-") or arg in ("-", "--"):
            problem = "unexpected argument %r" % arg
        elif key not in spec:
            problem = "flag provided but not defined: -%s" % key
        elif spec[key][0] is bool:
            if eq and value.lower() not in ("true", "false", "1", "0", "t", "f"):
                problem = "invalid boolean value %r for flag -%s" % (value, key)
            values[key] = value.lower() in ("true", "1", "t") if eq else True
        elif eq or args:
            values[key] = value if eq else args.pop(0)
        else:
            problem = "flag needs an argument: -%s" % key
        if problem:
            sys.stderr.write("%s\nUsage of %s (hpcobs STAND-IN): %s\n" % (problem, name, " ".join(sorted(spec))))
            sys.exit(2)
    return values


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


def decode(errors, value, spec, type_name, blocks, names=None):
    """Strict decoding of value into spec, a {key: kind} table. Kinds: s i f b d l (string, int, float, bool,
    duration, list of strings), * (anything), "<block>" / "[<block>]" (a block of blocks, or a list of them; a block
    missing from blocks is not checked), or a dict (an inline block). names: the Go type name of each block."""
    if value is None:
        return
    if not isinstance(value, dict):
        errors.append("cannot unmarshal %s `%s` into %s" % (_tag(value), value, type_name))
        return
    for key, item in value.items():
        if key not in spec:
            errors.append("field %s not found in type %s" % (key, type_name))
        else:
            _decode_value(errors, item, spec[key], "%s.%s" % (type_name, key), blocks, names or {})


def _tag(value):
    return _TAGS.get(type(value), "!!map" if isinstance(value, dict) else "!!seq")


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


def serve(address, port, get, post=None, stop=None):
    """Serve HTTP until SIGTERM or SIGINT (then stop() runs first). get(path, query, headers) and
    post(path, headers, body) answer (status, body[, content type]); a body that is not a string is sent as JSON."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def answer(self, status, body, kind="text/plain"):
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("Content-Type", kind if isinstance(body, str) else "application/json")
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

    httpd = ThreadingHTTPServer((address, port), Handler)

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
