"""Verify a simulated GPU node: node_exporter, the GPU simulator run by the dcgm_exporter role's unit, job mapping,
fault injection and the job-mapping directory's tmpfiles entry."""
import json
import re

import pytest

from hostchecks import assert_runs_as_its_own_user, main_pid, unit_property
from polling import wait_for

from gpu_node_lib import (BASE_LABELS, COUNTERS, EXPORTER, MAPPING_DIR, MIG_LABELS, SIM, WEB_CONFIG, expected,
                          expected_entities, http_get, parse, scrape, secured, series, csv_fields)


def whole_gpu(exp):
    """A GPU without MIG (GPU 1 where it has no MIG, as in the mapping example of the docs)."""
    return 1 if 1 in exp["gpus"] and 1 not in exp["mig"] else [g for g in exp["gpus"] if g not in exp["mig"]][0]


# --- services and unit ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("unit", ["node_exporter", "dcgm_exporter"])
def test_services_enabled_and_running(host, unit):
    service = host.service(unit)
    assert service.is_enabled
    assert service.is_running


def test_unit_runs_the_simulator_with_the_roles_flags_as_a_dedicated_user(host):
    assert_runs_as_its_own_user(host, "dcgm_exporter", "dcgm_exporter")
    pid = main_pid(host, "dcgm_exporter")
    argv = host.file("/proc/%s/cmdline" % pid).content.split(b"\0")[:-1]
    argv = [a.decode() for a in argv]
    assert argv[:2] == ["/usr/bin/python3", SIM]
    flags = argv[2:]
    assert flags == ["--collectors", COUNTERS, "--address", ":9400", "--collect-interval", "30000",
                     "--hpc-job-mapping-dir", MAPPING_DIR] + (["--web-config-file", WEB_CONFIG] if secured(host) else [])


@pytest.mark.parametrize("setting,value", [
    ("User", "dcgm_exporter"),
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "yes"),
    ("PrivateTmp", "yes"),
    ("PrivateDevices", "yes"),
    ("CapabilityBoundingSet", ""),
    ("AmbientCapabilities", ""),
    ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
    ("StateDirectory", "hpcobs-gpusim"),
    ("ProtectKernelModules", "yes"),
    ("MemoryDenyWriteExecute", "yes"),
])
def test_unit_is_hardened(host, setting, value):
    assert unit_property(host, "dcgm_exporter", setting) == value


def test_state_dir_belongs_to_the_service_user(host):
    state = host.file("/var/lib/hpcobs-gpusim")
    assert state.is_directory and state.user == "dcgm_exporter" and state.mode == 0o755
    # the server persists energy and topology there
    topology = json.loads(host.file("/var/lib/hpcobs-gpusim/topology.json").content_string)
    assert [g["index"] for g in topology["gpus"]] == expected(host)["gpus"]


def test_simulator_config_from_role_variables(host):
    exp = expected(host)
    config = json.loads(host.file("/etc/hpcobs-gpusim/config.json").content_string)
    assert config["gpus"] == len(exp["gpus"])
    assert config["model"] == exp["model"]
    assert config["driver_version"] == exp["driver"]
    assert config["journal"] == "journal-remote"
    assert config["state_dir"] == "/var/lib/hpcobs-gpusim"
    assert {int(k): v for k, v in config["mig"].items()} == {g: len(i) for g, i in exp["mig"].items()}


# --- HTTP endpoints -------------------------------------------------------------------------------------------------

def test_health_is_200_ok_with_registry_header_like_dcgm_exporter_4_8(host):
    # lab_gpu_simulator_emulate defaults to the newest dcgm-exporter release (4.8.x); up to 4.7.x the body was "KO"
    assert http_get(host, "/health") == (200, "OK")
    if not secured(host):  # (the secured host: test_security.py)
        script = ("import urllib.request; r = urllib.request.urlopen('%s/health', timeout=10); "
                  "print(r.headers['X-Registry-Available'])" % EXPORTER)
        assert host.check_output("python3 -c %s", script) == "true"


def test_simulator_installed_as_package_and_launcher(host):
    launcher = host.file("/usr/local/bin/hpcobs-gpusim")
    assert launcher.is_file and launcher.mode == 0o755 and launcher.user == "root"
    package = host.file("/usr/local/lib/hpcobs-gpusim/hpcobs_gpusim")
    assert package.is_directory and package.mode == 0o755
    for name in ("__init__.py", "cli.py", "server.py", "data/xid-texts.txt"):
        f = host.file("/usr/local/lib/hpcobs-gpusim/hpcobs_gpusim/" + name)
        assert f.is_file and f.mode == 0o644 and f.user == "root", name
    assert host.check_output("/usr/local/bin/hpcobs-gpusim --version").startswith("hpcobs-gpusim ")


