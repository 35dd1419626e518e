"""hpcobs-gpusim - a dcgm-exporter stand-in that simulates NVIDIA GPUs.

The hpcobs lab and CI have no GPUs, so this program plays the part of
dcgm-exporter on a simulated GPU node.  It is a stdlib-only package that runs
on the distribution python3 (3.11 and newer): common (constants, logging),
fields (DCGM field ids, XID texts, data/), counters (the CSV), identity,
model (hardware, MIG, value dynamics), mapping (Slurm job files), faults
(fault store, kernel lines), render (text format), emulate (release
behaviour), server (HTTP), webconfig (--web-config-file) and cli (settings,
command line).  Only a web config needs more than the standard library:
PyYAML and bcrypt (see WEB CONFIG).  The launcher hpcobs-gpusim finds it
next to itself or in ../lib/hpcobs-gpusim.

SERVING METRICS
    hpcobs-gpusim [dcgm-exporter flags] [--sim-* options]

  The program accepts dcgm-exporter's own command line, so a systemd unit
  written for the real exporter runs it unchanged:

    -f, --collectors FILE        counters CSV (env DCGM_EXPORTER_COLLECTORS,
                                 default /etc/dcgm-exporter/default-counters.csv)
    -a, --address [HOST]:PORT    listen address (env DCGM_EXPORTER_LISTEN,
                                 default :9400; "[::1]:9400" for IPv6)
    -c, --collect-interval MS    background collection/persistence period
                                 (env DCGM_EXPORTER_INTERVAL, default 30000)
    --hpc-job-mapping-dir DIR    Slurm job mapping directory
                                 (env DCGM_HPC_JOB_MAPPING_DIR, default unset)
    -n, --no-hostname            omit the Hostname label
    -o, --use-old-namespace      spell the UUID label "uuid"
    --rbmn, --replace-blanks-in-model-name
                                 dashes instead of blanks in modelName
    --web-config-file FILE       exporter-toolkit web config: HTTPS and basic
                                 auth (env DCGM_EXPORTER_WEB_CONFIG_FILE,
                                 default none: plain HTTP).  See WEB CONFIG.
    --debug                      log every request
    --emulate RELEASE            dcgm-exporter release to behave like
                                 (env HPCOBS_GPUSIM_EMULATE, key "emulate"):
                                 4.7 (and older), 4.8 (default, the newest
                                 release) or main (unreleased); an exporter
                                 version (4.6.0) or a release tag
                                 (4.5.3-4.8.2) picks its row.  See EMULATION.

  Every other dcgm-exporter flag (--kubernetes, -r/--remote-hostengine-info,
  -d/--devices, --config-file, --web-systemd-socket, ...) is accepted and
  ignored; the simulator has no hostengine and no Kubernetes.  Single-dash
  long flags (-collectors) work as in Go.

  Endpoints: /metrics, /health (HTTP 200; the body and headers depend on
  --emulate), / (a small HTML page).  Without --web-config-file they are
  served over plain HTTP to anyone, as dcgm-exporter does.

WEB CONFIG (--web-config-file)
  dcgm-exporter serves through the Prometheus exporter-toolkit; so does the
  simulator, with the toolkit's file format (docs/web-configuration.md):

      tls_server_config:
        cert_file: /etc/dcgm-exporter/tls/server.crt
        key_file: /etc/dcgm-exporter/tls/server.key
        min_version: TLS12
      basic_auth_users:
        hpcobs: $2b$10$...            (a bcrypt hash, never the password)

  * The file is read once at start and strictly, as the toolkit's
    yaml.UnmarshalStrict reads it: an unknown or repeated key (top level:
    tls_server_config, http_server_config, rate_limit, basic_auth_users),
    a wrong type, cert_file without key_file (or the reverse), an unknown
    min_version/max_version (TLS10-TLS13) or client_auth_type, a client CA
    without a client_auth_type, a basic_auth_users value that is not a
    bcrypt hash, or a certificate that does not load stop the program at
    start (exit status 1) with a message naming the key.  Relative paths
    are taken from the file's directory.
  * tls_server_config with cert_file and key_file: HTTPS only (Python's ssl;
    min_version and max_version map to the TLS versions accepted, default
    TLS12-TLS13).  client_auth_type VerifyClientCertIfGiven or
    RequireAndVerifyClientCert with client_ca_file verify client
    certificates, client_allowed_sans checks their names.  Not simulated
    (refused at start): inline cert/key/client_ca, cipher_suites,
    curve_preferences, RequestClientCert, RequireAnyClientCert, rate_limit.
    Without tls_server_config the server stays plain HTTP.
  * basic_auth_users: every request needs "Authorization: Basic" with one of
    the users and a password matching its bcrypt hash ($2a$, $2b$, $2y$);
    otherwise HTTP 401 "Unauthorized" with "WWW-Authenticate: Basic", as the
    toolkit answers.  A successful check is cached (bcrypt is slow on
    purpose).  http_server_config.headers are added to every response.
  * Needs: PyYAML (Debian python3-yaml) to read the file and bcrypt (Debian
    python3-bcrypt) when basic_auth_users is set; either missing is a clear
    start-up error.  The lab_gpu_simulator role installs both when the
    site's security switch is on.

EMULATION (--emulate)
    4.7    dcgm-exporter up to 4.7.x (4.4.2-4.7.1): /health body "KO",
           host label "Hostname"
    4.8    4.8.x (4.5.1-4.8.0 .. 4.5.3-4.8.2): /health body "OK" with the
           header "X-Registry-Available: true", label "Hostname"
    main   unreleased upstream main (after 4.5.3-4.8.2, PR #655): as 4.8,
           label "hostname"
  Nothing else in the project reads the label by name: rules aggregate by
  node and gpu.

SIMULATED HARDWARE
  Each setting comes from, in order of precedence: a --sim-* option, an
  HPCOBS_GPUSIM_* environment variable, the JSON config file, a default.

    --sim-config FILE      (HPCOBS_GPUSIM_CONFIG) default
                           /etc/hpcobs-gpusim/config.json, read if it exists;
                           "none" reads no file
    --sim-gpus N           (HPCOBS_GPUSIM_GPUS, key "gpus") default 4
    --sim-model NAME       (HPCOBS_GPUSIM_MODEL, key "model")
                           default "NVIDIA H100 80GB HBM3"
    --sim-driver VERSION   (HPCOBS_GPUSIM_DRIVER, key "driver_version")
    --sim-mig SPEC         (HPCOBS_GPUSIM_MIG, key "mig") e.g. "0:2" (GPU 0
                           split into 2 GPU instances) or "0:3g.40gb+2g.20gb";
                           several GPUs separated by commas; repeatable
    --sim-state-dir DIR    (HPCOBS_GPUSIM_STATE_DIR, key "state_dir")
                           default /var/lib/hpcobs-gpusim
    --sim-hostname NAME    (HPCOBS_GPUSIM_HOSTNAME, key "hostname"); without
                           it: $NODE_NAME, then the kernel host name (the
                           same rule as dcgm-exporter)
    --sim-busy LIST        (key "busy_gpus") GPUs that are busy without a job
    --sim-journal MODE     (HPCOBS_GPUSIM_JOURNAL, key "journal") see FAULTS
    --sim-seed N           (key "seed") seed for the value noise
  Config-only keys: "power_limit_w", "fb_total_mib".  Unknown keys are an
  error.  Example config.json:
      {"gpus": 8, "model": "NVIDIA H100 80GB HBM3", "mig": {"0": 2},
       "state_dir": "/var/lib/hpcobs-gpusim", "journal": "auto"}

  UUIDs, PCI bus ids and serial numbers are derived from the host name and
  the GPU index, so they are stable for a host across restarts and differ
  between hosts.

  Values move: a GPU (or MIG instance) named in the job mapping directory is
  busy (utilization 90-99 %, power close to but below the enforced limit,
  most of the frame buffer in use), otherwise it idles.  Power follows load
  with noise, temperature follows power with a lag (time constant 20 s),
  clocks follow load.  DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ) integrates
  power over wall-clock time and is persisted in the state dir (state.json),
  so it keeps increasing across restarts (the downtime is integrated at the
  last known power).  Traffic counters (DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL,
  DCGM_FI_PROF_PCIE_TX/RX_BYTES_TOTAL) integrate the traffic rates the same
  way and never go down; the DCGM_FI_PROF_*_BYTES fields are rates.  Values are recomputed on every scrape; the collect
  interval only paces the background update that persists state.

COUNTERS CSV
  Same format as dcgm-exporter: "FIELD, prometheus type, help"; lines that
  start with '#' and blank lines are ignored; surrounding blanks are trimmed.
  Types: gauge, counter, histogram, summary, label.  A "label" row turns the
  field into a label on every series (DCGM_FI_DRIVER_VERSION).  Only fields
  listed are served.  As with dcgm-exporter, a malformed row, an unknown
  type or a name that is neither a DCGM field nor one of the exporter's own
  DCGM_EXP_* counters stops the program at start-up (exit status 1); so does
  a duplicate field (DCGM refuses it).  A DCGM_EXP_* row or a valid DCGM
  field the simulator does not produce is skipped with a warning.

  Output format follows dcgm-exporter: families in DCGM field-id order
  (the exporter's template walks a map keyed by counter, field id first),
  each "# HELP" with the CSV help text, "# TYPE" with the CSV type, then one
  line per entity with the labels gpu, UUID, pci_bus_id, device, modelName,
  [GPU_I_PROFILE, GPU_I_ID,] Hostname (or hostname, see EMULATION), then the
  label rows sorted by name, then per-series attributes
  sorted by name (err_code and err_msg on DCGM_FI_DEV_XID_ERRORS, hpc_job).
  Integer fields print as integers, floating point fields with six decimals.
  Label values are written verbatim, as upstream does.

  A GPU with MIG instances is reported per GPU instance only (GPU_I_PROFILE
  and GPU_I_ID set); device-wide fields repeat the parent's value and the
  utilization fields (GPU_UTIL, MEM_COPY_UTIL, ENC_UTIL, DEC_UTIL), which
  the driver does not report in MIG mode, are left out.

JOB MAPPING (--hpc-job-mapping-dir)
  The directory is read on every scrape.
  * File names must be "<gpu>" (whole GPU, the value of the gpu label) or
    "<gpu>.<GPU_I_ID>" (a MIG instance).  Anything else, and directories,
    are ignored.  Names are compared as strings: "01" is not GPU 1.
  * A MIG instance takes its jobs from "<gpu>.<GPU_I_ID>" only; a whole-GPU
    file for a GPU in MIG mode is ignored.
  * Each line is one job id ("\\r\\n" accepted).  Every job id yields its own
    copy of each series with the label hpc_job.  Repeated ids in one file
    count once, first occurrence first (dcgm-exporter dedupes since 2026-09;
    before that a repeated id made the whole scrape fail).  Lines are not
    trimmed; an empty line is an empty job id, as upstream.
  * An empty file, or no file: the series carry no hpc_job.
  * Files for GPUs that do not exist (or fell off the bus) are ignored.
  * A missing directory is logged and ignored; it is picked up as soon as it
    appears.
  * A file that cannot be read (permissions, dangling symlink, a symlink to a
    directory, a FIFO or other non-regular file) fails the whole scrape with
    HTTP 500 "internal server error", as upstream.  (Upstream would block on
    a FIFO until the scrape times out; the simulator fails it at once.)

FAULTS
    hpcobs-gpusim fault set --gpu N KIND [--code XID] [--rate R]
                            [--pid PID] [--process NAME]
    hpcobs-gpusim fault clear [--gpu N] [KIND]
    hpcobs-gpusim fault list [--json]
  (plus --sim-config, --sim-state-dir, --sim-hostname, --sim-gpus and
  --journal {auto,kmsg,journal-remote,logger,none} to reach the right node state)

  Faults are written atomically to <state dir>/faults.json (mode 0644, under
  a lock), read by the server on every scrape, survive restarts and end only
  with "clear".  --rate must be finite, above 0 and at most 1e6 per second.
  Entries of faults.json that are not usable (hand-edited, corrupt) are
  ignored with an error in the log and never fail a scrape; the next
  "fault set/clear" rewrites the file without them, and "fault clear" (all
  GPUs) starts a new file when it cannot be parsed at all.  Kinds:
    ecc-dbe     DCGM_FI_DEV_ECC_DBE_VOL_TOTAL grows (1 at once, then --rate
                per second, default 1/30 s)
    ecc-sbe     DCGM_FI_DEV_ECC_SBE_VOL_TOTAL grows (default 0.5/s)
    thermal     GPU temperature ~90 C, memory ~96 C, SM clock throttled,
                DCGM_FI_DEV_THERMAL_VIOLATION grows in real time (ns)
    xid         DCGM_FI_DEV_XID_ERRORS shows --code (err_msg: the exporter's
                text for the code, data/xid-texts.txt) and a kernel line
                "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., ..." with
                the GPU's PCI address and a message typical of the code is
                written to the journal
    hang        utilization ~0 while the frame buffer stays full
    power       DCGM_FI_DEV_POWER_USAGE 6-12 % above
                DCGM_FI_DEV_ENFORCED_POWER_LIMIT, POWER_VIOLATION grows
    pcie        DCGM_FI_DEV_PCIE_LINK_WIDTH 16 -> 8 (MAX stays 16), PCIe
                replays grow (default 2/s)
    offbus      the GPU disappears from the output; an Xid 79 kernel line is
                written to the journal
    nvlink      NVLink CRC/replay/recovery error totals grow (default 5/s)
    row-remap   DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS grows, ROW_REMAP_PENDING 1
    row-remap-failure  DCGM_FI_DEV_ROW_REMAP_FAILURE 1
    clear       "fault set --gpu N clear" is the same as "fault clear --gpu N"
  Clearing models a GPU reset: volatile ECC counts, XID, pending remaps go
  back to 0 (the ECC aggregate and remapped-row totals keep them); throttle
  time, PCIe replay and NVLink error totals are counters since boot and keep
  their value.

  Journal: the kernel line must reach the journal as the driver's own
  lines do, with _TRANSPORT=kernel (a field only journald sets, which the
  Loki XID rules select on).  With --journal auto (default) it goes to
  /dev/kmsg when that is writable, as "<11>kernel: NVRM: Xid ...": journald
  stores it with _TRANSPORT=kernel, SYSLOG_IDENTIFIER=kernel, PRIORITY=3
  (the kernel files injected records as facility "user").  Otherwise
  (podman containers have no /dev/kmsg, and a host's /dev/kmsg would be
  seen by every container) it takes journal-remote: the entry, in journal
  export format with _TRANSPORT=kernel, SYSLOG_IDENTIFIER=kernel,
  SYSLOG_FACILITY=0, PRIORITY=3, the boot and machine ids, is imported
  with "systemd-journal-remote --output=<journal dir>/hpcobs-gpusim-kernel
  .journal -" into /var/log/journal/<machine-id>/ (or /run/log/journal/
  <machine-id>/ with volatile storage), where journalctl, Promtail and
  Alloy (reading the local journal) merge it in.  "logger" runs
  "logger -t kernel -p kern.err": SYSLOG_IDENTIFIER=kernel but
  _TRANSPORT=syslog, the line any user can forge, which the rules ignore
  (auto falls back to it, with a warning, only when systemd-journal-remote
  is missing).  "kmsg", "journal-remote" and "logger" force one way,
  "none" only prints.  The
  line is also printed on stdout.  HPCOBS_GPUSIM_KMSG,
  HPCOBS_GPUSIM_JOURNAL_REMOTE and HPCOBS_GPUSIM_JOURNAL_DIR override the
  /dev/kmsg path, the program and the journal directory (tests).

FILES (state dir)
  faults.json    faults, written by the fault CLI (run it as root)
  state.json     energy and counters, written by the server
  topology.json  UUIDs and PCI ids, written by the server at start; the fault
                 CLI uses it to name the right PCI address
  The server needs write access to the state dir; the fault CLI needs write
  access too (root).  faults.json is created 0644 so the server can read it.
"""

