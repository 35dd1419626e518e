"""Constants, logging and small helpers shared by every module."""

import contextlib
import json
import os
import sys
import tempfile
import threading
import time


VERSION = "1.1.0"
PROG = "hpcobs-gpusim"

DEFAULT_COLLECTORS = "/etc/dcgm-exporter/default-counters.csv"
DEFAULT_ADDRESS = ":9400"
DEFAULT_INTERVAL_MS = 30000
DEFAULT_CONFIG = "/etc/hpcobs-gpusim/config.json"
DEFAULT_STATE_DIR = "/var/lib/hpcobs-gpusim"
DEFAULT_GPUS = 4
DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
DEFAULT_DRIVER = "550.127.05"
DEFAULT_KMSG = "/dev/kmsg"

FAULTS_FILE = "faults.json"
STATE_FILE = "state.json"
TOPOLOGY_FILE = "topology.json"
LOCK_FILE = ".faults.lock"

# ---------------------------------------------------------------------------
# Logging (logfmt on stderr, close to the real exporter's text handler)
# ---------------------------------------------------------------------------

_log_lock = threading.Lock()
_debug = False


def set_debug(enabled):
    global _debug
    _debug = bool(enabled)


def log(level, msg, **kv):
    if level == "DEBUG" and not _debug:
        return
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    parts = ["time=%sZ" % ts, "level=%s" % level, "msg=%s" % json.dumps(msg)]
    for key, value in kv.items():
        parts.append("%s=%s" % (key, json.dumps(str(value))))
    with _log_lock:
        sys.stderr.write(" ".join(parts) + "\n")
        sys.stderr.flush()


class ConfigError(Exception):
    pass


def atomic_write(path, text, mode=0o644, fsync=True):
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".%s." % os.path.basename(path),
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
