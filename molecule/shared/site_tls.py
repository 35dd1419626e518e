"""HTTPS from the controller to the scenario containers, the way the stack's own clients reach them (imported by the
scenarios' tests; no tests here).

The controller does not resolve the containers' names, and the site certificates name the hosts, not their podman
addresses: a connection goes to the address and verifies the certificate for the container's name.
"""
import base64
import http.client
import os
import socket
import ssl
import urllib.request


def pki(relative):
    """A file of the scenario's site PKI on the controller (every scenario sets hpcobs_pki_dir to
    <ephemeral directory>/pki)."""
    return os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "pki", relative)


def credential(name):
    """A generated credential of the site PKI (what the controller holds)."""
    with open(pki("credentials/%s" % name), encoding="utf-8") as handle:
        return handle.read().strip()


def basic(user, secret):
    return "Basic " + base64.b64encode(("%s:%s" % (user, secret)).encode()).decode()


def _connection(names):
    class NamedHTTPSConnection(http.client.HTTPSConnection):
        """HTTPS to an address, its certificate verified for the name `names` gives that address."""

        def connect(self):
            sock = socket.create_connection((self.host, self.port), self.timeout)
            self.sock = self._context.wrap_socket(sock, server_hostname=names().get(self.host, self.host))

    return NamedHTTPSConnection


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, context, names, authorization=None):
        super().__init__(context=context)
        self._tls, self._authorization, self._conn = context, authorization, _connection(names)

    def https_open(self, req):
        if self._authorization and not req.has_header("Authorization"):
            req.add_unredirected_header("Authorization", self._authorization)
        return self.do_open(self._conn, req, context=self._tls)


def opener(names, ca=None, user=None, password=None):
    """A urllib opener for the containers' HTTPS: trusting `ca` (default the site CA), each address verified for the
    name names() maps it to, with basic auth when a user is given. Plain http:// URLs go through unchanged."""
    context = ssl.create_default_context(cafile=ca or pki("ca.crt"))
    token = basic(user, password) if user is not None else None
    return urllib.request.build_opener(_HTTPSHandler(context, names, token))
