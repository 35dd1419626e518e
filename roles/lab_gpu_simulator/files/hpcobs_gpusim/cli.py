"""Settings and the command line: serving (dcgm-exporter's flags) and the fault CLI."""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time

from .common import (DEFAULT_ADDRESS, DEFAULT_COLLECTORS, DEFAULT_CONFIG, DEFAULT_DRIVER, DEFAULT_GPUS,
                     DEFAULT_INTERVAL_MS, DEFAULT_MODEL, DEFAULT_STATE_DIR, PROG, TOPOLOGY_FILE, VERSION,
                     ConfigError, log)
from .emulate import CHOICES as EMULATE_CHOICES, DEFAULT_EMULATION, resolve_emulation
from .faults import (FAULT_KINDS, MAX_RATE, FaultStoreError, check_rate, emit_kernel_line, empty_faults,
                     faults_lock, load_faults,
                     retire_counts, save_faults, xid_kernel_message)
from .model import normalize_mig
from .identity import gpu_pci_bus_id
from .server import serve


# ---------------------------------------------------------------------------
# Settings (config file, environment, options)
# ---------------------------------------------------------------------------

PCI_BUS_ID_RE = re.compile(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]")

CONFIG_KEYS = {"gpus", "model", "driver_version", "mig", "state_dir", "hostname",
               "busy_gpus", "journal", "power_limit_w", "fb_total_mib", "seed", "emulate"}
JOURNAL_MODES = ("auto", "kmsg", "journal-remote", "logger", "none")


