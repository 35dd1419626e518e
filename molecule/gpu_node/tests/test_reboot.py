"""Reboot a test host: /run comes back empty, the tmpfiles entry recreates the job mapping directory, both services
start at boot and the simulator's energy counter (kept in its StateDirectory) carries on from where it was."""
import subprocess
import time

from gpu_node_lib import MAPPING_DIR, expected, http_get, parse, scrape, series


def energy(host, gpu):
    samples, _ = parse(scrape(host))
    return series(samples, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu)[0].value


def wait_until_ready(host, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        state = host.run("systemctl is-system-running --wait")
        if state.stdout.strip() in ("running", "degraded"):
            if http_get(host, "/metrics", timeout=5)[0] == 200:
                return
        time.sleep(1)
    raise AssertionError("%s did not come back after the reboot" % host.backend.name)


def test_reboot_recreates_the_mapping_dir_and_restarts_the_services(host):
    gpu = expected(host)["gpus"][0]
    marker = "%s/.before-reboot" % MAPPING_DIR
    host.check_output("touch %s" % marker)
    # the counter persists through the simulator's background tick (every 30 s) and at a clean stop
    before = energy(host, gpu)
    subprocess.run(["podman", "restart", "--time", "30", host.backend.name], check=True, capture_output=True)
    wait_until_ready(host)

    directory = host.file(MAPPING_DIR)
    assert directory.is_directory and directory.user == "root" and directory.mode == 0o755
    assert not host.file(marker).exists, "/run survived the reboot: the test proves nothing"
    for unit in ("node_exporter", "dcgm_exporter"):
        assert host.service(unit).is_running
    # a counter never goes back (rate() relies on it); the simulator keeps it in its state directory, written by the
    # service user
    assert energy(host, gpu) >= before
    state = host.file("/var/lib/hpcobs-gpusim/state.json")
    assert state.user == "dcgm_exporter" and state.group == "dcgm_exporter"
