"""The auth config of VictoriaMetrics' read-only front (roles/victoriametrics, hpcobs_security), unit-tested in
tests/test_vm_reader_front.py against the real vmauth and victoria-metrics.

VictoriaMetrics single-node knows one user (-httpAuth.*), and that user may also import samples. The people's own
tools on the Slurm hosts (hpcobs-jobstats, hpcobs-report, the job-end summary in Slurm's mail) run as any user, so
their credential is readable by users: it must not be that one. Under the switch a vmauth front (the bundle's
VictoriaMetrics utilities) listens on the component victoriametrics_reader's address with TLS and lets one user
(the stack's client user, its password the credential victoriametrics-reader-client) reach only the read API. It
passes each request on to VictoriaMetrics over HTTPS, verified against the site CA, with the client user's
credential put in by the front (a header of the auth config: the file is 0640 root:victoriametrics, never shown).
vmauth anchors each src_paths entry at both ends and cleans the path before it matches: no write, import, delete,
admin or snapshot path is reachable; a path no route takes is answered 400, a request without valid credentials 401.
"""

from __future__ import annotations

import base64
import os
import re

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - the unit tests import this file without Ansible
    class AnsibleFilterError(Exception):
        pass

# VictoriaMetrics' read API (app/vmselect, Prometheus querying API): instant and range queries, raw export (what
# hpcobs-jobstats reads), series, labels and label values, and the query's metadata. No /api/v1/import*, /write,
# /admin, /snapshot, /-/reload, /flags, /metrics or pprof.
READ_PATHS = [
    "/api/v1/(query|query_range|series|labels|export|status/buildinfo)",
    "/api/v1/label/[^/]+/values",
]
_USER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_BACKEND = re.compile(r"^https?://(127\.[0-9.]+|\[::1\]|localhost):[0-9]{1,5}$")


def _read(path, what):
    try:
        with open(path, encoding="utf-8") as handle:
            value = handle.read().strip()
    except OSError as err:
        raise AnsibleFilterError("victoriametrics reader front: cannot read %s (%s): %s; run playbooks/pki.yml "
                                 "(roles/pki) first" % (what, path, err.strerror)) from None
    if len(value) < 16 or any(char in value for char in "\n\r\0:"):
        raise AnsibleFilterError("victoriametrics reader front: %s (%s) is not a credential of 16 or more characters "
                                 "on one line" % (what, path))
    return value


def reader_front_config(user, backend, ca_file, pki_dir, reader_credential="victoriametrics-reader-client",
                        backend_credential="victoriametrics-client"):
    """vmauth's auth config: `user` (password: the credential reader_credential) may reach READ_PATHS of the
    VictoriaMetrics at `backend` (its loopback URL), which the front calls as `user` with the credential
    backend_credential, verifying its certificate against ca_file."""
    user = str(user or "")
    if not _USER.match(user):
        raise AnsibleFilterError("victoriametrics reader front: the user name %r must be letters, digits, . - _"
                                 % (user,))
    if not _BACKEND.match(str(backend)):
        raise AnsibleFilterError("victoriametrics reader front: VictoriaMetrics must be reached on loopback "
                                 "(https://127.0.0.1:<port>), not %r" % (backend,))
    if not str(ca_file).startswith("/"):
        raise AnsibleFilterError("victoriametrics reader front: the CA file must be an absolute path, not %r"
                                 % (ca_file,))
    credentials = os.path.join(os.path.expanduser(str(pki_dir)), "credentials")
    reader = _read(os.path.join(credentials, reader_credential), "the reader's credential")
    client = _read(os.path.join(credentials, backend_credential), "VictoriaMetrics' client credential")
    token = base64.b64encode(("%s:%s" % (user, client)).encode()).decode()
    # the header on the route (vmauth 1.145: a user-level Authorization header loses to the client's own, which it
    # passes on; a route's header replaces it, checked in tests/test_vm_reader_front.py)
    entry = {"username": user, "password": reader,
             "url_map": [{"src_paths": list(READ_PATHS), "url_prefix": str(backend),
                          "headers": ["Authorization: Basic " + token]}]}
    if str(backend).startswith("https://"):
        # VictoriaMetrics' certificate names the host, 127.0.0.1 among its addresses (roles/pki)
        entry["tls_ca_file"] = str(ca_file)
    return {"users": [entry]}


class FilterModule:
    def filters(self):
        return {"hpcobs_vm_reader_front_config": reader_front_config}
