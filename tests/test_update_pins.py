"""scripts/update-pins.py on a copy of files/artifacts.yml: version bump, pins written per arch, diff shown."""
import os
import shutil
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "scripts", "update-pins.py")


def run(*args):
    return subprocess.run([sys.executable, TOOL] + list(args), capture_output=True, text=True, timeout=60)


def test_a_version_bump_pins_every_arch_and_shows_the_diff(tmp_path):
    catalog = tmp_path / "artifacts.yml"
    shutil.copy(os.path.join(ROOT, "files", "artifacts.yml"), catalog)
    sums = tmp_path / "sha256sums.txt"
    sums.write_text("%s  node_exporter-1.11.2.linux-amd64.tar.gz\n%s  node_exporter-1.11.2.linux-arm64.tar.gz\n"
                    "%s  node_exporter-1.11.2.linux-386.tar.gz\n" % ("a" * 64, "b" * 64, "c" * 64))
    before = catalog.read_text()
    proc = run("node_exporter", "1.11.2", "--checksums", str(sums), "--catalog", str(catalog))
    assert proc.returncode == 0, proc.stderr
    assert '-    version: "1.11.1"' in proc.stdout and '+    version: "1.11.2"' in proc.stdout
    assert '+        amd64: "%s"' % ("a" * 64) in proc.stdout and '+        arm64: "%s"' % ("b" * 64) in proc.stdout
    assert "nothing written" in proc.stdout and catalog.read_text() == before
    proc = run("node_exporter", "1.11.2", "--checksums", str(sums), "--catalog", str(catalog), "--write")
    assert proc.returncode == 0, proc.stderr
    data = yaml.safe_load(catalog.read_text())
    node = data["components"]["node_exporter"]
    assert node["version"] == "1.11.2"
    assert node["checksum"] == {"url": "https://github.com/prometheus/node_exporter/releases/download/v{version}/"
                                       "sha256sums.txt", "sha256": {"amd64": "a" * 64, "arm64": "b" * 64}}
    # every other component and the comments are as they were
    original = yaml.safe_load(before)
    assert {k: v for k, v in data["components"].items() if k != "node_exporter"} == \
        {k: v for k, v in original["components"].items() if k != "node_exporter"}
    assert catalog.read_text().count("#") == before.count("#")
    # a second bump replaces the pins instead of adding a second block
    sums.write_text(sums.read_text().replace("1.11.2", "1.11.3").replace("a" * 64, "d" * 64))
    proc = run("node_exporter", "1.11.3", "--checksums", str(sums), "--catalog", str(catalog), "--write")
    assert proc.returncode == 0, proc.stderr
    node = yaml.safe_load(catalog.read_text())["components"]["node_exporter"]
    assert node["checksum"]["sha256"] == {"amd64": "d" * 64, "arm64": "b" * 64}
    assert catalog.read_text().count("sha256:") == before.count("sha256:") + 1


def test_a_checksum_file_without_an_arch_is_refused(tmp_path):
    catalog = tmp_path / "artifacts.yml"
    shutil.copy(os.path.join(ROOT, "files", "artifacts.yml"), catalog)
    sums = tmp_path / "sums"
    sums.write_text("%s  node_exporter-1.11.2.linux-amd64.tar.gz\n" % ("a" * 64))
    proc = run("node_exporter", "1.11.2", "--checksums", str(sums), "--catalog", str(catalog), "--write")
    assert proc.returncode != 0 and "no sha256 for node_exporter-1.11.2.linux-arm64.tar.gz" in proc.stderr
    assert catalog.read_text() == open(os.path.join(ROOT, "files", "artifacts.yml")).read()
    proc = run("node_exporter", "../1", "--checksums", str(sums), "--catalog", str(catalog))
    assert proc.returncode != 0 and "bad version" in proc.stderr