def load_config_file(path, explicit):
    try:
        with open(path, "r", encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        if explicit:
            raise ConfigError("config file %s not found" % path) from None
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError("cannot read config file %s: %s" % (path, exc)) from exc
    if not isinstance(data, dict):
        raise ConfigError("config file %s must hold a JSON object" % path)
    unknown = sorted(set(data) - CONFIG_KEYS)
    if unknown:
        raise ConfigError("config file %s: unknown keys %s (known: %s)"
                          % (path, ", ".join(unknown), ", ".join(sorted(CONFIG_KEYS))))
    return data


def parse_int_list(text):
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if part:
            if not part.isdigit():
                raise ConfigError("expected a list of GPU indexes, got %r" % text)
            out.append(int(part))
    return out


def resolve_settings(opts):
    """Merge options, environment, config file and defaults."""
    env = os.environ
    config_path = opts.sim_config or env.get("HPCOBS_GPUSIM_CONFIG") or DEFAULT_CONFIG
    explicit = bool(opts.sim_config or env.get("HPCOBS_GPUSIM_CONFIG"))
    cfg = {} if config_path == "none" else load_config_file(config_path, explicit)

    def pick(opt_value, env_name, key, default):
        if opt_value is not None:
            return opt_value
        if env_name and env.get(env_name):
            return env[env_name]
        if key in cfg:
            return cfg[key]
        return default

    settings = {}
    try:
        settings["gpus"] = int(pick(getattr(opts, "sim_gpus", None), "HPCOBS_GPUSIM_GPUS",
                                    "gpus", DEFAULT_GPUS))
    except (TypeError, ValueError):
        raise ConfigError("the GPU count must be an integer") from None
    if not 0 <= settings["gpus"] <= 64:
        raise ConfigError("the GPU count must be between 0 and 64")
    settings["model"] = str(pick(getattr(opts, "sim_model", None), "HPCOBS_GPUSIM_MODEL",
                                 "model", DEFAULT_MODEL))
    settings["driver_version"] = str(pick(getattr(opts, "sim_driver", None),
                                          "HPCOBS_GPUSIM_DRIVER", "driver_version",
                                          DEFAULT_DRIVER))
    mig_opt = getattr(opts, "sim_mig", None)
    mig_value = ",".join(mig_opt) if mig_opt else None
    settings["mig"] = normalize_mig(pick(mig_value, "HPCOBS_GPUSIM_MIG", "mig", None))
    settings["state_dir"] = str(pick(getattr(opts, "sim_state_dir", None),
                                     "HPCOBS_GPUSIM_STATE_DIR", "state_dir",
                                     DEFAULT_STATE_DIR))
    hostname = pick(getattr(opts, "sim_hostname", None), "HPCOBS_GPUSIM_HOSTNAME",
                    "hostname", None)
    if not hostname:
        hostname = env.get("NODE_NAME") or socket.gethostname()
    settings["hostname"] = str(hostname)
    busy = pick(getattr(opts, "sim_busy", None), None, "busy_gpus", [])
    settings["busy_gpus"] = busy if isinstance(busy, list) else parse_int_list(busy)
    journal = str(pick(getattr(opts, "sim_journal", None), "HPCOBS_GPUSIM_JOURNAL",
                       "journal", "auto"))
    if journal not in JOURNAL_MODES:
        raise ConfigError("journal must be one of %s" % ", ".join(JOURNAL_MODES))
    settings["journal"] = journal
    settings["emulation"] = resolve_emulation(pick(getattr(opts, "emulate", None), "HPCOBS_GPUSIM_EMULATE",
                                                   "emulate", DEFAULT_EMULATION))
    seed = pick(getattr(opts, "sim_seed", None), None, "seed", None)
    settings["seed"] = int(seed) if seed is not None else None
    settings["power_limit_w"] = cfg.get("power_limit_w")
    settings["fb_total_mib"] = cfg.get("fb_total_mib")
    return settings


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def rate_arg(text):
    try:
        return check_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def go_bool(text):
    value = str(text).strip().lower()
    if value in ("1", "t", "true", "yes", "y", "on"):
        return True
    if value in ("0", "f", "false", "no", "n", "off", ""):
        return False
    raise argparse.ArgumentTypeError("invalid boolean value %r" % text)


def env_bool(name):
    try:
        return go_bool(os.environ.get(name, "false"))
    except argparse.ArgumentTypeError:
        return False


# dcgm-exporter flags accepted and ignored: (names, takes a value)
IGNORED_FLAGS = [
    (("--config-file",), True), (("--web-read-timeout",), True),
    (("--web-write-timeout",), True), (("-k", "--kubernetes"), False),
    (("-p", "--cpu-devices"), True), (("-m", "--configmap-data"), True),
    (("-r", "--remote-hostengine-info"), True),
    (("--kubernetes-enable-pod-labels",), False), (("--kubernetes-enable-pod-uid",), False),
    (("--kubernetes-gpu-id-type",), True), (("--kubernetes-pod-label-allowlist-regex",), True),
    (("-d", "--devices"), True), (("-s", "--switch-devices"), True),
    (("--fake-gpus",), False),
    (("-x", "--xid-count-window-size"), True), (("--clock-events-count-window-size",), True),
    (("--enable-dcgm-log",), False), (("--dcgm-log-level",), True), (("--log-format",), True),
    (("--pod-resources-kubelet-socket",), True), (("--container-labels",), False),
    (("--container-runtime-socket",), True), (("--nvidia-resource-names",), True),
    (("--kubernetes-virtual-gpus",), False), (("--dump-enabled",), False),
    (("--dump-directory",), True), (("--dump-retention",), True),
    (("--dump-compression",), False), (("--kubernetes-enable-dra",), False),
    (("--disable-startup-validate",), False), (("--enable-gpu-bind-unbind-watch",), False),
    (("--gpu-bind-unbind-poll-interval",), True), (("--enable-pprof",), False),
    (("--web-systemd-socket",), False),
]

SERVE_EPILOG = """\
fault injection: %(prog)s fault {set,clear,list} --help

Ignored dcgm-exporter flags, accepted so a dcgm-exporter unit runs unchanged:
%(ignored)s

See the hpcobs_gpusim package documentation for the job mapping rules,
fault kinds and journal behaviour."""


def build_serve_parser():
    ignored = textwrap.fill(" ".join("/".join(names) for names, _ in IGNORED_FLAGS),
                            width=78, initial_indent="  ", subsequent_indent="  ",
                            break_on_hyphens=False, break_long_words=False)
    parser = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="dcgm-exporter stand-in serving simulated GPU metrics "
                    "(accepts dcgm-exporter's flags).",
        epilog=SERVE_EPILOG % {"prog": PROG, "ignored": ignored})
    env = os.environ
    parser.add_argument("-f", "--collectors", metavar="FILE",
                        default=env.get("DCGM_EXPORTER_COLLECTORS") or DEFAULT_COLLECTORS,
                        help="counters CSV (env DCGM_EXPORTER_COLLECTORS, default %(default)s)")
    parser.add_argument("-a", "--address", metavar="[HOST]:PORT",
                        default=env.get("DCGM_EXPORTER_LISTEN") or DEFAULT_ADDRESS,
                        help="listen address (env DCGM_EXPORTER_LISTEN, default %(default)s)")
    try:
        interval_default = int(env.get("DCGM_EXPORTER_INTERVAL") or DEFAULT_INTERVAL_MS)
    except ValueError:
        interval_default = DEFAULT_INTERVAL_MS
    parser.add_argument("-c", "--collect-interval", metavar="MS", type=int,
                        default=interval_default,
                        help="background update and persistence period in ms "
                             "(env DCGM_EXPORTER_INTERVAL, default %(default)s)")
    parser.add_argument("--hpc-job-mapping-dir", metavar="DIR",
                        default=env.get("DCGM_HPC_JOB_MAPPING_DIR", ""),
                        help="job mapping directory read on every scrape "
                             "(env DCGM_HPC_JOB_MAPPING_DIR)")
    parser.add_argument("-n", "--no-hostname", nargs="?", const=True, metavar="BOOL",
                        type=go_bool,
                        default=env_bool("DCGM_EXPORTER_NO_HOSTNAME"),
                        help="omit the Hostname label")
    parser.add_argument("-o", "--use-old-namespace", nargs="?", const=True, metavar="BOOL",
                        type=go_bool,
                        default=env_bool("DCGM_EXPORTER_USE_OLD_NAMESPACE"),
                        help='name the UUID label "uuid"')
    parser.add_argument("--rbmn", "--replace-blanks-in-model-name", nargs="?", const=True,
                        type=go_bool, metavar="BOOL", dest="replace_blanks_in_model_name",
                        default=env_bool("DCGM_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME"),
                        help="dashes instead of blanks in modelName")
    parser.add_argument("--web-config-file", metavar="FILE",
                        default=env.get("DCGM_EXPORTER_WEB_CONFIG_FILE", ""),
                        help="exporter-toolkit web config: HTTPS and basic auth "
                             "(env DCGM_EXPORTER_WEB_CONFIG_FILE; default none: plain HTTP)")
    parser.add_argument("--debug", nargs="?", const=True, metavar="BOOL", type=go_bool,
                        default=env_bool("DCGM_EXPORTER_DEBUG"), help="log every request")
    parser.add_argument("-v", "--version", action="version", version="%s %s" % (PROG, VERSION))
    group = parser.add_argument_group("ignored dcgm-exporter flags")
    for names, takes_value in IGNORED_FLAGS:
        dest = "ignored_" + names[-1].lstrip("-").replace("-", "_")
        if takes_value:
            group.add_argument(*names, dest=dest, metavar="X", help=argparse.SUPPRESS)
        else:
            group.add_argument(*names, dest=dest, nargs="?", const=True, type=go_bool,
                               help=argparse.SUPPRESS)
    add_sim_options(parser, serve=True)
    return parser


