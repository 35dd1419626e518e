"""The HTTP exporter: scrapes, background ticks, endpoints and the listening socket."""

import contextlib
import json
import os
import signal
import socket
import socketserver
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import common
from .common import PROG, STATE_FILE, TOPOLOGY_FILE, VERSION, ConfigError, atomic_write, log
from .counters import CsvError, load_counters
from .faults import FaultStoreError, empty_faults, load_faults
from .mapping import MappingError, read_mapping_dir
from .model import Simulator
from .render import render_metrics
from .webconfig import load_web_config


# ---------------------------------------------------------------------------
# The exporter service
# ---------------------------------------------------------------------------


class Exporter:
    def __init__(self, opts, settings, counters):
        self.opts = opts
        self.settings = settings
        self.counters = counters
        self.sim = Simulator(settings)
        self.state_dir = settings["state_dir"]
        self.mapping_dir = opts.hpc_job_mapping_dir or ""
        self.hostname = "" if opts.no_hostname else settings["hostname"]
        self.emulation = settings["emulation"]
        self.lock = threading.Lock()
        self.faults = empty_faults()
        self._fault_error = None
        self._mapping_missing_logged = False
        self.last_mapping = None
        self._unmatched_logged = set()
        self.persist_ok = True
        self._prepare_state_dir()
        self.sim.load_state(os.path.join(self.state_dir, STATE_FILE))
        if self.mapping_dir:
            log("INFO", "HPC job mapping is enabled and watch for the %r directory"
                % self.mapping_dir)
            if not os.path.exists(self.mapping_dir):
                log("ERROR", "HPC job mapping file directory '%s' not found on "
                    "initialization." % self.mapping_dir)
                self._mapping_missing_logged = True

    def _prepare_state_dir(self):
        try:
            os.makedirs(self.state_dir, mode=0o755, exist_ok=True)
            atomic_write(os.path.join(self.state_dir, TOPOLOGY_FILE),
                         json.dumps(self.sim.topology_document(), indent=2) + "\n")
        except OSError as exc:
            self.persist_ok = False
            log("WARN", "state dir not writable; energy and counters will not persist",
                state_dir=self.state_dir, error=exc)

    def _read_faults(self):
        try:
            self.faults = load_faults(self.state_dir)
            self._fault_error = None
        except FaultStoreError as exc:
            if exc.doc is not None:
                self.faults = exc.doc       # the usable entries; the others are logged once
            if str(exc) != self._fault_error:
                log("ERROR", "keeping previous faults" if exc.doc is None else "ignoring unusable faults",
                    error=exc)
            self._fault_error = str(exc)
        return self.faults

    def _read_mapping(self, strict):
        if not self.mapping_dir:
            return None
        try:
            mapping = read_mapping_dir(self.mapping_dir)
        except MappingError:
            if strict:
                raise
            return self.last_mapping
        if mapping is None:
            self.last_mapping = None
            if not self._mapping_missing_logged:
                log("ERROR", "Unable to access HPC job mapping file directory '%s' - "
                    "directory not found. Ignoring." % self.mapping_dir)
                self._mapping_missing_logged = True
            return None
        self._mapping_missing_logged = False
        self.last_mapping = mapping
        self._warn_unmatched(mapping)
        return mapping

    def _warn_unmatched(self, mapping):
        """Log once per file a mapping that names a MIG slot that does not exist."""
        keys = {e.key for g in self.sim.gpus for e in g.entities}
        mig_gpus = {str(g.index) for g in self.sim.gpus if g.mig}
        unmatched = set()
        for name in mapping:
            if "." in name and name not in keys:
                unmatched.add(name)
            elif name in mig_gpus:
                unmatched.add(name)
        for name in sorted(unmatched - self._unmatched_logged):
            log("WARN", "HPC job mapping file does not match a discovered GPU instance; "
                "job labels from this file will not be applied", mapping_file=name,
                hint="MIG instances are named <gpu>.<GPU_I_ID>")
        self._unmatched_logged = unmatched

    def save_state(self, fsync=False):
        if not self.persist_ok:
            return
        try:
            atomic_write(os.path.join(self.state_dir, STATE_FILE),
                         json.dumps(self.sim.state_document()) + "\n", fsync=fsync)
        except OSError as exc:
            log("WARN", "cannot persist state", error=exc)

    def scrape(self):
        """Return the /metrics body; raise MappingError for an HTTP 500."""
        with self.lock:
            mapping = self._read_mapping(strict=True)
            faults = self._read_faults()
            self.sim.tick(time.time(), mapping, faults)
            entities = self.sim.visible_entities(faults.get("faults", {}))
            body = render_metrics(self.counters, entities,
                                  mapping, self.hostname, self.opts.use_old_namespace,
                                  self.opts.replace_blanks_in_model_name,
                                  self.emulation.hostname_label)
            self.save_state()
        return body

    def background_tick(self):
        with self.lock:
            mapping = self._read_mapping(strict=False)
            faults = self._read_faults()
            self.sim.tick(time.time(), mapping, faults)
            self.save_state(fsync=True)

    def reload_counters(self):
        try:
            counters = load_counters(self.opts.collectors)
        except CsvError as exc:
            log("ERROR", "reload failed, keeping the previous counters", error=exc)
            return
        with self.lock:
            self.counters = counters
        log("INFO", "counters reloaded", fields=len(counters))