def test_gpu_temp_series_have_the_exact_label_set(host):
    exp = expected(host)
    hostname = host.check_output("hostname").strip()
    samples, meta = parse(scrape(host))
    temps = series(samples, "DCGM_FI_DEV_GPU_TEMP")
    assert meta["DCGM_FI_DEV_GPU_TEMP"] == ("GPU die temperature (degrees C).", "gauge")
    assert sorted(s.entity for s in temps) == sorted(expected_entities(exp))
    uuids = set()
    for sample in temps:
        d = sample.d
        mig = d.get("GPU_I_ID") is not None
        assert sample.keys == (BASE_LABELS + (MIG_LABELS if mig else []) + ["Hostname", "DCGM_FI_DRIVER_VERSION"])
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", d["UUID"])
        assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:00\.0", d["pci_bus_id"])
        assert d["device"] == "nvidia%s" % d["gpu"]
        assert d["modelName"] == exp["model"]
        assert d["Hostname"] == hostname
        assert d["DCGM_FI_DRIVER_VERSION"] == exp["driver"]
        if mig:
            assert (d["GPU_I_PROFILE"], d["GPU_I_ID"]) in exp["mig"][int(d["gpu"])]
        assert 20 <= sample.value <= 100 and sample.value == int(sample.value)
        uuids.add((d["gpu"], d["UUID"]))
    # one UUID per physical GPU, different between GPUs
    assert len({u for _, u in uuids}) == len(exp["gpus"])


def test_only_the_fields_of_the_csv_are_served(host):
    rows = csv_fields(host)
    fields = {f for f, kind, _ in rows if kind != "label"}
    samples, meta = parse(scrape(host))
    assert set(meta) == fields
    assert {s.name for s in samples} == fields
    for field, kind, help_text in rows:
        if kind != "label":
            assert meta[field] == (help_text, kind)
    # a label row is a label, never a metric
    assert "DCGM_FI_DRIVER_VERSION" not in meta


def test_counters_csv_is_the_roles_file_plus_the_extra_field(host):
    rows = csv_fields(host)
    assert rows[-1] == ("DCGM_FI_DEV_FB_TOTAL", "gauge", "Total frame buffer of the GPU (MiB).")
    names = [r[0] for r in rows]
    assert len(names) == len(set(names))
    # the fields the hpcobs alert rules read are there
    for field in ["DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_XID_ERRORS",
                  "DCGM_FI_DEV_PCIE_LINK_WIDTH", "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_POWER_USAGE",
                  "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"]:
        assert field in names
    csv = host.file(COUNTERS)
    assert csv.user == "root" and csv.mode == 0o644
    samples, _ = parse(scrape(host))
    assert sorted(s.entity for s in series(samples, "DCGM_FI_DEV_FB_TOTAL")) == sorted(
        expected_entities(expected(host)))


# --- job mapping ----------------------------------------------------------------------------------------------------

def test_mapping_file_written_by_hand_labels_the_gpu(host):
    exp = expected(host)
    gpu = whole_gpu(exp)
    path = "%s/%d" % (MAPPING_DIR, gpu)
    try:
        host.check_output("echo 4242 > %s" % path)
        samples, _ = parse(scrape(host))
        mine = [s for s in samples if s.d["gpu"] == str(gpu)]
        others = [s for s in samples if s.d["gpu"] != str(gpu)]
        assert mine and others
        for sample in mine:
            assert sample.labels[-1] == ("hpc_job", "4242"), sample.labels
        assert all("hpc_job" not in s.d for s in others)

        # two jobs sharing the GPU: one copy of every series per job
        host.check_output("printf '4242\\n4343\\n' > %s" % path)
        samples, _ = parse(scrape(host))
        temps = series(samples, "DCGM_FI_DEV_GPU_TEMP", gpu)
        assert sorted(s.d["hpc_job"] for s in temps) == ["4242", "4343"]

        # the epilog's empty file: no hpc_job any more
        host.check_output(": > %s" % path)
        samples, _ = parse(scrape(host))
        assert all("hpc_job" not in s.d for s in samples)
        assert len(series(samples, "DCGM_FI_DEV_GPU_TEMP", gpu)) == 1
    finally:
        host.run("rm -f %s" % path)


def test_mapping_of_a_mig_instance(host):
    exp = expected(host)
    if not exp["mig"]:
        # hosts without MIG: a <gpu>.<gi> file names no instance and changes nothing
        path = "%s/0.1" % MAPPING_DIR
        try:
            host.check_output("echo 555 > %s" % path)
            samples, _ = parse(scrape(host))
            assert all("hpc_job" not in s.d for s in samples)
        finally:
            host.run("rm -f %s" % path)
        return
    gpu, instances = next(iter(exp["mig"].items()))
    gi = instances[-1][1]
    whole, part = "%s/%d" % (MAPPING_DIR, gpu), "%s/%d.%s" % (MAPPING_DIR, gpu, gi)
    try:
        # a whole-GPU file for a GPU in MIG mode is ignored
        host.check_output("echo 111 > %s" % whole)
        samples, _ = parse(scrape(host))
        assert all("hpc_job" not in s.d for s in samples)
        host.check_output("echo 777 > %s" % part)
        samples, _ = parse(scrape(host))
        for sample in samples:
            if sample.entity == (str(gpu), gi):
                assert sample.d["hpc_job"] == "777"
            else:
                assert "hpc_job" not in sample.d
    finally:
        host.run("rm -f %s %s" % (whole, part))


