"""The fault store (faults.json) and the kernel lines of Xid events."""

import contextlib
import fcntl
import json
import math
import os
import random
import shutil
import struct
import subprocess
import time

from .common import DEFAULT_KMSG, FAULTS_FILE, LOCK_FILE, atomic_write, log
from .fields import xid_name
from .identity import kernel_pci_id


# ---------------------------------------------------------------------------
# Fault store
# ---------------------------------------------------------------------------

FAULT_KINDS = {
    "ecc-dbe": "double-bit ECC errors grow",
    "ecc-sbe": "single-bit ECC errors grow",
    "thermal": "overheating, thermal throttling time grows",
    "xid": "an Xid error (needs --code)",
    "hang": "GPU hung: no utilization, memory still allocated",
    "power": "power draw above the enforced limit",
    "pcie": "PCIe link width 16 -> 8, replays grow",
    "offbus": "GPU fell off the bus (Xid 79), vanishes from the output",
    "nvlink": "NVLink CRC/replay/recovery errors grow",
    "row-remap": "uncorrectable rows remapped, remap pending",
    "row-remap-failure": "row remapping failed",
}
DEFAULT_RATES = {"ecc-dbe": 1.0 / 30.0, "ecc-sbe": 0.5, "pcie": 2.0,
                 "nvlink": 5.0, "row-remap": 1.0 / 120.0}


class FaultStoreError(Exception):
    def __init__(self, message, doc=None):
        super().__init__(message)
        self.doc = doc


def empty_faults():
    return {"version": 1, "faults": {}, "retired": {}}


# A counting fault adds `rate` events per second. Bounded so that a count stays an exact integer for centuries
# (2**53 / 1e6 / 86400 / 365 > 280 years) and the fault CLI can always clear what it set.
MAX_RATE = 1e6
RETIRED_KEYS = ("ecc_dbe_agg", "ecc_sbe_agg", "remapped_rows")
MAX_COUNT = 2 ** 53


