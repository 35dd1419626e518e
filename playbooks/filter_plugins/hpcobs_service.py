"""What every service role derives the same way: the address its readiness probe uses, its port, ExecStart words
quoted for systemd, and where every other component of the stack is reached (the components map, files/components.yml).
Pure functions, unit-tested in tests/test_service_filters.py and tests/test_components.py.
"""

import base64
import binascii
import json
import os
import re
import time

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - the unit tests import this file without Ansible
    class AnsibleFilterError(Exception):
        pass

# [host]:port or host:port; an empty host means every address.
_LISTEN = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[0-9A-Za-z.-]*):(?P<port>[0-9]{1,5})$")
# Where a service listening on every address is reached from the host itself.
_ANY = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "[::]": "127.0.0.1"}
# A word systemd takes as it is: no quotes, backslashes, specifiers (%), variables ($), blanks or semicolons.
_PLAIN = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")


def _split(listen):
    match = _LISTEN.match(str(listen))
    if not match or not 1 <= int(match.group("port")) <= 65535:
        raise AnsibleFilterError(
            "%r is not a listen address: expected [host]:port or host:port with a port 1-65535 (\":9100\" listens"
            " on every address)" % (listen,))
    return match.group("host"), int(match.group("port"))


def listen_problem(listen):
    """'' when listen is a valid [host]:port, else what is wrong with it (for a preflight assert)."""
    try:
        _split(listen)
    except AnsibleFilterError as exc:
        return str(exc)
    return ""


def listen_port(listen):
    """The port of a listen address, as an int."""
    return _split(listen)[1]


def probe_host(listen):
    """The host a probe on the same machine connects to: the listen host, or 127.0.0.1 for every address."""
    host = _split(listen)[0]
    return _ANY.get(host, host)


def probe_url(listen, path="/", tls=False):
    """http(s)://<probe host>:<port><path> for a service listening on `listen` (path "" gives the base URL)."""
    if path and not str(path).startswith("/"):
        raise AnsibleFilterError("probe path %r must start with /" % (path,))
    host, port = _split(listen)
    return "%s://%s:%d%s" % ("https" if tls else "http", _ANY.get(host, host), port, path)


def listen_join(host, port):
    """host and port as one listen address: [host]:port for an IPv6 host (brackets added once), else host:port."""
    host = str(host)
    if ":" in host and not host.startswith("["):
        host = "[%s]" % host
    return "%s:%s" % (host, port)


_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)(?:\s+\S+)?$")


def metric_sum(text, name):
    """Sum of the samples of metric `name` (any labels) in a Prometheus text exposition; 0.0 when it has none."""
    total = 0.0
    for line in str(text).splitlines():
        match = _SAMPLE.match(line.strip())
        if match and match.group("name") == name:
            try:
                total += float(match.group("value"))
            except ValueError:
                continue
    return total


def systemd_word(word):
    """One ExecStart argument as systemd reads it back unchanged: quoted and escaped when it needs to be."""
    word = str(word)
    if any(char in word for char in "\n\r\0"):
        raise AnsibleFilterError("a command-line argument cannot hold a line break or NUL: %r" % (word,))
    if _PLAIN.match(word):
        return word
    return '"%s"' % word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")


# --- The components map (files/components.yml) -------------------------------------------------------------------

COMPONENTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "files", "components.yml")
_KEYS = {"port", "listen", "groups", "scrape_job", "ready_path", "lab", "tls", "auth", "peer_name", "role"}
_AUTHS = ("basic", "client_cert")  # how the clients of a component with tls: true authenticate (`auth`)
_DNS_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)+$")
_LOG_SHIPPERS = ("promtail", "alloy")
_loaded = {}  # path: (components, shared facts), read and checked once per file


def _load(path):
    path = os.path.abspath(path)
    if path not in _loaded:
        import yaml  # only needed here; the other filters run without it

        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle) or {}
        _loaded[path] = (check_components(data, path), data.get("shared") or {})
    return _loaded[path]


def load_components(path=COMPONENTS_FILE):
    """{name: entry} of the components map, checked once per file."""
    return _load(path)[0]