def test_junk_in_the_mapping_dir_is_ignored(host):
    names = ["%s/.hpcobs.lock" % MAPPING_DIR, "%s/notes.txt" % MAPPING_DIR]
    try:
        host.check_output("mkdir -p %s/.staging && echo 9 > %s/.staging/0" % (MAPPING_DIR, MAPPING_DIR))
        for name in names:
            host.check_output("echo 99 > %s" % name)
        samples, _ = parse(scrape(host))
        assert all("hpc_job" not in s.d for s in samples)
    finally:
        host.run("rm -rf %s %s %s/.staging" % (names[0], names[1], MAPPING_DIR))


# --- faults ---------------------------------------------------------------------------------------------------------

def value_of(host, name, gpu):
    samples, _ = parse(scrape(host))
    found = series(samples, name, gpu)
    assert found, "no %s for GPU %s" % (name, gpu)
    return found[0].value, found[0]


def test_ecc_dbe_fault_increments_the_counter(host):
    exp = expected(host)
    gpu = exp["gpus"][-1] if exp["gpus"][-1] not in exp["mig"] else exp["gpus"][0]
    try:
        before, _ = value_of(host, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu)
        assert before == 0
        host.check_output("%s fault set --gpu %d ecc-dbe --rate 4" % (SIM, gpu))
        first, _ = value_of(host, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu)
        assert first >= 1
        wait_for("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL to grow",
                 lambda: value_of(host, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu)[0] > first, 10, 0.5)
        # the other GPUs are untouched
        samples, _ = parse(scrape(host))
        assert all(s.value == 0 for s in series(samples, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") if s.d["gpu"] != str(gpu))
    finally:
        host.run("%s fault clear --gpu %d" % (SIM, gpu))
    assert value_of(host, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu)[0] == 0


def test_xid_79_shows_in_the_metric_and_as_a_kernel_line_in_the_journal(host):
    gpu = 0
    since = host.check_output("date +%s").strip()
    try:
        out = host.check_output("%s fault set --gpu %d xid --code 79" % (SIM, gpu))
        assert "[journal-remote]" in out
        value, sample = value_of(host, "DCGM_FI_DEV_XID_ERRORS", gpu)
        assert value == 79
        assert sample.labels[-2:] == [("err_code", "79"), ("err_msg", "GPU has fallen off the bus")]
        domain, bus, _ = sample.d["pci_bus_id"].split(":")
        pci = "%04x:%s:00" % (int(domain, 16), bus.lower())

        def kernel_lines():
            raw = host.check_output("journalctl --no-pager -o json -t kernel --since @%s" % since)
            return [json.loads(line) for line in raw.splitlines() if "NVRM: Xid" in line]
        records = wait_for("an NVRM: Xid line in the journal", kernel_lines, 10, 0.5)
        record = records[-1]
        assert record["MESSAGE"].startswith("NVRM: Xid (PCI:%s): 79, " % pci)
        assert "GPU has fallen off the bus" in record["MESSAGE"]
        assert record["SYSLOG_IDENTIFIER"] == "kernel"
        assert record["PRIORITY"] == "3"
        # the journal's trusted transport, as for the driver's own lines (the Loki XID rules select on it)
        assert record["_TRANSPORT"] == "kernel" and record["SYSLOG_FACILITY"] == "0"
        assert record["_BOOT_ID"] == host.file("/proc/sys/kernel/random/boot_id").content_string.strip().replace(
            "-", "")
        # journalctl -k (this boot's kernel messages) shows it, as the runbook's `journalctl -k -g 'NVRM: Xid'`
        assert "NVRM: Xid (PCI:%s): 79" % pci in host.check_output("journalctl -k --no-pager -g 'NVRM: Xid'")
    finally:
        host.run("%s fault clear --gpu %d" % (SIM, gpu))
    assert value_of(host, "DCGM_FI_DEV_XID_ERRORS", gpu)[0] == 0


# --- the mapping directory at boot ------------------------------------------------------------------------------------

def test_tmpfiles_entry_recreates_the_mapping_dir(host):
    conf = host.file("/etc/tmpfiles.d/hpcobs-dcgm-job-mapping.conf")
    assert conf.user == "root" and conf.mode == 0o644
    entries = [line for line in conf.content_string.splitlines() if line and not line.startswith("#")]
    assert entries == ["d /run/hpcobs/dcgm-job-mapping 0755 root root -"]
    # what systemd-tmpfiles-setup.service does at boot
    host.check_output("rm -rf /run/hpcobs && systemd-tmpfiles --create /etc/tmpfiles.d/hpcobs-dcgm-job-mapping.conf")
    directory = host.file(MAPPING_DIR)
    assert directory.is_directory and directory.user == "root" and directory.mode == 0o755
    # and the running exporter picks the new directory up
    path = "%s/0" % MAPPING_DIR
    try:
        host.check_output("echo 31337 > %s" % path)
        exp = expected(host)
        if 0 not in exp["mig"]:
            assert {s.d.get("hpc_job") for s in series(parse(scrape(host))[0], "DCGM_FI_DEV_GPU_TEMP", 0)} == {"31337"}
    finally:
        host.run("rm -f %s" % path)
