"""Which dcgm-exporter release the simulator behaves like (--emulate).

Taken from NVIDIA/dcgm-exporter (release tags are <DCGM version>-<exporter version>):

* up to 4.7.x (last: 4.4.2-4.7.1): /health answers 200 with the body "KO" (MetricsServer.Health in
  internal/pkg/server/server.go writes "KO" unconditionally); the host label is "Hostname"
  (internal/pkg/rendermetrics/render_metrics.go).
* 4.8.x (4.5.1-4.8.0 to 4.5.3-4.8.2, the newest release): /health answers 200 "OK" with the header
  "X-Registry-Available: true" ("Fix Health Endpoint Behavior", #605, released in 4.5.1-4.8.0); still "Hostname".
* main (unreleased, after 4.5.3-4.8.2): as 4.8.x, and the label is "hostname" (commit d5e5f51, "Rename Hostname
  label to hostname", #655).

The release tag itself (e.g. "4.5.3-4.8.2") or an exporter version ("4.8.2") is accepted and mapped to its row.
"""

import collections
import re

from .common import ConfigError

Emulation = collections.namedtuple("Emulation", "name hostname_label health_body health_headers")

EMULATIONS = {
    "4.7": Emulation("4.7", "Hostname", b"KO", ()),
    "4.8": Emulation("4.8", "Hostname", b"OK", (("X-Registry-Available", "true"),)),
    "main": Emulation("main", "hostname", b"OK", (("X-Registry-Available", "true"),)),
}
DEFAULT_EMULATION = "4.8"
CHOICES = tuple(EMULATIONS)

_VERSION_RE = re.compile(r"(?:[0-9]+\.[0-9]+\.[0-9]+-)?([0-9]+)\.([0-9]+)(?:\.[0-9]+)?")


def resolve_emulation(text):
    """The Emulation for "4.7", "4.8", "main", an exporter version ("4.6.0") or a release tag ("4.4.1-4.6.0")."""
    text = str(text).strip()
    if text in EMULATIONS:
        return EMULATIONS[text]
    match = _VERSION_RE.fullmatch(text)
    if match:
        major, minor = int(match.group(1)), int(match.group(2))
        if (major, minor) <= (4, 7):
            return EMULATIONS["4.7"]
        if (major, minor) == (4, 8):
            return EMULATIONS["4.8"]
    raise ConfigError("emulate must be one of %s, an exporter version up to 4.8.x or a release tag like "
                      "4.5.3-4.8.2 (got %r); releases after 4.8.x are not known yet, use \"main\""
                      % (", ".join(CHOICES), text))