def add_sim_options(parser, serve):
    group = parser.add_argument_group("simulator")
    group.add_argument("--sim-config", metavar="FILE",
                       help="JSON config (env HPCOBS_GPUSIM_CONFIG, default %s if it exists)"
                       % DEFAULT_CONFIG)
    group.add_argument("--sim-gpus", metavar="N", type=int, help="number of GPUs (default 4)")
    group.add_argument("--sim-state-dir", metavar="DIR",
                       help="state directory (default %s)" % DEFAULT_STATE_DIR)
    group.add_argument("--sim-hostname", metavar="NAME",
                       help="host name for labels and identities")
    if serve:
        group.add_argument("--sim-model", metavar="NAME",
                           help="GPU model (default %r)" % DEFAULT_MODEL)
        group.add_argument("--sim-driver", metavar="VERSION",
                           help="driver version (default %s)" % DEFAULT_DRIVER)
        group.add_argument("--sim-mig", metavar="SPEC", action="append",
                           help='MIG layout, e.g. "0:2" or "0:3g.40gb+3g.40gb" (repeatable)')
        group.add_argument("--sim-busy", metavar="LIST",
                           help="GPUs that are busy without a mapped job, e.g. 0,1")
        group.add_argument("--sim-seed", metavar="N", type=int, help="noise seed")
        group.add_argument("--emulate", metavar="RELEASE",
                           help="dcgm-exporter release to behave like: %s, an exporter version or a release tag "
                                "(env HPCOBS_GPUSIM_EMULATE, key \"emulate\", default %s)"
                                % (", ".join(EMULATE_CHOICES), DEFAULT_EMULATION))
    group.add_argument("--sim-journal", "--journal", dest="sim_journal", choices=JOURNAL_MODES,
                       help="where Xid kernel lines go (default auto)")