def check_components(data, where="components map"):
    """The components of a parsed map, or an error naming every problem in it."""
    problems = []
    data = data if isinstance(data, dict) else {}
    entries = data.get("components")
    if data.get("format") != 1:
        problems.append("format must be 1")
    unknown = set(data) - {"format", "shared", "components"}
    if unknown:
        problems.append("unknown top-level key(s) %s" % ", ".join(sorted(unknown)))
    if not isinstance(entries, dict) or not entries:
        problems.append("components must be a non-empty map")
        entries = {}
    ports = {}
    for name, entry in entries.items():
        if not isinstance(entry, dict):
            problems.append("%s: must be a map" % name)
            continue
        unknown = set(entry) - _KEYS
        if unknown:
            problems.append("%s: unknown key(s) %s" % (name, ", ".join(sorted(unknown))))
        if "port" in entry:
            port = entry["port"]
            if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
                problems.append("%s: port must be 1-65535" % name)
            elif port in ports:
                problems.append("%s: port %d is already %s's" % (name, port, ports[port]))
            else:
                ports[port] = name
            listen = entry.get("listen")
            if not (isinstance(listen, dict) and (set(listen) == {"address"} or set(listen) == {"host", "port"})):
                problems.append("%s: listen must be {address: <var>} or {host: <var>, port: <var>}" % name)
        elif "listen" in entry or "scrape_job" in entry:
            problems.append("%s: listen and scrape_job need a port" % name)
        if "tls" in entry and (not isinstance(entry["tls"], bool) or "port" not in entry):
            problems.append("%s: tls must be true or false, on a component with a port" % name)
        if "auth" in entry and not (entry.get("tls") is True and entry["auth"] in _AUTHS):
            problems.append("%s: auth must be %s, on a component with tls: true" % (name, " or ".join(_AUTHS)))
        if "peer_name" in entry and not (entry.get("tls") is True and isinstance(entry["peer_name"], str)
                                         and _DNS_NAME.match(entry["peer_name"])):
            problems.append("%s: peer_name must be a DNS name with a dot, on a component with tls: true" % name)
        if "role" in entry and not (isinstance(entry["role"], str) and entry["role"] in entries
                                    and entry["role"] != name):
            problems.append("%s: role must name another component (the role that runs it)" % name)
        groups = entry.get("groups")
        if not isinstance(groups, list) or not groups or not all(isinstance(g, str) for g in groups):
            problems.append("%s: groups must be a non-empty list of group names" % name)
    if problems:
        raise AnsibleFilterError("%s: %s" % (where, "; ".join(problems)))
    return entries


def shared_fact(name, path=COMPONENTS_FILE):
    """A fact of the map's `shared` section (what more than one role needs, e.g. xid_page_codes)."""
    shared = _load(path)[1]
    if name not in shared:
        raise AnsibleFilterError("%r is not a shared fact of %s (known: %s)" % (name, path, ", ".join(sorted(shared))))
    return shared[name]


def _entry(name, components=None):
    components = load_components() if components is None else components
    if name not in components or "port" not in components[name]:
        known = ", ".join(sorted(key for key, value in components.items() if "port" in value))
        raise AnsibleFilterError("%r is not a component with a port (known: %s)" % (name, known))
    return components[name]


def component_peer_name(name, components=None):
    """The peer_name of a component (the DNS name its peers verify, carried by its hosts' certificates), or ""."""
    return _entry(name, components).get("peer_name", "")


def cert_names(path):
    """The subject alternative names (DNS names and IP addresses, as text) of a PEM certificate on the controller:
    what a preflight checks a site's own certificate against."""
    try:
        from cryptography import x509
        with open(os.path.expanduser(str(path)), "rb") as handle:
            cert = x509.load_pem_x509_certificate(handle.read())
    except (OSError, ValueError) as exc:
        raise AnsibleFilterError("cannot read the certificate %s: %s" % (path, exc))
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(name) for name in sans.get_values_for_type(x509.DNSName)] + [
        str(address) for address in sans.get_values_for_type(x509.IPAddress)]


def component_port(name, components=None):
    """The default port of a component."""
    return _entry(name, components)["port"]


def component_listen(name, components=None):
    """The default listen address of a component whose role takes "[host]:port": every address, its port."""
    return ":%d" % component_port(name, components)