def check_rate(value):
    """Return `value` as a rate (events per second) or raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("a rate must be a number, got %r" % (value,))
    try:
        rate = float(value)
    except ValueError:
        raise ValueError("a rate must be a number, got %r" % (value,)) from None
    if not math.isfinite(rate) or not 0 < rate <= MAX_RATE:
        raise ValueError("a rate must be a finite number of events per second above 0 and at most %g, got %r"
                         % (MAX_RATE, value))
    return rate


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _fault_problem(kind, entry):
    """Why a stored fault entry cannot be used, or None."""
    if kind not in FAULT_KINDS:
        return "unknown fault kind %r" % kind
    if not isinstance(entry, dict):
        return "%s: not an object" % kind
    if not _number(entry.get("since")) or entry["since"] < 0:
        return "%s: since must be a time stamp, got %r" % (kind, entry.get("since"))
    if entry.get("rate") is not None:
        try:
            check_rate(entry["rate"])
        except ValueError as exc:
            return "%s: %s" % (kind, exc)
    if kind == "xid":
        code = entry.get("code")
        if isinstance(code, bool) or not isinstance(code, int) or not 0 < code < 1000:
            return "xid: code must be 1-999, got %r" % (code,)
    return None


def sanitize_faults(data):
    """A usable fault document from whatever faults.json holds, and the list of what was dropped.

    faults.json is written by the fault CLI but lives in a directory others may write: a hand-edited or hostile
    file must neither make a scrape fail nor stop "fault clear" from repairing it.
    """
    problems = []
    if not isinstance(data, dict):
        return empty_faults(), ["the document is not a JSON object"]
    doc = empty_faults()
    faults = data.get("faults", {})
    if not isinstance(faults, dict):
        problems.append("faults is not an object")
        faults = {}
    for gpu_key, kinds in faults.items():
        if not (isinstance(gpu_key, str) and gpu_key.isdigit() and gpu_key.isascii()) or not isinstance(kinds, dict):
            problems.append("faults[%r]: not a GPU index with an object of faults" % (gpu_key,))
            continue
        for kind, entry in kinds.items():
            problem = _fault_problem(kind, entry)
            if problem:
                problems.append("GPU %s: %s" % (gpu_key, problem))
                continue
            clean = {"since": float(entry["since"])}
            if entry.get("rate") is not None:
                clean["rate"] = check_rate(entry["rate"])
            if kind == "xid":
                clean["code"] = entry["code"]
            doc["faults"].setdefault(gpu_key, {})[kind] = clean
    retired = data.get("retired", {})
    if not isinstance(retired, dict):
        problems.append("retired is not an object")
        retired = {}
    for gpu_key, totals in retired.items():
        if not (isinstance(gpu_key, str) and gpu_key.isdigit() and gpu_key.isascii()) or not isinstance(totals, dict):
            problems.append("retired[%r]: not a GPU index with an object of totals" % (gpu_key,))
            continue
        for key, value in totals.items():
            if key not in RETIRED_KEYS or isinstance(value, bool) or not isinstance(value, int) \
                    or not 0 <= value < MAX_COUNT:
                problems.append("retired GPU %s: %s = %r dropped" % (gpu_key, key, value))
                continue
            doc["retired"].setdefault(gpu_key, {})[key] = value
    return doc, problems


def load_faults(state_dir, strict=True):
    """Read faults.json. Entries that cannot be used are dropped and reported (FaultStoreError.problems).

    With strict, an unreadable file or dropped entries raise FaultStoreError, which carries the usable document
    as .doc when the file could be parsed (None otherwise); without, the usable document (or none) is returned.
    """
    path = os.path.join(state_dir, FAULTS_FILE)
    try:
        with open(path, "r", encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return empty_faults()
    except (OSError, ValueError) as exc:
        if strict:
            raise FaultStoreError("cannot read %s: %s" % (path, exc)) from exc
        return empty_faults()
    doc, problems = sanitize_faults(data)
    if problems and strict:
        raise FaultStoreError("%s: ignored %s" % (path, "; ".join(problems)), doc)
    return doc


def save_faults(state_dir, data):
    atomic_write(os.path.join(state_dir, FAULTS_FILE),
                 json.dumps(data, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def faults_lock(state_dir):
    fd = os.open(os.path.join(state_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def fault_rate(fault, kind):
    return float(fault.get("rate") or DEFAULT_RATES.get(kind, 1.0))


def fault_count(fault, kind, now):
    """Events so far for a counting fault: one at once, then `rate` per second."""
    elapsed = max(0.0, now - float(fault.get("since", now)))
    return min(MAX_COUNT, 1 + int(math.floor(elapsed * fault_rate(fault, kind))))


# ---------------------------------------------------------------------------
# Kernel (journal) lines for Xid events
# ---------------------------------------------------------------------------

_UNKNOWN_PROC = "pid='<unknown>', name=<unknown>"


def xid_kernel_message(code, pci_bus_id, pid=None, process=None, rng=None):
    """The text NVRM prints for Xid `code` on the GPU at `pci_bus_id`."""
    rng = rng or random.Random()
    proc = "pid=%d, name=%s" % (pid if pid else rng.randint(2000, 99999),
                                process or "python3")
    hexwords = " ".join("%08x" % rng.getrandbits(32) for _ in range(8))
    texts = {
        8: (proc, "Channel 0x00000010 killed: GPU stopped processing"),
        13: (proc, "Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0): Out Of Range Address"),
        31: (proc, "channel 0x00000018, intr 10000000. MMU Fault: ENGINE GRAPHICS "
                   "GPCCLIENT_T1_2 faulted @ 0x7f4e_c2a00000. Fault is of type "
                   "FAULT_PDE ACCESS_TYPE_VIRT_READ"),
        43: (proc, "channel 0x00000010"),
        45: (proc, "channel 0x00000010"),
        48: (_UNKNOWN_PROC, "An uncorrectable double bit error (DBE) has been detected on "
                            "GPU in the framebuffer at partition 6, subpartition 0."),
        61: (_UNKNOWN_PROC, "0cec(3098) 00000000 00000000"),
        62: (_UNKNOWN_PROC, hexwords),
        63: (_UNKNOWN_PROC, "Row Remapper: New row (0x00000000003a6f0e) was marked for "
                            "remapping, reset gpu to activate."),
        64: (_UNKNOWN_PROC, "Row Remapper Error: Failed to remap row (0x00000000003a6f0e), "
                            "remapping table is full."),
        74: (_UNKNOWN_PROC, "NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, "
                            "0x0, 0x0, 0x0, 0x0)"),
        79: (_UNKNOWN_PROC, "GPU has fallen off the bus."),
        92: (_UNKNOWN_PROC, "High single-bit ECC error rate"),
        94: (proc, "Contained: SM (0x1). RST: No, D-RST: No"),
        95: (_UNKNOWN_PROC, "Uncontained: FBHUB. RST: Yes, D-RST: No"),
        109: (proc, "channel 0x00000010, errorString CTX SWITCH TIMEOUT, Info 0x2c614"),
        119: (_UNKNOWN_PROC, "Timeout after 6s of waiting for RPC response from GPU0 GSP! "
                             "Expected function 76 (GSP_RM_CONTROL) (0x20800a4c 0x4)."),
        120: (_UNKNOWN_PROC, "GSP task exception: store access page fault (cause:0xf) "
                             "@ pc:0x1b3e200, partition:4#0"),
    }
    prefix = "NVRM: Xid (PCI:%s): %d, " % (kernel_pci_id(pci_bus_id), code)
    if code == 154:
        return prefix + "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    who, text = texts.get(code, (_UNKNOWN_PROC, xid_name(code)))
    return prefix + who + ", " + text


JOURNAL_FILE = "hpcobs-gpusim-kernel.journal"
JOURNAL_REMOTE = ("/usr/lib/systemd/systemd-journal-remote", "/lib/systemd/systemd-journal-remote")


def _read(path, default=""):
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return default


def journal_directory():
    """The directory journald writes this machine's journal to: /var/log/journal/<machine-id> (persistent
    storage), else /run/log/journal/<machine-id>. HPCOBS_GPUSIM_JOURNAL_DIR overrides it (tests)."""
    override = os.environ.get("HPCOBS_GPUSIM_JOURNAL_DIR")
    if override:
        return override
    machine_id = _read("/etc/machine-id")
    if not machine_id:
        raise OSError("no /etc/machine-id: cannot tell where the journal of this machine is")
    persistent = os.path.join("/var/log/journal", machine_id)
    return persistent if os.path.isdir(persistent) else os.path.join("/run/log/journal", machine_id)


def kernel_export_entry(message, now_ns=None, monotonic_ns=None):
    """One journal entry in journal export format, as journald stores a kernel ring-buffer line: the trusted
    fields _TRANSPORT=kernel, _BOOT_ID, _MACHINE_ID, _HOSTNAME, and SYSLOG_FACILITY=0 (kern),
    SYSLOG_IDENTIFIER=kernel, PRIORITY=3 (err), MESSAGE."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    monotonic_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC) if monotonic_ns is None else monotonic_ns
    fields = [("__REALTIME_TIMESTAMP", str(now_ns // 1000)), ("__MONOTONIC_TIMESTAMP", str(monotonic_ns // 1000)),
              ("_BOOT_ID", _read("/proc/sys/kernel/random/boot_id").replace("-", "")),
              ("_MACHINE_ID", _read("/etc/machine-id")), ("_HOSTNAME", os.uname().nodename),
              ("_TRANSPORT", "kernel"), ("_SOURCE_MONOTONIC_TIMESTAMP", str(monotonic_ns // 1000)),
              ("SYSLOG_FACILITY", "0"), ("SYSLOG_IDENTIFIER", "kernel"), ("PRIORITY", "3"), ("MESSAGE", message)]
    out = bytearray()
    for name, value in fields:
        if not value:
            continue
        data = value.encode("utf-8")
        if b"\n" in data:
            # the export format's binary form: name, newline, little-endian 64-bit length, data, newline
            out += name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += name.encode() + b"=" + data + b"\n"
    return bytes(out + b"\n")


def find_journal_remote():
    """The systemd-journal-remote program, or None. HPCOBS_GPUSIM_JOURNAL_REMOTE names the only candidate (tests)."""
    override = os.environ.get("HPCOBS_GPUSIM_JOURNAL_REMOTE")
    return next((path for path in ([override] if override else JOURNAL_REMOTE) if os.access(path, os.X_OK)), None)


def import_kernel_entry(message, journal_remote=None, directory=None):
    """Append `message` as a kernel-transport entry to <journal dir>/hpcobs-gpusim-kernel.journal with
    systemd-journal-remote (which stores an exported entry's fields as given, trusted ones included). Every
    reader of the local journal (journalctl, Promtail and Alloy without a path) merges that file in."""
    journal_remote = journal_remote or find_journal_remote()
    if not journal_remote:
        raise OSError("systemd-journal-remote not found (%s): install the Debian package systemd-journal-remote"
                      % " or ".join(JOURNAL_REMOTE))
    directory = directory or journal_directory()
    os.makedirs(directory, exist_ok=True)
    result = subprocess.run([journal_remote, "--split-mode=none", "--output=" + os.path.join(directory, JOURNAL_FILE),
                             "-"], input=kernel_export_entry(message), capture_output=True, check=False)
    if result.returncode != 0:
        raise OSError("systemd-journal-remote failed (%d): %s" % (
            result.returncode, result.stderr.decode("utf-8", "replace").strip()))


def emit_kernel_line(message, mode="auto", kmsg_path=None):
    """Write `message` to the journal as a kernel error; return the way used.

    kmsg: /dev/kmsg (the kernel's ring buffer: journald records _TRANSPORT=kernel). journal-remote: an entry with
    _TRANSPORT=kernel imported into the local journal (containers, whose /dev/kmsg is absent or the host's).
    logger: the syslog socket, _TRANSPORT=syslog: what any user can forge, which the Loki XID rules ignore.
    auto: kmsg when writable, else journal-remote when installed, else logger (with a warning)."""
    kmsg_path = kmsg_path or os.environ.get("HPCOBS_GPUSIM_KMSG") or DEFAULT_KMSG
    if mode in ("auto", "kmsg"):
        try:
            if mode == "kmsg" or os.access(kmsg_path, os.W_OK):
                fd = os.open(kmsg_path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0))
                try:
                    # level 3 (err); the kernel files injected records as "user"
                    os.write(fd, ("<11>kernel: %s\n" % message).encode("utf-8"))
                finally:
                    os.close(fd)
                return "kmsg"
        except OSError as exc:
            if mode == "kmsg":
                raise
            log("WARN", "cannot write kernel log, trying systemd-journal-remote", error=exc)
    if mode == "journal-remote" or (mode == "auto" and find_journal_remote()):
        import_kernel_entry(message)
        return "journal-remote"
    if mode in ("auto", "logger"):
        logger = shutil.which("logger")
        if logger:
            if mode == "auto":
                log("WARN", "no /dev/kmsg and no systemd-journal-remote: logging with logger, whose "
                            "_TRANSPORT=syslog line the Loki XID rules ignore")
            subprocess.run([logger, "-t", "kernel", "-p", "kern.err", "--", message],
                           check=True)
            return "logger"
        if mode == "logger":
            raise OSError("logger not found in PATH")
    return "none"


def retire_counts(doc, gpu_key, kinds, now):
    """Move the volatile counts of cleared faults into the aggregate totals."""
    gpu_faults = doc["faults"].get(gpu_key, {})
    retired = doc["retired"].setdefault(gpu_key, {})
    for kind in kinds:
        fault = gpu_faults.get(kind)
        if fault is None:
            continue
        target = {"ecc-dbe": "ecc_dbe_agg", "ecc-sbe": "ecc_sbe_agg",
                  "row-remap": "remapped_rows"}.get(kind)
        if target:
            retired[target] = int(retired.get(target, 0)) + fault_count(fault, kind, now)
        del gpu_faults[kind]
    if not gpu_faults:
        doc["faults"].pop(gpu_key, None)
    if not retired:
        doc["retired"].pop(gpu_key, None)