def normalize_go_flags(argv, parser):
    """Turn Go-style single-dash long flags (-collectors=x) into --collectors=x."""
    long_names = set()
    for action in parser._actions:  # argparse offers no public accessor
        for option in action.option_strings:
            if option.startswith("--"):
                long_names.add(option[2:])
    out = []
    for index, arg in enumerate(argv):
        if arg == "--":
            out.extend(argv[index:])
            break
        if arg.startswith("-") and not arg.startswith("--") and len(arg) > 2:
            name = arg[1:].split("=", 1)[0]
            if name in long_names:
                arg = "-" + arg
        out.append(arg)
    return out


def build_fault_parser():
    kinds = "\n".join("  %-18s %s" % (k, v) for k, v in FAULT_KINDS.items())
    parser = argparse.ArgumentParser(
        prog=PROG + " fault", allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Inject or clear simulated GPU faults on this node.",
        epilog="fault kinds:\n" + kinds + "\n  clear              same as 'fault clear --gpu N'")
    sub = parser.add_subparsers(dest="action", required=True)
    p_set = sub.add_parser("set", help="inject a fault", allow_abbrev=False)
    p_set.add_argument("--gpu", type=int, required=True, help="GPU index (gpu label)")
    p_set.add_argument("kind", choices=list(FAULT_KINDS) + ["clear"])
    p_set.add_argument("--code", type=int, help="Xid code (xid faults)")
    p_set.add_argument("--rate", type=rate_arg,
                       help="events per second for counting faults (above 0, at most %g)" % MAX_RATE)
    p_set.add_argument("--pid", type=int, help="pid printed in the Xid line")
    p_set.add_argument("--process", help="process name printed in the Xid line")
    p_clear = sub.add_parser("clear", help="clear faults (all, one GPU, or one kind)",
                             allow_abbrev=False)
    p_clear.add_argument("--gpu", type=int, help="GPU index; default all GPUs")
    p_clear.add_argument("kind", nargs="?", choices=list(FAULT_KINDS),
                         help="only this kind; default all kinds")
    p_list = sub.add_parser("list", help="show active faults", allow_abbrev=False)
    p_list.add_argument("--json", action="store_true", help="machine-readable output")
    for p in (p_set, p_clear, p_list):
        add_sim_options(p, serve=False)
    return parser


def node_topology(settings):
    """GPU identities as the running server published them, else computed."""
    path = os.path.join(settings["state_dir"], TOPOLOGY_FILE)
    try:
        with open(path, "r", encoding="utf-8") as handle:
            data = json.load(handle)
        gpus = {int(g["index"]): g["pci_bus_id"] for g in data["gpus"]}
        if all(isinstance(p, str) and PCI_BUS_ID_RE.fullmatch(p) for p in gpus.values()):
            return gpus
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return {i: gpu_pci_bus_id(settings["hostname"], i) for i in range(settings["gpus"])}


