"""The auth config of the vmauth front roles/loki puts before Loki when the site's security switch is on
(unit-tested in tests/test_loki_front.py; its routes against the real vmauth in molecule/logs).

Loki (3.7) has no authentication of its own. With hpcobs_security, Loki listens on loopback and vmauth (from the
VictoriaMetrics utilities of the bundle) on Loki's public address with TLS, one user per log-shipping host (the
inventory name, its password the host's credential loki-push-<host>) allowed only the push path, and the stack's
reader (hpcobs_client_user, credential loki-client) allowed the read API, the ruler's read-only Prometheus-style
listing and /metrics (the scrape job loki). vmauth matches each src_paths entry as a regular expression against the
whole request path (anchored at both ends), so no other path of Loki is reachable: not the ruler's write API
(/loki/api/v1/rules), deletion (/loki/api/v1/delete, /compactor), /config, /services, the ring pages or pprof; a
request no route of its user takes is answered 400 by vmauth, one without valid credentials 401.
Passwords are read here, on the controller, from the site PKI (roles/pki): the file that holds them is written 0640
root:loki without diff and never shown.
"""

from __future__ import annotations

import os
import re

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - the unit tests import this file without Ansible
    class AnsibleFilterError(Exception):
        pass

# What a log shipper may do: push (Promtail and Alloy both push to /loki/api/v1/push).
PUSH_PATHS = ["/loki/api/v1/push"]
# What the reader may do: Loki's query API (pkg/loki/modules.go, 3.7: the querier and query-frontend routes), the
# ruler's read-only listing in the Prometheus format, readiness and Loki's own metrics.
READ_PATHS = [
    "/loki/api/v1/(query|query_range|labels|series|tail|format_query|detected_labels|detected_fields|patterns)",
    "/loki/api/v1/label/[^/]+/values",
    "/loki/api/v1/index/(stats|volume|volume_range|shard)",
    "/prometheus/api/v1/(rules|alerts)",
    "/ready",
    "/metrics",
]
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_LOOPBACK = re.compile(r"^(127\.[0-9.]+|\[::1\]|localhost):[0-9]{1,5}$")


def _read(path, what):
    try:
        with open(path, encoding="utf-8") as handle:
            value = handle.read().strip()
    except OSError as err:
        raise AnsibleFilterError("loki front: cannot read %s (%s): %s; run playbooks/pki.yml (roles/pki) first"
                                 % (what, path, err.strerror)) from None
    if len(value) < 16 or any(char in value for char in "\n\r\0"):
        raise AnsibleFilterError("loki front: %s (%s) is not a credential of 16 or more characters on one line"
                                 % (what, path))
    return value


def front_problems(push_hosts, reader_user, backend_listen):
    """What is wrong with the front's inputs: the push users (inventory names), the reader's name and the
    loopback address of Loki behind the front ([] when nothing is)."""
    problems = []
    if not isinstance(push_hosts, (list, tuple)):
        return ["the push hosts must be a list of inventory names"]
    for host in push_hosts:
        if not isinstance(host, str) or not _HOST.match(host):
            problems.append("%r cannot be a push user of Loki's front (letters, digits, . - _)" % (host,))
        elif host == reader_user:
            problems.append("host %s has the name of the reader %s: the two users would clash at Loki's front"
                            % (host, reader_user))
    if not isinstance(reader_user, str) or not _HOST.match(reader_user):
        problems.append("the reader's user name %r must be letters, digits, . - _" % (reader_user,))
    if not _LOOPBACK.match(str(backend_listen)):
        problems.append("Loki behind its front must listen on loopback (127.0.0.1:<port>), not %r" % (backend_listen,))
    return problems


def front_config(push_hosts, reader_user, backend_listen, pki_dir, push_credential="loki-push",
                 reader_credential="loki-client"):
    """vmauth's auth config: the reader with READ_PATHS, every push host whose credential the site PKI holds with
    PUSH_PATHS, all to Loki on backend_listen. A host without a credential yet (a --limit run of the PKI) gets no
    user: it cannot push until the PKI has made its credential."""
    problems = front_problems(push_hosts, reader_user, backend_listen)
    if problems:
        raise AnsibleFilterError("loki front: " + "; ".join(problems))
    backend = "http://%s" % backend_listen
    credentials = os.path.join(os.path.expanduser(str(pki_dir)), "credentials")
    users = [{"username": reader_user,
              "password": _read(os.path.join(credentials, reader_credential), "the reader's credential"),
              "url_map": [{"src_paths": list(READ_PATHS), "url_prefix": backend}]}]
    for host in sorted(set(push_hosts)):
        path = os.path.join(credentials, "%s-%s" % (push_credential, host))
        if not os.path.exists(path):
            continue
        users.append({"username": host, "password": _read(path, "the push credential of %s" % host),
                      "url_map": [{"src_paths": list(PUSH_PATHS), "url_prefix": backend}]})
    return {"users": users}


class FilterModule:
    def filters(self):
        return {"loki_front_config": front_config, "loki_front_problems": front_problems}