INDEX_PAGE = b"""<html>
<head><title>GPU Exporter</title></head>
<body>
<h1>GPU Exporter</h1>
<p><a href="./metrics">Metrics</a></p>
</body>
</html>"""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = PROG + "/" + VERSION
    sys_version = ""
    exporter = None  # set on the subclass
    web = None       # the --web-config-file (webconfig.WebConfig), set on the subclass; None: no auth

    def log_message(self, fmt, *args):  # noqa: N802 (stdlib name)
        log("DEBUG", "request", client=self.client_address[0], line=fmt % args)

    def version_string(self):
        return self.server_version

    def _send(self, status, body, content_type="text/plain; charset=utf-8", head=False, headers=()):
        self.send_response(status)
        for name, value in (self.web.headers.items() if self.web else ()):
            self.send_header(name, value)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _route(self, head):
        if self.web and not self.web.check_basic_auth(self.headers.get("Authorization")):
            # exporter-toolkit's answer to a missing or wrong user or password (web/handler.go)
            self._send(401, b"Unauthorized\n", head=head, headers=[("WWW-Authenticate", "Basic")])
            return
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            try:
                body = self.exporter.scrape()
            except MappingError as exc:
                log("ERROR", "Failed to apply transformations on metrics", error=exc,
                    transformation="hpcMapper")
                self._send(500, b"internal server error\n", head=head)
                return
            except Exception as exc:  # noqa: BLE001 - a scrape must answer, whatever went wrong
                log("ERROR", "scrape failed", error=repr(exc))
                self._send(500, b"internal server error\n", head=head)
                return
            self._send(200, body.encode("utf-8", "surrogateescape"), head=head)
        elif path == "/health":
            emulation = self.exporter.emulation
            self._send(200, emulation.health_body, head=head, headers=emulation.health_headers)
        elif path == "/":
            self._send(200, INDEX_PAGE, "text/html; charset=utf-8", head=head)
        else:
            self._send(404, b"404 page not found\n", head=head)

    def do_GET(self):  # noqa: N802
        self._route(head=False)

    def do_HEAD(self):  # noqa: N802
        self._route(head=True)


class DualStackServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    dual_stack = False
    ssl_context = None      # HTTPS when set (--web-config-file with tls_server_config)
    web = None
    handshake_timeout = 10.0

    def get_request(self):
        sock, address = super().get_request()
        if self.ssl_context is not None:
            # the handshake happens in the request's thread (finish_request): a slow client blocks no other
            sock = self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def finish_request(self, request, client_address):
        if self.ssl_context is not None:
            try:
                request.settimeout(self.handshake_timeout)
                request.do_handshake()
                request.settimeout(None)
            except (OSError, ssl.SSLError) as exc:
                log("DEBUG", "TLS handshake error", client=client_address[0], error=exc)
                return
            if not self.web.peer_allowed(request.getpeercert()):
                log("DEBUG", "client certificate carries none of client_allowed_sans", client=client_address[0])
                return
        super().finish_request(request, client_address)

    def server_bind(self):
        if self.dual_stack:
            with contextlib.suppress(OSError, AttributeError):
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        # HTTPServer.server_bind would resolve the FQDN of the bind address,
        # which can stall on a host without working DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = self.server_address[1]