def fault_main(argv):
    parser = build_fault_parser()
    opts = parser.parse_args(argv)
    try:
        settings = resolve_settings(opts)
    except ConfigError as exc:
        print("%s fault: %s" % (PROG, exc), file=sys.stderr)
        return 1
    state_dir = settings["state_dir"]
    topology = node_topology(settings)
    if opts.action == "list":
        try:
            doc = load_faults(state_dir)
        except FaultStoreError as exc:
            print("%s fault: %s" % (PROG, exc), file=sys.stderr)
            if exc.doc is None:
                print("%s fault: 'fault clear' starts a new fault file" % PROG, file=sys.stderr)
                return 1
            doc = exc.doc
        if opts.json:
            print(json.dumps(doc["faults"], indent=2, sort_keys=True))
            return 0
        rows = []
        for gpu_key in sorted(doc["faults"], key=int):
            for kind, fault in sorted(doc["faults"][gpu_key].items()):
                detail = []
                if "code" in fault:
                    detail.append("code=%s" % fault["code"])
                if fault.get("rate"):
                    detail.append("rate=%g/s" % fault["rate"])
                since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(fault.get("since", 0)))
                rows.append("%-4s %-18s %-20s %s" % (gpu_key, kind, since, " ".join(detail)))
        if rows:
            print("%-4s %-18s %-20s %s" % ("GPU", "KIND", "SINCE", "DETAIL"))
            print("\n".join(rows))
        else:
            print("no active faults")
        return 0

    if opts.gpu is not None and opts.gpu not in topology:
        print("%s fault: no GPU %d on this node (GPUs: %s)"
              % (PROG, opts.gpu, ", ".join(str(i) for i in sorted(topology)) or "none"),
              file=sys.stderr)
        return 2
    if opts.action == "set" and opts.kind == "xid" and opts.code is None:
        print("%s fault: xid needs --code (e.g. --code 79)" % PROG, file=sys.stderr)
        return 2
    if opts.action == "set" and opts.code is not None and not 0 < opts.code < 1000:
        print("%s fault: --code must be between 1 and 999" % PROG, file=sys.stderr)
        return 2

    try:
        os.makedirs(state_dir, mode=0o755, exist_ok=True)
    except OSError as exc:
        print("%s fault: cannot create %s: %s" % (PROG, state_dir, exc), file=sys.stderr)
        return 1
    now = time.time()
    kernel_line = None
    try:
        with faults_lock(state_dir):
            clear_all = (opts.action == "clear" and opts.gpu is None and opts.kind is None)
            try:
                doc = load_faults(state_dir)
            except FaultStoreError as exc:
                # entries that cannot be used are dropped; the file is rewritten clean below
                print("%s fault: %s" % (PROG, exc), file=sys.stderr)
                doc = exc.doc
                if doc is None:
                    if not clear_all:
                        print("%s fault: 'fault clear' (all GPUs, all kinds) starts a new fault file"
                              % PROG, file=sys.stderr)
                        return 1
                    doc = empty_faults()
            if opts.action == "clear" or (opts.action == "set" and opts.kind == "clear"):
                gpu_keys = [str(opts.gpu)] if opts.gpu is not None else list(doc["faults"])
                kind = getattr(opts, "kind", None)
                kinds = list(FAULT_KINDS) if kind in (None, "clear") else [kind]
                for gpu_key in gpu_keys:
                    retire_counts(doc, gpu_key, kinds, now)
                save_faults(state_dir, doc)
                what = "GPU %d" % opts.gpu if opts.gpu is not None else "all GPUs"
                print("cleared %s on %s" % (", ".join(kinds) if len(kinds) == 1 else "faults",
                                            what))
                return 0
            gpu_key = str(opts.gpu)
            if opts.kind in doc["faults"].get(gpu_key, {}):
                # re-setting a fault restarts it: retire what it counted so far
                retire_counts(doc, gpu_key, [opts.kind], now)
            entry = {"since": now}
            if opts.rate is not None:
                entry["rate"] = opts.rate
            if opts.kind == "xid":
                entry["code"] = opts.code
            doc["faults"].setdefault(gpu_key, {})[opts.kind] = entry
            save_faults(state_dir, doc)
            if opts.kind in ("xid", "offbus"):
                code = opts.code if opts.kind == "xid" else 79
                kernel_line = xid_kernel_message(code, topology[opts.gpu], opts.pid,
                                                 opts.process)
    except (OSError, FaultStoreError) as exc:
        print("%s fault: %s" % (PROG, exc), file=sys.stderr)
        return 1
    print("set %s on GPU %d" % (opts.kind, opts.gpu))
    if kernel_line:
        try:
            how = emit_kernel_line(kernel_line, settings["journal"])
        except (OSError, subprocess.CalledProcessError) as exc:
            print("%s fault: could not write the kernel line: %s" % (PROG, exc),
                  file=sys.stderr)
            return 1
        print("%s [%s]" % (kernel_line, how))
    return 0


def remote_hostengine_problem(value):
    """What dcgm-exporter (up to 4.5.3-4.8.2 and its main branch) does with --remote-hostengine-info / -r /
    DCGM_REMOTE_HOSTENGINE_INFO: it passes the value to go-dcgm's Init(Standalone, value, "0"), i.e. DCGM's
    dcgmConnect_v2 with addressIsUnixSocket 0, which connects to "tcp://<value>". A Unix socket path or a unix://
    URL is therefore no host and the exporter exits; the simulator refuses it the same way."""
    if value and (value.startswith("/") or value.lower().startswith(("unix:", "vsock:"))):
        return ("Failed to connect to remote hostengine: address %r (dcgm-exporter connects to the host engine "
                "over TCP only: host:port)" % value)
    return ""


def serve_main(argv):
    parser = build_serve_parser()
    opts = parser.parse_args(normalize_go_flags(argv, parser))
    problem = remote_hostengine_problem(
        getattr(opts, "ignored_remote_hostengine_info", None) or os.environ.get("DCGM_REMOTE_HOSTENGINE_INFO", ""))
    if problem:
        log("ERROR", problem)
        return 1
    try:
        settings = resolve_settings(opts)
    except ConfigError as exc:
        log("ERROR", str(exc))
        return 1
    return serve(opts, settings)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "fault":
        return fault_main(argv[1:])
    if argv and argv[0] == "serve":
        argv = argv[1:]
    return serve_main(argv)


if __name__ == "__main__":
    sys.exit(main())