def component_hosts(name, groups, components=None):
    """Every host of the inventory groups a component runs on (files/components.yml `groups`), each once, in
    inventory order."""
    components = load_components() if components is None else components
    if name not in components:
        raise AnsibleFilterError("%r is not a component (known: %s)" % (name, ", ".join(sorted(components))))
    hosts = []
    for group in components[name]["groups"]:
        for host in (groups or {}).get(group) or []:
            if host not in hosts:
                hosts.append(host)
    return hosts


def component_names(components=None):
    """Every component name (what hpcobs_components_disabled may list)."""
    return sorted(load_components() if components is None else components)


def deployed_components(disabled=None, log_shipper="promtail", components=None):
    """The components a site deploys: all but the disabled ones and the log shipper it did not choose."""
    names = component_names(components)
    unknown = sorted(set(disabled or []) - set(names))
    if unknown:
        raise AnsibleFilterError("hpcobs_components_disabled lists unknown component(s) %s; known: %s"
                                 % (", ".join(unknown), ", ".join(names)))
    if log_shipper not in _LOG_SHIPPERS:
        raise AnsibleFilterError("hpcobs_log_shipper must be one of %s, not %r" % (", ".join(_LOG_SHIPPERS), log_shipper))
    return [name for name in names if name not in (disabled or [])
            and (name not in _LOG_SHIPPERS or name == log_shipper)]


def components_problem(disabled=None, log_shipper="promtail", security=False):
    """'' when hpcobs_components_disabled and hpcobs_log_shipper name known components and hpcobs_security is a
    boolean, else what is wrong."""
    try:
        deployed_components(disabled, log_shipper)
    except AnsibleFilterError as exc:
        return str(exc)
    if str(security).strip().lower() not in ("true", "false"):
        return "hpcobs_security must be true or false, not %r" % (security,)
    return ""


def host_address(host, hostvars):
    """How the other hosts reach `host`: its hpcobs_address, else ansible_host, else its inventory name (an IPv6
    address in brackets, ready for ":port")."""
    hv = hostvars[host] if host in hostvars else {}
    address = str(hv.get("hpcobs_address") or hv.get("ansible_host") or host)
    if ":" in address and not address.startswith("["):
        address = "[%s]" % address
    return address


def _listen_of(name, hostvars, host, components):
    """(listen host, port) of a component on a host: the host's own setting of the listen variable(s) when its
    inventory sets them, else the component's default."""
    entry = _entry(name, components)
    hv = hostvars[host] if host in hostvars else {}
    listen = entry["listen"]
    if "address" in listen:
        value = hv.get(listen["address"])
        return _split(value) if value not in (None, "") else ("", entry["port"])
    port = hv.get(listen["port"])
    if port in (None, ""):
        port = entry["port"]
    try:
        port = int(port)
    except (TypeError, ValueError):
        raise AnsibleFilterError("%s of %s is %r, not a port" % (listen["port"], host, port))
    return str(hv.get(listen["host"]) or ""), port


def security_enabled(hv, path=COMPONENTS_FILE):
    """The site's security switch as a host sees it: its hpcobs_security, else the map's shared `security`."""
    value = hv.get("hpcobs_security") if "hpcobs_security" in hv else shared_fact("security", path)
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("true", "false"):
        return str(value).strip().lower() == "true"
    raise AnsibleFilterError("hpcobs_security must be true or false, not %r" % (value,))


def component_scheme(name, hostvars, host, components=None):
    """https when the component serves TLS in this release (tls: true in the map) and the host's security switch
    (hpcobs_security) is on, else http: the one place every client's scheme comes from."""
    entry = _entry(name, components)
    hv = hostvars[host] if host in hostvars else {}
    return "https" if entry.get("tls") and security_enabled(hv) else "http"


def secured_components(names, hostvars, host, components=None):
    """The components of a list that `host` reaches over https (component_scheme), each once, in the list's order:
    the ones whose clients present the site CA and the client credential <component>-client."""
    out = []
    for name in names or []:
        if name not in out and component_scheme(name, hostvars, host, components) == "https":
            out.append(name)
    return out


def client_credential(name, components=None):
    """The site PKI credential (roles/pki) that a client of a secured component presents as the stack's client user:
    <component>-client, the component's underscores as dashes (credential names are [a-z0-9-]: node_exporter gives
    node-exporter-client). A list of components gives the list of their credentials."""
    if isinstance(name, (list, tuple)):
        return [client_credential(item, components) for item in name]
    _entry(name, components)
    return str(name).replace("_", "-") + "-client"


