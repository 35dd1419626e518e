"""Tests for the host check (scripts/doctor.py): each check passes on a prepared machine and fails, with its cause and
its fix, when what it proves is broken. The container checks run real podman containers (the test image)."""
import importlib.util
import subprocess

import pytest

from tooling import REPO

spec = importlib.util.spec_from_file_location("hpcobs_doctor", REPO / "scripts" / "doctor.py")
doctor = importlib.util.module_from_spec(spec)
spec.loader.exec_module(doctor)


@pytest.fixture(scope="module")
def image():
    doctor.ensure_image()
    return doctor.IMAGE


@pytest.fixture
def scratch(image):
    made = doctor.Scratch()
    yield made
    made.close()
    left = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True).stdout
    assert made.tag not in left, "the doctor left containers behind"
    networks = subprocess.run(["podman", "network", "ls", "--format", "{{.Name}}"], capture_output=True, text=True)
    assert made.tag not in networks.stdout, "the doctor left its network behind"


def failure(check, *args):
    with pytest.raises(doctor.Failed) as caught:
        check(*args)
    return caught.value


def test_host_checks_pass_on_this_prepared_machine():
    for check in doctor.HOST_CHECKS:
        assert check(), check.__name__


def test_os_other_than_debian_12_or_newer_is_refused(tmp_path, monkeypatch):
    release = tmp_path / "os-release"
    monkeypatch.setattr(doctor, "OS_RELEASE", str(release))
    release.write_text('ID=debian\nVERSION_ID="11"\n')
    assert "Debian 12 or newer" in failure(doctor.check_os).cause
    release.write_text('ID=ubuntu\nVERSION_ID="24.04"\n')
    assert "ubuntu 24.04" in failure(doctor.check_os).cause
    release.write_text('ID=debian\nVERSION_ID="13"\n')
    assert doctor.check_os() == "Debian 13"
    release.unlink()
    assert "missing" in failure(doctor.check_os).cause


def test_missing_or_wrong_dropin_names_make_setup(tmp_path, monkeypatch):
    dropin = tmp_path / "50-hpcobs.conf"
    monkeypatch.setattr(doctor, "DROPIN", str(dropin))
    missing = failure(doctor.check_dropin)
    assert "missing" in missing.cause and missing.fix == "make setup"
    dropin.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024"]\n')
    assert "does not set" in failure(doctor.check_dropin).cause


def test_missing_host_package_is_named(tmp_path, monkeypatch):
    listing = tmp_path / "packages.txt"
    listing.write_text("# comment\npodman\nhpcobs-no-such-package\n")
    monkeypatch.setattr(doctor, "PACKAGES_FILE", str(listing))
    problem = failure(doctor.check_packages)
    assert problem.cause == "host packages missing: hpcobs-no-such-package" and problem.fix == "make setup"


def test_too_little_disk_or_memory_is_refused(monkeypatch):
    monkeypatch.setattr(doctor, "MIN_FREE_DISK_GIB", 10 ** 6)
    assert "GiB free" in failure(doctor.check_disk).cause
    monkeypatch.setattr(doctor, "MIN_AVAILABLE_MEMORY_GIB", 10 ** 6)
    assert "GiB of memory available" in failure(doctor.check_memory).cause


def test_container_checks_pass_and_clean_up(scratch):
    for check in doctor.CONTAINER_CHECKS:
        assert check(scratch), check.__name__


def test_ulimits_not_in_effect_are_reported(scratch, monkeypatch):
    monkeypatch.setattr(doctor, "ULIMIT", "12345")
    assert "is not in effect" in failure(doctor.check_ulimits, scratch).cause


def test_network_without_name_resolution_is_reported_with_its_fix(scratch, monkeypatch):
    def network_without_dns():
        scratch.network = scratch.tag
        subprocess.run(["podman", "network", "create", "--disable-dns", scratch.network], check=True,
                       capture_output=True)
        return scratch.network

    monkeypatch.setattr(scratch, "make_network", network_without_dns)
    monkeypatch.setattr(doctor, "NETWORK_WAIT_SECONDS", 3)
    problem = failure(doctor.check_network, scratch)
    assert "cannot resolve each other by name" in problem.cause
    assert problem.fix.startswith("apt-get install ")


def test_main_stops_at_the_first_failure_and_prints_cause_and_fix(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(doctor, "DROPIN", str(tmp_path / "absent.conf"))
    ran = []
    monkeypatch.setattr(doctor, "CONTAINER_CHECKS", [lambda scratch: ran.append(1)])
    assert doctor.main([]) == 1
    out = capsys.readouterr().out
    assert "doctor: FAILED  dropin" in out and "cause: " in out and "fix:   make setup" in out
    assert ran == [], "checks after a failure must not run"