def parse_listen_address(address):
    """Split "[host]:port" as Go's net.SplitHostPort does."""
    if address.startswith("["):
        end = address.find("]")
        if end < 0 or address[end + 1:end + 2] != ":":
            raise ConfigError("bad listen address %r" % address)
        host, port = address[1:end], address[end + 2:]
    else:
        host, sep, port = address.rpartition(":")
        if not sep:
            raise ConfigError("bad listen address %r: missing port" % address)
        if ":" in host:
            raise ConfigError("bad listen address %r: too many colons" % address)
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError("bad listen address %r: invalid port" % address)
    return host, int(port)


def make_server(address, handler):
    host, port = parse_listen_address(address)
    if host == "":
        try:
            cls = type("Server6", (DualStackServer,), {"address_family": socket.AF_INET6,
                                                       "dual_stack": True})
            return cls(("::", port), handler)
        except OSError:
            cls = type("Server4", (DualStackServer,), {"address_family": socket.AF_INET})
            return cls(("0.0.0.0", port), handler)
    infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    family, _, _, _, sockaddr = infos[0]
    cls = type("ServerX", (DualStackServer,), {"address_family": family})
    return cls(sockaddr[:2], handler)


def serve(opts, settings):
    common.set_debug(opts.debug)
    try:
        counters = load_counters(opts.collectors)
    except CsvError as exc:
        log("ERROR", "failed to get counters", error=exc)
        return 1
    web = None
    if opts.web_config_file:
        try:
            web = load_web_config(opts.web_config_file)
        except ConfigError as exc:
            log("ERROR", "Failed to load the web config file.", error=exc)
            return 1
    log("INFO", "Starting dcgm-exporter simulator", Version=VERSION, emulate=settings["emulation"].name,
        gpus=settings["gpus"], model=settings["model"], hostname=settings["hostname"])
    try:
        exporter = Exporter(opts, settings, counters)
    except ConfigError as exc:
        log("ERROR", str(exc))
        return 1
    handler = type("BoundHandler", (Handler,), {"exporter": exporter, "web": web})
    try:
        server = make_server(opts.address, handler)
    except (OSError, ConfigError) as exc:
        log("ERROR", "Failed to Listen and Server HTTP server.", error=exc)
        return 1
    server.web = web
    server.ssl_context = web.ssl_context if web else None
    stop = threading.Event()

    def on_signal(signum, _frame):
        if signum == signal.SIGHUP:
            threading.Thread(target=exporter.reload_counters, daemon=True).start()
            return
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)

    def ticker():
        period = max(0.1, opts.collect_interval / 1000.0)
        while not stop.wait(period):
            try:
                exporter.background_tick()
            except Exception as exc:  # keep serving whatever happens here
                log("ERROR", "background update failed", error=exc)

    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                     daemon=True).start()
    threading.Thread(target=ticker, daemon=True).start()
    bound = server.server_address
    log("INFO", "Starting webserver", address="%s:%s" % (bound[0], bound[1]))
    if web:
        log("INFO", "TLS is enabled." if server.ssl_context else "TLS is disabled.",
            address="%s:%s" % (bound[0], bound[1]), basic_auth=bool(web.users))
    while not stop.wait(1.0):
        pass
    log("INFO", "Shutting down gracefully...")
    server.shutdown()
    server.server_close()
    with exporter.lock:
        exporter.sim.tick(time.time(), exporter.last_mapping, exporter.faults)
        exporter.save_state(fsync=True)
    log("INFO", "Shutdown complete")
    return 0