def component_auth(name, components=None):
    """How the clients of a component with tls: true authenticate (its `auth` in the map): basic (the stack's client
    user and the credential <component>-client) or client_cert (a certificate of the site CA, no credential)."""
    return _entry(name, components).get("auth", "basic")


def basic_auth_components(names, components=None):
    """The components of a list whose clients present a basic-auth credential (auth basic, the default): the ones
    roles/pki makes a <component>-client credential for and a client installs and sends."""
    return [name for name in names or [] if component_auth(name, components) == "basic"]


def components_flagged(flag, components=None):
    """Every component whose entry in files/components.yml sets `flag` true, sorted ('tls' | hpcobs_components_flagged:
    the ones serving TLS under the site's security switch)."""
    components = load_components() if components is None else components
    return sorted(name for name, entry in components.items() if entry.get(str(flag)) is True)


def component_url(name, hostvars, host, path="", scheme=None, components=None):
    """<scheme>://<address>:<port><path> at which the other hosts reach a component on `host`: the host's address
    (component_address), or the one address the component is bound to when its listen setting names one. The
    scheme is component_scheme's unless given."""
    scheme = scheme or component_scheme(name, hostvars, host, components)
    bound, port = _listen_of(name, hostvars, host, components)
    address = bound if bound not in _ANY else host_address(host, hostvars)
    if ":" in address and not address.startswith("["):
        address = "[%s]" % address
    return "%s://%s:%d%s" % (scheme, address, port, path)


def component_urls(hosts, name, hostvars, path="", scheme=None, components=None):
    """component_url of every host of a list."""
    return [component_url(name, hostvars, host, path, scheme, components) for host in hosts or []]


def component_local_url(name, hostvars, host, path="", scheme=None, components=None):
    """URL at which `host` itself reaches a component it runs (127.0.0.1 when it listens on every address)."""
    scheme = scheme or component_scheme(name, hostvars, host, components)
    bound, port = _listen_of(name, hostvars, host, components)
    return probe_url(listen_join(bound, port) if bound else ":%d" % port, path, scheme == "https")


def pki_path(relative="", pki_dir=""):
    """A path in the controller's site PKI directory: pki_dir (the global hpcobs_pki_dir) when set, else the map's
    shared `pki_dir`, with ~ expanded ("" gives the directory itself)."""
    base = os.path.expanduser(str(pki_dir or shared_fact("pki_dir")))
    relative = str(relative or "")
    if relative.startswith("/") or ".." in relative.split("/"):
        raise AnsibleFilterError("%r is not a path inside the PKI directory" % (relative,))
    return os.path.join(base, relative) if relative else base


def client_password(name, pki_dir=""):
    """The password a client of component `name` presents (the site PKI's credential client_credential(name)), read
    on the controller; a clear error when the PKI has not made it yet."""
    path = pki_path("credentials/" + client_credential(name), pki_dir)
    try:
        with open(path, encoding="utf-8") as handle:
            value = handle.read().strip()
    except OSError as err:
        raise AnsibleFilterError("the credential %s cannot be read (%s): run playbooks/pki.yml (roles/pki) first"
                                 % (path, err.strerror)) from None
    if not value:
        raise AnsibleFilterError("the credential %s is empty: remove it and run playbooks/pki.yml" % path)
    return value


_FRONT_USER = re.compile(r"^[A-Za-z0-9_.-]+$")


def front_config(routes, user="", password=""):
    """The auth config of a vmauth front (roles/service tasks_from: vmauth_front): its routes (a list of url_map
    entries, each with src_paths and url_prefix) for one user with its password (the site's security switch: any
    request without them is answered 401 before a route is looked at), or for anybody without a user. A path no route
    names is answered 400 by vmauth. The password is a site PKI credential read on the controller: it is never put
    in a message."""
    if not isinstance(routes, (list, tuple)) or not routes:
        raise AnsibleFilterError("hpcobs_front_config: the routes must be a non-empty list")
    for route in routes:
        if not isinstance(route, dict) or not route.get("src_paths") or not str(route.get("url_prefix", "")).startswith(
                ("http://", "https://")):
            raise AnsibleFilterError("hpcobs_front_config: each route needs src_paths and an http(s) url_prefix, got %s"
                                     % json.dumps(route, default=str))
    user, password = str(user or ""), str(password or "").strip()
    if user and not _FRONT_USER.match(user):
        raise AnsibleFilterError("hpcobs_front_config: the client user %r must be letters, digits, . _ -" % (user,))
    if user and (len(password) < 16 or any(char in password for char in "\n\r\0")):
        raise AnsibleFilterError("hpcobs_front_config: the client credential of %s is not one line of 16 or more "
                                 "characters (run playbooks/pki.yml, roles/pki)" % user)
    url_map = [dict(route) for route in routes]
    if user:
        return {"users": [{"username": user, "password": password, "url_map": url_map}]}
    return {"unauthorized_user": {"url_map": url_map}}


