"""The allow-list of BMC targets of roles/ipmi_exporter's remote mode (unit-tested in tests/test_ipmi_front.py).

ipmi_exporter 1.10.1 scrapes whatever `/ipmi?target=` names (main.go, remoteIPMIHandler: only the module is looked
up) and sends that module's BMC user and password to it. With remote modules, the role therefore puts the exporter
on a loopback port and vmauth (from the VictoriaMetrics release of the bundle) on the exporter's address, with one
route per allow-listed BMC: the request must carry `target=<that BMC>`, and the route's own query arguments replace
the request's `target` and `module` (vmauth merges url_prefix query arguments over the request's), so
`?target=evil&target=<allowed>` reaches the exporter as the allowed BMC alone, with the module the inventory gives
it. Any other request is answered 400 by vmauth before the exporter sees it.

Under the site's security switch the front serves TLS (the role's vmauth flags) and the routes belong to one user,
the stack's client user (hpcobs_client_user) with the credential ipmi-exporter-client: a request without that user
and password is answered 401 before any route is looked at. The password is read on the controller; the file that
holds it is written 0640 root:ipmi_exporter without diff and never shown.
"""

from __future__ import annotations

import json
import re
from urllib.parse import urlencode

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - the unit tests import this file without Ansible
    class AnsibleFilterError(Exception):
        pass

# a host name ("_" too: container and some site names have it), an IPv4 address or a bracketed IPv6 address, with
# an optional port
TARGET = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)(:[0-9]{1,5})?$")
LOOPBACK = re.compile(r"^(127\.[0-9.]+|\[::1\]|localhost):[0-9]{1,5}$")
USER = re.compile(r"^[A-Za-z0-9_.-]+$")


def target_problems(targets, modules, backend_listen=""):
    """Problems of ipmi_exporter_remote_targets ({module: [BMC address, ...]}) against the remote modules, and of
    the exporter's loopback address behind the front."""
    if not isinstance(targets, dict):
        return ["ipmi_exporter_remote_targets must map remote module names to lists of BMC addresses, got %s"
                % json.dumps(targets, default=str)]
    problems, seen = [], {}
    for module in sorted(targets, key=str):
        if module not in (modules or {}):
            problems.append("ipmi_exporter_remote_targets: %s is not a module of ipmi_exporter_remote_modules"
                            % json.dumps(module, default=str))
        listed = targets[module]
        if not isinstance(listed, (list, tuple)):
            problems.append("ipmi_exporter_remote_targets[%s] must be a list of BMC addresses, got %s"
                            % (json.dumps(module, default=str), json.dumps(listed, default=str)))
            continue
        for target in listed:
            if not isinstance(target, str) or not TARGET.match(target):
                problems.append("ipmi_exporter_remote_targets[%s]: %s is not a BMC host name or address "
                                "(host, IPv4, [IPv6], optionally :port)" % (json.dumps(module, default=str),
                                                                             json.dumps(target, default=str)))
            elif target in seen:
                problems.append("ipmi_exporter_remote_targets: BMC %s is listed under %s and %s (a BMC has one set of "
                                "credentials: list it once)" % (target, seen[target], module))
            else:
                seen[target] = module
    if modules and not LOOPBACK.match(str(backend_listen)):
        problems.append("ipmi_exporter_backend_listen_address must be a loopback address with a port (such as "
                        "127.0.0.1:9291): the exporter behind the front must not be reachable from other hosts, got %s"
                        % json.dumps(backend_listen, default=str))
    return problems


def front_config(targets, backend_listen, user="", password=""):
    """vmauth's auth config: /metrics as is (the local BMC; with the local mode off, module "default" has no
    collectors and probes nothing), /ipmi only for each allow-listed BMC. With a user (the security switch), only
    that user with that password reaches the routes; without one, anybody does."""
    if target_problems(targets, {m: {} for m in targets} or {"": {}}, backend_listen):
        raise AnsibleFilterError("hpcobs_ipmi_front_config: the targets were not checked (hpcobs_ipmi_target_problems)")
    user, password = str(user or ""), str(password or "").strip()
    if user and not USER.match(user):
        raise AnsibleFilterError("hpcobs_ipmi_front_config: the client user %r must be letters, digits, . _ -" % (user,))
    if user and (len(password) < 16 or any(char in password for char in "\n\r\0")):
        # the value is never shown: it is a credential
        raise AnsibleFilterError("hpcobs_ipmi_front_config: the client credential of %s is not one line of 16 or more "
                                 "characters (run playbooks/pki.yml, roles/pki)" % user)
    backend = "http://%s" % backend_listen
    url_map = [{"src_paths": ["/metrics"], "url_prefix": backend}]
    for module in sorted(targets):
        for target in targets[module]:
            url_map.append({"src_paths": ["/ipmi"], "src_query_args": ["target=%s" % target],
                            "url_prefix": "%s?%s" % (backend, urlencode([("module", module), ("target", target)]))})
    if user:
        return {"users": [{"username": user, "password": password, "url_map": url_map}]}
    return {"unauthorized_user": {"url_map": url_map}}


class FilterModule:
    def filters(self):
        return {"hpcobs_ipmi_target_problems": target_problems, "hpcobs_ipmi_front_config": front_config}
