"""--web-config-file: dcgm-exporter's web configuration (Prometheus exporter-toolkit), HTTPS and basic auth.

The file is exporter-toolkit's YAML (web/tls_config.go, docs/web-configuration.md): tls_server_config,
http_server_config, rate_limit and basic_auth_users {user: bcrypt hash}. It is read strictly, as the toolkit's
yaml.UnmarshalStrict does: an unknown or repeated key, a value of the wrong type, a cert_file without key_file
(or the reverse), an unknown min_version or client_auth_type, a hash that is not bcrypt stop the program at start.
Relative paths are taken from the file's directory. Without tls_server_config the server stays plain HTTP (with
basic auth if users are given), as the toolkit does.

This is the only module that needs more than the standard library: PyYAML (Debian python3-yaml) to read the file
and bcrypt (python3-bcrypt) to check passwords when basic_auth_users is set. They are imported only when a web
config is given; a missing one is a clear start-up error.
"""

import base64
import hashlib
import hmac
import os
import re
import ssl
import threading

from .common import ConfigError

TOP_KEYS = ("tls_server_config", "http_server_config", "rate_limit", "basic_auth_users")
TLS_KEYS = ("cert", "key", "client_ca", "cert_file", "key_file", "client_auth_type", "client_ca_file",
            "cipher_suites", "curve_preferences", "min_version", "max_version", "prefer_server_cipher_suites",
            "client_allowed_sans")
HTTP_KEYS = ("http2", "headers")
RATE_KEYS = ("burst", "interval")
# Go type names of the toolkit's structs, as its strict unmarshal names them in errors
GO_TYPES = {"": "web.Config", "tls_server_config": "web.TLSConfig", "http_server_config": "web.HTTPConfig",
            "rate_limit": "web.RateLimiterConfig"}

TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# client_auth_type -> what Python's ssl can do (it cannot ask for a certificate without verifying it)
CLIENT_AUTH = {"": ssl.CERT_NONE, "NoClientCert": ssl.CERT_NONE,
               "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL, "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
CLIENT_AUTH_UNSUPPORTED = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
# headers exporter-toolkit lets http_server_config.headers set (web/handler.go extraHTTPHeaders)
ALLOWED_HEADERS = ("Strict-Transport-Security", "X-Content-Type-Options", "X-Frame-Options", "X-XSS-Protection",
                   "Content-Security-Policy")
BCRYPT_HASH = re.compile(r"^\$2[abxy]?\$[0-9]{2}\$[./A-Za-z0-9]{53}$")


class WebConfig:
    """What the server needs of a web config: an ssl.SSLContext (or None: plain HTTP), the users, extra headers."""

    def __init__(self, path, ssl_context, users, headers, allowed_sans):
        self.path = path
        self.ssl_context = ssl_context
        self.users = users
        self.headers = headers
        self.allowed_sans = allowed_sans
        self._bcrypt = _import_bcrypt(path) if users else None
        self._ok = set()
        self._lock = threading.Lock()

    @property
    def tls(self):
        return self.ssl_context is not None

    def check_basic_auth(self, header):
        """True when no users are configured, or the Authorization header carries a user and its password."""
        if not self.users:
            return True
        user, password = parse_basic_auth(header)
        if user is None:
            return False
        hashed = self.users.get(user)
        if hashed is None:
            return False
        # exporter-toolkit caches a successful check (bcrypt is slow on purpose): keyed by a digest, never the password
        key = hmac.new(hashed.encode(), ("%s:%s" % (user, password)).encode("utf-8", "surrogateescape"),
                       hashlib.sha256).digest()
        with self._lock:
            if key in self._ok:
                return True
        if not check_password(self._bcrypt, password, hashed):
            return False
        with self._lock:
            self._ok.add(key)
        return True

    def peer_allowed(self, peercert):
        """client_allowed_sans: the client's certificate must carry one of the names (DNS, e-mail, IP, URI)."""
        if not self.allowed_sans:
            return True
        names = [value for _, value in (peercert or {}).get("subjectAltName", ())]
        return any(name in self.allowed_sans for name in names)


def parse_basic_auth(header):
    """(user, password) of an "Authorization: Basic ..." header, (None, None) when it is missing or malformed."""
    if not header:
        return None, None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None, None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8", "surrogateescape")
    except ValueError:
        return None, None
    user, sep, password = decoded.partition(":")
    if not sep:
        return None, None
    return user, password


def check_password(bcrypt, password, hashed):
    """bcrypt check of a password against a hash ($2a$/$2b$/$2y$); False for anything bcrypt refuses."""
    try:
        return bool(bcrypt.checkpw(password.encode("utf-8", "surrogateescape"), hashed.encode()))
    except ValueError:
        return False


def _import_bcrypt(path):
    try:
        import bcrypt
    except ImportError:
        raise ConfigError("web config %s: basic_auth_users needs the Python module bcrypt to check passwords, "
                          "which is missing (Debian: apt-get install python3-bcrypt)" % path) from None
    return bcrypt


def _import_yaml(path):
    try:
        import yaml
    except ImportError:
        raise ConfigError("web config %s: reading it needs the Python module yaml, which is missing "
                          "(Debian: apt-get install python3-yaml)" % path) from None
    return yaml


def _strict_loader(yaml):
    class StrictLoader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
        pass

    def construct_mapping(loader, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError("line %d: key %r already set in map" % (key_node.start_mark.line + 1, key))
            seen.add(key)
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return StrictLoader


def _mapping(value, where, path):
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError("web config %s: %s must be a map, not %r" % (path, where or "the file", value))
    return value


def _check_keys(section, known, where, path):
    for key in section:
        if key not in known:
            raise ConfigError("web config %s: field %s not found in type %s (unknown key %r%s; known: %s)"
                              % (path, key, GO_TYPES[where], key, (" in " + where) if where else "",
                                 ", ".join(known)))


def _string(section, key, where, path):
    value = section.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigError("web config %s: %s.%s must be a string, not %r" % (path, where, key, value))
    return value


def _join(directory, name):
    return name if not name or os.path.isabs(name) else os.path.join(directory, name)


def load_web_config(path):
    """Read and check a web config; a ConfigError names what is wrong (the program then exits at start)."""
    yaml = _import_yaml(path)
    try:
        with open(path, "r", encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigError("cannot read web config %s: %s" % (path, exc)) from None
    try:
        doc = yaml.load(text, Loader=_strict_loader(yaml))  # noqa: S506 - a SafeLoader subclass
    except ConfigError as exc:
        raise ConfigError("web config %s: %s" % (path, exc)) from None
    except yaml.YAMLError as exc:
        raise ConfigError("web config %s is not valid YAML: %s" % (path, exc)) from None
    doc = _mapping(doc, "", path)
    _check_keys(doc, TOP_KEYS, "", path)
    directory = os.path.dirname(os.path.abspath(path))

    tls = _mapping(doc.get("tls_server_config"), "tls_server_config", path)
    _check_keys(tls, TLS_KEYS, "tls_server_config", path)
    http = _mapping(doc.get("http_server_config"), "http_server_config", path)
    _check_keys(http, HTTP_KEYS, "http_server_config", path)
    rate = _mapping(doc.get("rate_limit"), "rate_limit", path)
    _check_keys(rate, RATE_KEYS, "rate_limit", path)

    headers = _mapping(http.get("headers"), "http_server_config.headers", path)
    for name, value in headers.items():
        if name not in ALLOWED_HEADERS:
            raise ConfigError("web config %s: HTTP header %r can not be configured (allowed: %s)"
                              % (path, name, ", ".join(ALLOWED_HEADERS)))
        if not isinstance(value, str):
            raise ConfigError("web config %s: the value of header %s must be a string" % (path, name))
    if "http2" in http and not isinstance(http["http2"], bool):
        raise ConfigError("web config %s: http_server_config.http2 must be true or false" % path)
    if rate.get("interval"):
        raise ConfigError("web config %s: rate_limit is not simulated; leave it out" % path)

    users = _mapping(doc.get("basic_auth_users"), "basic_auth_users", path)
    for user, hashed in users.items():
        if not isinstance(user, str) or not isinstance(hashed, str) or not BCRYPT_HASH.match(hashed):
            raise ConfigError("web config %s: basic_auth_users[%r] must be a bcrypt hash ($2y$10$...)"
                              % (path, user))

    context, allowed_sans = tls_context(tls, directory, path)
    return WebConfig(path, context, dict(users), dict(headers), allowed_sans)


def tls_context(tls, directory, path):
    """(ssl.SSLContext or None, client_allowed_sans) of a tls_server_config, checked as the toolkit does."""
    where = "tls_server_config"
    cert_file = _join(directory, _string(tls, "cert_file", where, path))
    key_file = _join(directory, _string(tls, "key_file", where, path))
    ca_file = _join(directory, _string(tls, "client_ca_file", where, path))
    auth = _string(tls, "client_auth_type", where, path)
    for inline in ("cert", "key", "client_ca"):
        if tls.get(inline):
            raise ConfigError("web config %s: inline %s.%s is not simulated; use %s_file" % (path, where, inline,
                                                                                           inline))
    for listed in ("cipher_suites", "curve_preferences"):
        if tls.get(listed):
            raise ConfigError("web config %s: %s.%s is not simulated; leave it out" % (path, where, listed))
    enabled = bool(cert_file or key_file or ca_file or auth)
    if not enabled:
        return None, []
    if not cert_file:
        raise ConfigError("web config %s: missing one of cert or cert_file" % path)
    if not key_file:
        raise ConfigError("web config %s: missing one of key or key_file" % path)
    if auth in CLIENT_AUTH_UNSUPPORTED:
        raise ConfigError("web config %s: client_auth_type %s is not simulated (Python's ssl verifies every "
                          "certificate it asks for): use VerifyClientCertIfGiven or RequireAndVerifyClientCert"
                          % (path, auth))
    if auth not in CLIENT_AUTH:
        raise ConfigError("web config %s: invalid ClientAuth: %s" % (path, auth))
    versions = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        name = tls.get(key, default)
        if name not in TLS_VERSIONS:
            raise ConfigError("web config %s: unknown TLS version: %s (%s.%s: one of %s)"
                              % (path, name, where, key, ", ".join(TLS_VERSIONS)))
        versions[key] = TLS_VERSIONS[name]
    if versions["min_version"] > versions["max_version"]:
        raise ConfigError("web config %s: min_version is above max_version" % path)
    if "prefer_server_cipher_suites" in tls and not isinstance(tls["prefer_server_cipher_suites"], bool):
        raise ConfigError("web config %s: %s.prefer_server_cipher_suites must be true or false" % (path, where))
    sans = tls.get("client_allowed_sans") or []
    if not isinstance(sans, list) or not all(isinstance(name, str) for name in sans):
        raise ConfigError("web config %s: %s.client_allowed_sans must be a list of names" % (path, where))
    if sans and CLIENT_AUTH[auth] != ssl.CERT_REQUIRED:
        raise ConfigError("web config %s: client_allowed_sans requires client_auth_type to be one of "
                          "RequireAnyClientCert or RequireAndVerifyClientCert" % path)
    if ca_file and CLIENT_AUTH[auth] == ssl.CERT_NONE:
        raise ConfigError("web config %s: client CA's have been configured without a Client Auth Policy" % path)

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = versions["min_version"]
    context.maximum_version = versions["max_version"]
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError("web config %s: failed to load X509KeyPair (%s, %s): %s"
                          % (path, cert_file, key_file, exc)) from None
    context.verify_mode = CLIENT_AUTH[auth]
    if context.verify_mode != ssl.CERT_NONE:
        if not ca_file:
            raise ConfigError("web config %s: client_auth_type %s needs client_ca_file" % (path, auth))
        try:
            context.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError("web config %s: cannot read client_ca_file %s: %s" % (path, ca_file, exc)) from None
    return context, list(sans)