def peer_names(host, hostvars, components=None):
    """The peer_name of every component (files/components.yml) whose groups the host is in (its group_names)."""
    components = load_components() if components is None else components
    hv = hostvars[host] if host in hostvars else {}
    groups = set(hv.get("group_names") or [])
    return [entry["peer_name"] for _, entry in sorted(components.items())
            if entry.get("peer_name") and groups & set(entry.get("groups") or [])]


_CREDENTIAL = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_HOST_IN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def pki_host_credential(name, host):
    """The file name (under <pki_dir>/credentials/) of a per-host credential: <name>-<inventory name>."""
    name, host = str(name), str(host)
    if not _CREDENTIAL.match(name):
        raise AnsibleFilterError("%r is not a credential name (lower-case letters, digits and dashes)" % (name,))
    if not _HOST_IN_NAME.match(host) or ".." in host:
        raise AnsibleFilterError("%r cannot name a credential file (letters, digits, . - _ only)" % (host,))
    return "%s-%s" % (name, host)


def pki_host_credentials(names, hosts):
    """Every per-host credential file name: pki_host_credential of each name of `names` for each host of `hosts`
    (name by name, hosts in their order, each once)."""
    if isinstance(names, str) or isinstance(hosts, str):
        raise AnsibleFilterError("per-host credentials take a list of names and a list of hosts")
    files = []
    for name in names or []:
        for host in hosts or []:
            credential = pki_host_credential(name, host)
            if credential not in files:
                files.append(credential)
    return files


def pki_sans(host, hostvars, components=None):
    """Subject alternative names of a host's certificate: its inventory name, ansible_host, the address the
    other hosts reach it at (host_address), then 127.0.0.1 and localhost (clients on the host itself), then the
    peer_name of each component the host's groups run (peer_names), each once, IPv6 addresses without brackets."""
    hv = hostvars[host] if host in hostvars else {}
    names = []
    for value in [host, hv.get("ansible_host"), host_address(host, hostvars), "127.0.0.1", "localhost"] + peer_names(
            host, hostvars, components):
        value = str(value or "").strip()
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1]
        if not value:
            continue
        if not re.match(r"^[A-Za-z0-9_.:-]+$", value):
            raise AnsibleFilterError("%s: %r cannot be a certificate name (letters, digits, . - _ : only)" % (host, value))
        if value not in names:
            names.append(value)
    return names


def pki_hosts_sans(hosts, hostvars):
    """{host: pki_sans} of every host of a list (the PKI role's one call for the whole inventory)."""
    return {str(host): pki_sans(host, hostvars) for host in hosts or []}


def scrape_targets(job_name, job, groups, hostvars, components=None):
    """file_sd targets of one VictoriaMetrics scrape job: one entry per host of the job's groups (else its
    component's) and hosts (each host once), at the host's address and the job's port, else the port the job's
    component has on that host, labelled `node` = the short host name."""
    components = load_components() if components is None else components
    if "groups" in job:
        job_groups = job["groups"]
    elif job.get("component") in components:
        job_groups = components[job["component"]]["groups"]
    elif job.get("component"):
        _entry(job["component"], components)  # names the known components
    else:
        job_groups = []
    hosts = []
    for group in job_groups or []:
        hosts.extend(groups.get(group) or [])
    if job.get("slurm_native"):
        hosts = [host for host in hosts if slurm_native_active(hostvars[host] if host in hostvars else {})]
    targets, seen = [], set()
    for host in hosts + list(job.get("hosts") or []):
        if host in seen:
            continue
        seen.add(host)
        if job.get("port"):
            address = "%s:%d" % (host_address(host, hostvars), int(job["port"]))
        elif job.get("component"):
            address = component_url(job["component"], hostvars, host, components=components).split("://", 1)[1]
        else:
            raise AnsibleFilterError("scrape job %s has neither a port nor a component with one" % job_name)
        targets.append({"targets": [address], "labels": {"node": str(host).split(".")[0]}})
    return targets


METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
JOB_LABEL_MARK = "__tmp_hpcobs_job_field"


def job_label_relabel(fields, label="hpc_job"):
    """metric_relabel_configs that keep `label` only on the metrics named in `fields` and remove it from every other
    metric of the job. dcgm-exporter puts hpc_job on every field of a GPU a Slurm job holds, so each job starts a new
    copy of every series of its GPUs; kept on the fields that attribute use to jobs, a job costs a few series per GPU
    instead of one per field. Prometheus' own relabelling (no VictoriaMetrics-only `if`), so vmagent, VictoriaMetrics
    and a Prometheus fed the same scrape.yml agree: mark the kept metrics, empty the label elsewhere (an empty value
    removes a label), drop the mark."""
    if isinstance(fields, str) or not isinstance(fields, (list, tuple)) or not fields:
        raise AnsibleFilterError("the fields that keep %s must be a non-empty list of metric names, got %r"
                                 % (label, fields))
    bad = [field for field in fields if not isinstance(field, str) or not METRIC_NAME.match(field)]
    if bad:
        raise AnsibleFilterError("not a metric name (fields that keep %s): %s" % (label, ", ".join(map(repr, bad))))
    if not isinstance(label, str) or not re.match(r"^[a-zA-Z_][a-zA-Z0-9_]*$", label) or label.startswith("__"):
        raise AnsibleFilterError("not a label name: %r" % (label,))
    names = sorted(set(fields))
    return [
        {"source_labels": ["__name__"], "regex": "|".join(names), "target_label": JOB_LABEL_MARK,
         "replacement": "1"},
        {"source_labels": [JOB_LABEL_MARK], "regex": "", "target_label": label, "replacement": ""},
        {"action": "labeldrop", "regex": JOB_LABEL_MARK},
    ]


def slurm_native_active(hv):
    """Whether slurmctld on a controller serves its own metrics: hpcobs_slurm_native_metrics false never; else
    what the slurm_metrics role decided in this run (slurm_metrics_native_active); else true; else (auto) what it
    recorded on the controller in an earlier run (the local fact hpcobs_slurm_metrics.native)."""
    mode = str(hv.get("hpcobs_slurm_native_metrics", "auto")).lower()
    if mode == "false":
        return False
    if "slurm_metrics_native_active" in hv:
        return _truthy(hv["slurm_metrics_native_active"])
    if mode == "true":
        return True
    local = (hv.get("ansible_local") or {}).get("hpcobs_slurm_metrics") or {}
    return _truthy(local.get("native", False))


def _truthy(value):
    return value is True or str(value).strip().lower() in ("true", "yes", "1", "on")


# The Slurm JWT that VictoriaMetrics presents to slurmctld's metrics where slurm.conf restricts them to
# MetricsAuthUsers (roles/slurm_metrics decides per controller; roles/victoriametrics mints, keeps and renews it).
# slurmctld takes it as `Authorization: Bearer <token>` (Slurm 26.05 src/plugins/auth/jwt/http_auth_jwt.c);
# `scontrol token username=<user> lifespan=<seconds>` mints it (root or SlurmUser where the JWT key is) and prints
# `SLURM_JWT=<token>`. A JWT is three base64url parts; the middle one is JSON whose `exp` ends the token's life.
_JWT = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$")
_MINTED = re.compile(r"^SLURM_JWT=(\S+)\s*$", re.M)


def slurm_token_user(hv):
    """The user whose token VictoriaMetrics presents to slurmctld on a controller ("" when it needs none): this
    run's decision of the slurm_metrics role (slurm_metrics_token_user_active), else what it recorded on the
    controller (local fact hpcobs_slurm_metrics.token_user); only where slurmctld serves its own metrics."""
    if not slurm_native_active(hv):
        return ""
    if "slurm_metrics_native_active" in hv:
        return str(hv.get("slurm_metrics_token_user_active") or "")
    local = (hv.get("ansible_local") or {}).get("hpcobs_slurm_metrics") or {}
    return str(local.get("token_user") or "")


