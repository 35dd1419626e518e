"""What every service role derives the same way: the address its readiness probe uses, its port, and ExecStart
words quoted for systemd. Pure functions, unit-tested in tests/test_service_filters.py.
"""

import re

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


class FilterModule:
    def filters(self):
        return {
            "hpcobs_listen_problem": listen_problem,
            "hpcobs_listen_join": listen_join,
            "hpcobs_listen_port": listen_port,
            "hpcobs_metric_sum": metric_sum,
            "hpcobs_probe_host": probe_host,
            "hpcobs_probe_url": probe_url,
            "hpcobs_systemd_word": systemd_word,
        }