# The names below are the package's interface (the tests and the launcher use them).
from .common import (DEFAULT_MODEL, PROG, VERSION, ConfigError, atomic_write, log)  # noqa: F401
from .counters import Counter, CsvError, load_counters, parse_counters_csv  # noqa: F401
from .emulate import DEFAULT_EMULATION, EMULATIONS, resolve_emulation  # noqa: F401
from .faults import (DEFAULT_RATES, FAULT_KINDS, MAX_RATE, FaultStoreError, check_rate, empty_faults,  # noqa: F401
                     fault_count, load_faults, retire_counts, sanitize_faults, save_faults, xid_kernel_message)
from .fields import (EXPORTER_FIELDS, FIELD_IDS, FIELD_TYPES, XID_FIELD, dcgm_field_id, xid_name,  # noqa: F401
                     xid_texts)
from .identity import gpu_pci_bus_id, gpu_serial, gpu_uuid, kernel_pci_id  # noqa: F401
from .mapping import MappingError, is_mapping_name, read_mapping_dir, split_job_lines  # noqa: F401
from .model import Simulator, build_mig_instances, model_spec, normalize_mig, parse_mig_spec  # noqa: F401
from .render import format_value, render_metrics  # noqa: F401
from .server import Exporter, parse_listen_address  # noqa: F401
from .cli import main, resolve_settings  # noqa: F401