def slurm_token_plan(controllers, hostvars):
    """{"hosts": the controllers whose slurmctld asks VictoriaMetrics for a token, "user": the user of that token,
    "problem": why no single token serves them, or ""}. One cluster shares one JWT key, so one token of one user
    serves every controller of it."""
    users = {}
    for host in controllers or []:
        user = slurm_token_user(hostvars[host] if host in hostvars else {})
        if user:
            users[host] = user
    plan = {"hosts": sorted(users), "user": "", "problem": ""}
    distinct = sorted(set(users.values()))
    if len(distinct) > 1:
        plan["problem"] = ("the Slurm controllers ask for tokens of different users (%s); VictoriaMetrics presents "
                           "one token to all of them: set the same slurm_metrics_token_user for every controller"
                           % ", ".join("%s: %s" % item for item in sorted(users.items())))
    elif distinct:
        plan["user"] = distinct[0]
    return plan


def slurm_token_expiry(token):
    """`exp` of a JWT (seconds since the epoch), 0 when the text is no JWT with one."""
    token = str(token or "").strip()
    if not _JWT.match(token):
        return 0
    payload = token.split(".")[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (binascii.Error, ValueError):
        return 0
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return int(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool) else 0


def slurm_token_due(slurped, renew_days, now=None):
    """Whether a new token is needed: a host has none (its slurp failed or was skipped), or one that is no JWT, or
    one that ends within renew_days. slurped: the registered slurp results of every management host."""
    now = time.time() if now is None else now
    limit = now + int(renew_days) * 86400
    for result in slurped or []:
        content = (result or {}).get("content")
        if not content:
            return True
        try:
            text = base64.b64decode(content).decode("ascii")
        except (binascii.Error, ValueError, UnicodeDecodeError):
            return True
        if slurm_token_expiry(text) <= limit:
            return True
    return False


def slurm_token_minted(stdout):
    """The token of `scontrol token` output (SLURM_JWT=<token>); anything else is an error, never written."""
    match = _MINTED.search(str(stdout or ""))
    if not match or not _JWT.match(match.group(1)):
        raise AnsibleFilterError("scontrol token printed no SLURM_JWT=<token> line (is AuthAltTypes=auth/jwt set and "
                                 "the JWT key readable by slurmctld?)")
    return match.group(1)


def tls_files(tls_dir, group, ca, cert="", key="", server=True, credentials=(), pki_dir="",
              credentials_mode="0640"):
    """The hpcobs_files entries of a service's TLS set (roles/service tasks_from: tls): the site CA (0644), with
    `server` the host's certificate (0644) and key (0640), and each credential of the site PKI (`credentials_mode`),
    all root:<group> in `tls_dir`. A name that is not a plain file name is refused (it would write elsewhere)."""
    if not str(tls_dir).startswith("/"):
        raise AnsibleFilterError("service_tls_dir must be an absolute path, got %r" % (tls_dir,))
    if not group:
        raise AnsibleFilterError("service_group is empty: the TLS files are root:<service_group>")
    entries = [("ca.crt", ca, "0644")]
    if server:
        entries += [("server.crt", cert, "0644"), ("server.key", key, "0640")]
    for name in credentials or []:
        name = str(name)
        if not name or "/" in name or name in (".", ".."):
            raise AnsibleFilterError("service_tls_credentials: %r is not a credential name" % (name,))
        entries.append((name, "%s/credentials/%s" % (str(pki_dir).rstrip("/"), name), str(credentials_mode)))
    for name, src, _ in entries:
        if not src:
            raise AnsibleFilterError("no source for %s of %s" % (name, tls_dir))
    return [{"dest": "%s/%s" % (str(tls_dir).rstrip("/"), name), "src": str(src), "owner": "root",
             "group": str(group), "mode": mode} for name, src, mode in entries]


def tree(paths, dest_root, mode="0644", dir_mode="0755", owner="root", group="root"):
    """The hpcobs_files entries that install files of a role's files/ (paths relative to it, e.g.
    "pkg/data/x.txt") under dest_root, keeping their layout: {"directories": dest_root and every parent under it,
    "files": [{src, dest, ...}]}. A path that is absolute or climbs out ("..") is refused."""
    root = str(dest_root).rstrip("/")
    if not root.startswith("/"):
        raise AnsibleFilterError("the destination %r is not an absolute path" % (dest_root,))
    directories, files = [root], []
    for path in paths:
        parts = str(path).split("/")
        if str(path).startswith("/") or any(part in ("", ".", "..") for part in parts):
            raise AnsibleFilterError("%r is not a plain relative path under the role's files/" % (path,))
        for depth in range(1, len(parts)):
            directory = "/".join([root] + parts[:depth])
            if directory not in directories:
                directories.append(directory)
        files.append({"src": str(path), "dest": "/".join([root] + parts), "owner": owner, "group": group,
                      "mode": mode})
    return {"directories": [{"path": d, "owner": owner, "group": group, "mode": dir_mode} for d in directories],
            "files": files}


def directory_entries(dirs, group, owner="root", mode="0755"):
    """A role's service_dirs ([{path, owner, group, mode}], roles/service tasks_from: account; a plain path stands
    for {path}) as hpcobs_files directories, each missing key given its default (owner root, the service's group,
    0755); an entry without a path or with another key is refused, naming it."""
    if not isinstance(dirs, list):
        raise AnsibleFilterError("service_dirs must be a list of {path, owner, group, mode}, got %r" % (dirs,))
    entries = []
    for entry in dirs:
        if isinstance(entry, str):
            entry = {"path": entry}
        if not isinstance(entry, dict) or not entry.get("path"):
            raise AnsibleFilterError("service_dirs: %r has no path" % (entry,))
        unknown = sorted(set(entry) - {"path", "owner", "group", "mode"})
        if unknown:
            raise AnsibleFilterError("service_dirs: %s has unknown keys %s (allowed: path, owner, group, mode)"
                                     % (entry["path"], ", ".join(unknown)))
        entries.append({"path": str(entry["path"]), "owner": entry.get("owner", owner),
                        "group": entry.get("group", group), "mode": str(entry.get("mode", mode))})
    return entries


class FilterModule:
    def filters(self):
        return {
            "hpcobs_slurm_token_plan": slurm_token_plan,
            "hpcobs_slurm_token_expiry": slurm_token_expiry,
            "hpcobs_slurm_token_due": slurm_token_due,
            "hpcobs_slurm_token_minted": slurm_token_minted,
            "hpcobs_basic_auth_components": basic_auth_components,
            "hpcobs_client_credential": client_credential,
            "hpcobs_component_auth": component_auth,
            "hpcobs_client_password": client_password,
            "hpcobs_component_hosts": component_hosts,
            "hpcobs_components_flagged": components_flagged,
            "hpcobs_component_listen": component_listen,
            "hpcobs_component_local_url": component_local_url,
            "hpcobs_component_names": component_names,
            "hpcobs_cert_names": cert_names,
            "hpcobs_component_peer_name": component_peer_name,
            "hpcobs_component_port": component_port,
            "hpcobs_component_scheme": component_scheme,
            "hpcobs_component_url": component_url,
            "hpcobs_component_urls": component_urls,
            "hpcobs_components_problem": components_problem,
            "hpcobs_deployed_components": deployed_components,
            "hpcobs_front_config": front_config,
            "hpcobs_tls_files": tls_files,
            "hpcobs_tree": tree,
            "hpcobs_directory_entries": directory_entries,
            "hpcobs_host_address": host_address,
            "hpcobs_scrape_targets": scrape_targets,
            "hpcobs_job_label_relabel": job_label_relabel,
            "hpcobs_peer_names": peer_names,
            "hpcobs_pki_host_credential": pki_host_credential,
            "hpcobs_pki_host_credentials": pki_host_credentials,
            "hpcobs_pki_hosts_sans": pki_hosts_sans,
            "hpcobs_pki_path": pki_path,
            "hpcobs_pki_sans": pki_sans,
            "hpcobs_secured_components": secured_components,
            "hpcobs_security_enabled": security_enabled,
            "hpcobs_shared": shared_fact,
            "hpcobs_listen_problem": listen_problem,
            "hpcobs_listen_join": listen_join,
            "hpcobs_listen_port": listen_port,
            "hpcobs_metric_sum": metric_sum,
            "hpcobs_probe_host": probe_host,
            "hpcobs_probe_url": probe_url,
            "hpcobs_systemd_word": systemd_word,
        }
