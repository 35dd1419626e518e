"""The offline bundle: the planning/manifest code, and playbooks/bundle.yml run for real against a local HTTP mirror.

The playbook tests build a tiny mirror in a temporary directory (real .tar.gz archives and sha256 lists in the
upstream layout), serve it on 127.0.0.1 and run ansible-playbook through the bundle's normal download path.
"""
import hashlib
import http.server
import importlib.util
import io
import json
import os
import subprocess
import tarfile
import threading

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYBOOK = os.path.join(ROOT, "playbooks", "bundle.yml")

spec = importlib.util.spec_from_file_location("hpcobs_bundle", os.path.join(ROOT, "playbooks", "filter_plugins",
                                                                             "hpcobs_bundle.py"))
bundle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bundle)


def sha256(data):
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def catalog():
    with open(os.path.join(ROOT, "files", "artifacts.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


# --- planning code ----------------------------------------------------------------------------------------------

def test_plan_covers_every_component_for_both_archs(catalog):
    plan = bundle.bundle_plan(catalog)
    got = {(item["component"], item["arch"]) for item in plan}
    assert got == {(name, arch) for name in catalog["components"] for arch in ("amd64", "arm64")}
    for item in plan:
        assert item["version"] in item["url"] or item["component"] in ("loki", "promtail")
        assert item["arch"] in item["filename"]
        assert "{" not in item["url"] + item["checksum_url"] + item["archive_root"] + "".join(item["binaries"].values())
        assert item["path"] == "artifacts/%s/%s/%s" % (item["component"], item["version"], item["filename"])
    assert len({item["path"] for item in plan}) == len(plan)


def test_plan_expands_real_upstream_names(catalog):
    plan = {(i["component"], i["arch"]): i for i in bundle.bundle_plan(catalog)}
    item = plan[("node_exporter", "arm64")]
    assert item["url"] == ("https://github.com/prometheus/node_exporter/releases/download/v1.11.1/"
                           "node_exporter-1.11.1.linux-arm64.tar.gz")
    assert item["checksum_url"].endswith("/v1.11.1/sha256sums.txt")
    assert item["archive_root"] == "node_exporter-1.11.1.linux-arm64"
    vm = plan[("victoriametrics", "amd64")]
    assert vm["filename"] == "victoria-metrics-linux-amd64-v1.145.0.tar.gz"
    assert vm["binaries"] == {"victoria-metrics": "victoria-metrics-prod"}
    assert plan[("loki", "amd64")]["binaries"] == {"loki": "loki-linux-amd64"}
    assert plan[("grafana", "amd64")]["install_tree"] is True


def test_base_url_keeps_host_and_path(catalog):
    plan = bundle.bundle_plan(catalog, ["amd64"], ["alertmanager"], "http://mirror.example:8080/up/", allow_http=True)
    assert plan[0]["url"] == ("http://mirror.example:8080/up/github.com/prometheus/alertmanager/releases/download/"
                              "v0.33.1/alertmanager-0.33.1.linux-amd64.tar.gz")
    assert plan[0]["upstream_url"].startswith("https://github.com/")
    assert plan[0]["checksum_url"].startswith("http://mirror.example:8080/up/github.com/")


def test_unknown_arch_is_refused_with_the_supported_list(catalog):
    with pytest.raises(bundle.AnsibleFilterError, match=r"unknown architecture\(s\) riscv64; supported: amd64, arm64"):
        bundle.bundle_plan(catalog, ["amd64", "riscv64"])


def test_unknown_component_is_refused_with_the_known_list(catalog):
    with pytest.raises(bundle.AnsibleFilterError, match=r"unknown component\(s\) nginx; files/artifacts.yml lists: "
                                                          r"alertmanager, alloy, grafana"):
        bundle.bundle_plan(catalog, None, ["node_exporter", "nginx"])


def test_catalog_errors_name_the_component():
    with pytest.raises(bundle.AnsibleFilterError, match="component x has no checksum source"):
        bundle.bundle_plan({"components": {"x": {"version": "1", "url": "https://h/x-{arch}.tgz", "binaries": {"x": "x"}}}})
    with pytest.raises(bundle.AnsibleFilterError, match=r"component x: cannot expand .*\{release\}"):
        bundle.bundle_plan({"components": {"x": {"version": "1", "url": "https://h/{release}", "binaries": {"x": "x"},
                                                 "checksum": {"url": "https://h/s"}}}})
    pinned = bundle.bundle_plan({"archs": ["amd64"], "components": {"x": {
        "version": "1", "url": "https://h/x-{arch}.tgz", "binaries": {"x": "x"},
        "checksum": {"sha256": {"amd64": "A" * 64}}}}})
    assert pinned[0]["sha256"] == "a" * 64 and pinned[0]["checksum_url"] is None


def test_sha256_from_list_formats():
    digest = "0123456789abcdef" * 4
    listing = "%s  other.tar.gz\n%s *node_exporter-1.tar.gz\n" % ("f" * 64, digest)
    assert bundle.sha256_from_list(listing, "node_exporter-1.tar.gz") == digest
    assert bundle.sha256_from_list("%s\n" % digest.upper(), "grafana.tar.gz") == digest
    assert bundle.sha256_from_list("%s  ./dist/loki.zip\n" % digest, "loki.zip") == digest
    with pytest.raises(bundle.AnsibleFilterError, match="sums.txt has no sha256 for missing.tgz"):
        bundle.sha256_from_list(listing, "missing.tgz", source="sums.txt")


def test_expectations_and_download_outcomes():
    plan = [
        {"component": "a", "arch": "amd64", "filename": "a.tgz", "checksum_url": "http://m/a.sums", "sha256": None,
         "path": "artifacts/a/1/a.tgz", "url": "http://m/a.tgz"},
        {"component": "b", "arch": "amd64", "filename": "b.tgz", "checksum_url": "http://m/b.sums", "sha256": None,
         "path": "artifacts/b/1/b.tgz", "url": "http://m/b.tgz"},
    ]
    results = [{"item": "http://m/a.sums", "status": 200, "content": "%s  a.tgz\n" % ("1" * 64)},
               {"item": "http://m/b.sums", "status": 404, "failed": True, "msg": "HTTP Error 404"}]
    expect = bundle.bundle_expectations(plan, results)
    assert [i["component"] for i in expect["download"]] == ["a"]
    assert expect["download"][0]["sha256"] == "1" * 64
    assert expect["missing"][0]["component"] == "b" and "404" in expect["missing"][0]["reason"]

    item = expect["download"][0]
    outcome = bundle.bundle_downloads([
        {"item": item, "failed": True,
         "msg": "The checksum for /tmp/x did not match %s; it was %s." % ("1" * 64, "2" * 64)}])
    assert outcome["verified"] == {}
    mismatch = outcome["mismatches"][0]
    assert mismatch["file"] == "artifacts/a/1/a.tgz"
    assert mismatch["expected"] == "1" * 64 and mismatch["actual"] == "2" * 64
    assert "1" * 64 in mismatch["message"] and "2" * 64 in mismatch["message"]
    unreachable = bundle.bundle_downloads([{"item": item, "failed": True, "msg": "Request failed: refused"}])
    assert unreachable["missing"][0]["reason"] == "Request failed: refused"
    assert bundle.bundle_downloads([{"item": item}])["verified"] == {"artifacts/a/1/a.tgz": "1" * 64}


def test_manifest_and_sha256sums_round_trip(catalog):
    plan = bundle.bundle_plan(catalog, ["amd64"], ["node_exporter", "loki"])
    node = [item for item in plan if item["component"] == "node_exporter"][0]
    verified = {node["path"]: "3" * 64}
    manifest = bundle.bundle_manifest(plan, verified, missing=[{"component": "loki", "arch": "amd64", "reason": "x"}],
                                      created="2026-01-01T00:00:00Z", archs=["amd64"])
    assert list(manifest["components"]) == ["node_exporter"]
    entry = manifest["components"]["node_exporter"]["files"]["amd64"]
    assert entry["sha256"] == "3" * 64 and entry["binaries"] == {"node_exporter": "node_exporter"}
    assert bundle.sha256sums(manifest) == "%s  %s\n" % ("3" * 64, entry["path"])
    assert bundle.missing_summary(manifest) == ["loki (amd64)"]


def test_installed_collection_lookup():
    listing = json.dumps({"/a/ansible_collections": {"containers.podman": {"version": "1.17.0"}},
                          "/b/ansible_collections": {"containers.podman": {"version": "1.18.0"}}})
    assert bundle.installed_collection(listing, "containers.podman", "1.18.0") == \
        "/b/ansible_collections/containers/podman"
    with pytest.raises(bundle.AnsibleFilterError, match="not installed here .*1.17.0 in /a"):
        bundle.installed_collection(listing, "containers.podman", "9.9.9")


# --- bundle.yml for real ----------------------------------------------------------------------------------------

def make_tarball(members):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


class Mirror:
    """A throw-away upstream: two components, real archives, sha256 lists, served on 127.0.0.1."""

    def __init__(self, root):
        self.root = root
        self.files = {}
        for comp in ("alpha", "beta"):
            for arch in ("amd64", "arm64"):
                name = "%s-1.0.linux-%s.tar.gz" % (comp, arch)
                data = make_tarball({"%s-1.0.linux-%s/%s" % (comp, arch, comp): b"#!/bin/sh\necho %s\n" % comp.encode()})
                self.put("example.org/%s/v1.0/%s" % (comp, name), data)
            sums = "".join("%s  %s\n" % (sha256(self.files["example.org/%s/v1.0/%s-1.0.linux-%s.tar.gz"
                                                             % (comp, comp, a)]), "%s-1.0.linux-%s.tar.gz" % (comp, a))
                           for a in ("amd64", "arm64"))
            self.put("example.org/%s/v1.0/sha256sums.txt" % comp, sums.encode())
        handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=root, **k)  # noqa: E731
        http.server.SimpleHTTPRequestHandler.log_message = lambda *a: None
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def put(self, path, data):
        full = os.path.join(self.root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as handle:
            handle.write(data)
        self.files[path] = data

    def catalog(self, path):
        components = {comp: {
            "version": "1.0",
            "url": "https://example.org/%s/v{version}/%s-{version}.linux-{arch}.tar.gz" % (comp, comp),
            "checksum": {"url": "https://example.org/%s/v{version}/sha256sums.txt" % comp},
            "archive_root": "%s-{version}.linux-{arch}" % comp,
            "binaries": {comp: comp},
        } for comp in ("alpha", "beta")}
        with open(path, "w", encoding="utf-8") as handle:
            yaml.safe_dump({"format": 1, "archs": ["amd64", "arm64"], "components": components}, handle)
        return path


@pytest.fixture
def mirror(tmp_path):
    served = Mirror(str(tmp_path / "mirror"))
    yield served
    served.server.shutdown()


def signing_key(tmp_path):
    key = tmp_path / "signing" / "key"
    if not key.exists():
        line = subprocess.run(["python3", os.path.join(ROOT, "scripts", "bundle-tool.py"), "keygen", str(key),
                               "--principal", "test@example"], check=True, capture_output=True, text=True).stdout
        (tmp_path / "signing" / "allowed_signers").write_text(line)
    return str(key)


def run_bundle(tmp_path, mirror, *extra, sign=True):
    out = tmp_path / "out"
    cmd = ["ansible-playbook", PLAYBOOK,
           "-e", "hpcobs_bundle_catalog=%s" % mirror.catalog(str(tmp_path / "catalog.yml")),
           "-e", "hpcobs_bundle_base_url=%s" % mirror.url,
           "-e", "hpcobs_bundle_dir=%s" % (out / "bundle"),
           "-e", "hpcobs_bundle_archive=%s" % (out / "bundle.tar.gz"),
           "-e", '{"hpcobs_bundle_dashboards": false, "hpcobs_bundle_allow_http": true}'] + list(extra)
    if sign:
        cmd += ["-e", "hpcobs_bundle_signing_key=%s" % signing_key(tmp_path)]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0")
    env.pop("HPCOBS_BUNDLE_SIGNING_KEY", None)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return proc, out


def test_bundle_builds_verifies_and_packs(tmp_path, mirror):
    proc, out = run_bundle(tmp_path, mirror)
    assert proc.returncode == 0, proc.stdout[-3000:]
    manifest = json.loads((out / "bundle" / "manifest.json").read_text())
    assert sorted(manifest["components"]) == ["alpha", "beta"]
    assert manifest["missing"] == []
    entry = manifest["components"]["beta"]["files"]["arm64"]
    assert entry["sha256"] == sha256(mirror.files["example.org/beta/v1.0/beta-1.0.linux-arm64.tar.gz"])
    assert entry["upstream_url"] == "https://example.org/beta/v1.0/beta-1.0.linux-arm64.tar.gz"
    # every file of the bundle is listed and verifies with the standard tool
    check = subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=out / "bundle",
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    listed = {line.split("  ", 1)[1] for line in (out / "bundle" / "SHA256SUMS").read_text().splitlines()}
    on_disk = {os.path.relpath(os.path.join(b, f), out / "bundle") for b, _, fs in os.walk(out / "bundle") for f in fs}
    assert on_disk - {"SHA256SUMS", "SHA256SUMS.sig"} == listed
    # SHA256SUMS is signed, and the signature verifies with the key's allowed_signers line
    verify = subprocess.run(["python3", os.path.join(ROOT, "scripts", "bundle-tool.py"), "verify", str(out / "bundle"),
                             "--allowed-signers", str(tmp_path / "signing" / "allowed_signers")],
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    assert "signed by test@example" in verify.stdout
    # Galaxy is unreachable here: the pinned collection is packed from the installed copy
    assert "containers.podman" in manifest["collections"]
    # the tarball carries the same tree, and its own checksum file matches
    with tarfile.open(out / "bundle.tar.gz") as tar:
        names = tar.getnames()
    assert "bundle/manifest.json" in names and "bundle/SHA256SUMS.sig" in names and "bundle/" + entry["path"] in names
    digest = (out / "bundle.tar.gz.sha256").read_text().split()[0]
    assert digest == sha256((out / "bundle.tar.gz").read_bytes())


def test_checksum_mismatch_stops_and_names_file_and_both_checksums(tmp_path, mirror):
    path = "example.org/alpha/v1.0/alpha-1.0.linux-amd64.tar.gz"
    expected = sha256(mirror.files[path])
    mirror.put(path, make_tarball({"alpha-1.0.linux-amd64/alpha": b"tampered"}))
    proc, out = run_bundle(tmp_path, mirror, "-e", '{"hpcobs_bundle_allow_missing": true}')
    assert proc.returncode != 0
    assert "Checksum mismatch" in proc.stdout
    assert "artifacts/alpha/1.0/alpha-1.0.linux-amd64.tar.gz" in proc.stdout
    assert expected in proc.stdout and sha256(mirror.files[path]) in proc.stdout
    assert not (out / "bundle" / "manifest.json").exists()
    assert not (out / "bundle" / "artifacts" / "alpha" / "1.0" / "alpha-1.0.linux-amd64.tar.gz").exists()


def test_unreachable_artifact_fails_unless_a_partial_bundle_is_allowed(tmp_path, mirror):
    os.remove(os.path.join(mirror.root, "example.org/beta/v1.0/beta-1.0.linux-arm64.tar.gz"))
    proc, _ = run_bundle(tmp_path, mirror)
    assert proc.returncode != 0
    assert "Could not download: beta/arm64" in proc.stdout
    proc, out = run_bundle(tmp_path, mirror, "-e", '{"hpcobs_bundle_allow_missing": true}')
    assert proc.returncode == 0, proc.stdout[-3000:]
    manifest = json.loads((out / "bundle" / "manifest.json").read_text())
    assert list(manifest["components"]["beta"]["files"]) == ["amd64"]
    assert [(m["component"], m["arch"]) for m in manifest["missing"]] == [("beta", "arm64")]
    assert "MISSING (bundle is partial): beta (arm64)" in proc.stdout


def test_unknown_arch_fails_before_any_download(tmp_path, mirror):
    proc, out = run_bundle(tmp_path, mirror, "-e", '{"hpcobs_bundle_archs": ["amd64", "s390x"]}')
    assert proc.returncode != 0
    assert "unknown architecture(s) s390x; supported: amd64, arm64" in proc.stdout
    assert not (out / "bundle").exists()


def test_bad_settings_fail_with_a_clear_message(tmp_path, mirror):
    proc, out = run_bundle(tmp_path, mirror, "-e", "hpcobs_bundle_allow_missing=yes-please")
    assert proc.returncode != 0
    assert "hpcobs_bundle_allow_missing a boolean" in proc.stdout
    assert not (out / "bundle").exists()


def test_no_signing_key_fails_before_any_download_unless_unsigned_on_purpose(tmp_path, mirror):
    proc, out = run_bundle(tmp_path, mirror, sign=False)
    assert proc.returncode != 0
    assert "No signing key given. The air-gapped side accepts only a bundle signed by a key it trusts" in proc.stdout
    assert not (out / "bundle").exists()
    proc, out = run_bundle(tmp_path, mirror, "-e", "hpcobs_bundle_signing_key=%s" % (tmp_path / "nokey"), sign=False)
    assert proc.returncode != 0 and "No signing key at %s" % (tmp_path / "nokey") in proc.stdout
    proc, out = run_bundle(tmp_path, mirror, "-e", '{"hpcobs_bundle_unsigned": true}', sign=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert not (out / "bundle" / "SHA256SUMS.sig").exists()
    assert "UNSIGNED: the air-gapped side will refuse this bundle" in proc.stdout


# --- pins ---------------------------------------------------------------------------------------------------------

def pinned_catalog(mirror, path, pins):
    """The mirror's catalog with checksum.sha256 pins {component: {arch: sha256}} (the checksum list stays)."""
    mirror.catalog(path)
    with open(path, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    for comp, by_arch in pins.items():
        data["components"][comp]["checksum"]["sha256"] = by_arch
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(data, handle)
    return path


def real_pins(mirror, comp, version="1.0"):
    return {a: sha256(mirror.files["example.org/%s/v%s/%s-%s.linux-%s.tar.gz" % (comp, version, comp, version, a)])
            for a in ("amd64", "arm64")}


def test_pins_are_the_trust_root_and_the_upstream_list_a_cross_check():
    plan = [{"component": "a", "arch": "amd64", "filename": "a.tgz", "checksum_url": "https://m/a.sums",
             "sha256": "1" * 64, "pinned": True, "path": "artifacts/a/1/a.tgz"}]
    agree = [{"item": "https://m/a.sums", "status": 200, "content": "%s  a.tgz\n" % ("1" * 64)}]
    assert bundle.bundle_expectations(plan, agree)["download"][0]["sha256"] == "1" * 64
    disagree = [{"item": "https://m/a.sums", "status": 200, "content": "%s  a.tgz\n" % ("2" * 64)}]
    outcome = bundle.bundle_expectations(plan, disagree)
    assert outcome["download"] == [] and "files/artifacts.yml pins 1111" in outcome["conflicts"][0]["message"]
    unavailable = [{"item": "https://m/a.sums", "status": 404, "failed": True, "msg": "HTTP Error 404"}]
    outcome = bundle.bundle_expectations(plan, unavailable)
    assert outcome["download"] == plan and outcome["unchecked"] == ["a/amd64 (checksum file unavailable: HTTP Error 404)"]


def test_catalog_urls_must_be_https_and_pins_must_match_the_version(catalog):
    bad = {"components": {"x": {"version": "1", "url": "http://h/x-{arch}.tgz", "binaries": {"x": "x"},
                                "checksum": {"url": "https://h/s"}}}}
    with pytest.raises(bundle.AnsibleFilterError, match="http://h/x-amd64.tgz is not an https URL"):
        bundle.bundle_plan(bad)
    with pytest.raises(bundle.AnsibleFilterError, match="hpcobs_bundle_base_url http://m is not https"):
        bundle.bundle_plan(catalog, ["amd64"], ["alertmanager"], "http://m")
    with pytest.raises(bundle.AnsibleFilterError, match="pins for alertmanager are for version 0.1, files/artifacts"):
        bundle.apply_pins(catalog, {"alertmanager": {"version": "0.1", "sha256": {"amd64": "a" * 64}}})
    with pytest.raises(bundle.AnsibleFilterError, match="has no pinned sha256"):
        bundle.bundle_plan(catalog, ["amd64"], ["alertmanager"], require_pins=True)
    pinned = bundle.apply_pins(catalog, {"alertmanager": {"version": "0.33.1", "sha256": {"amd64": "a" * 64}}})
    item = bundle.bundle_plan(pinned, ["amd64"], ["alertmanager"], require_pins=True)[0]
    assert item["sha256"] == "a" * 64 and item["checksum_url"].endswith("/v0.33.1/sha256sums.txt")
    with pytest.raises(bundle.AnsibleFilterError, match="bad version '../x'"):
        bundle.bundle_plan({"components": {"x": dict(bad["components"]["x"], version="../x")}})


def test_a_version_bump_with_a_stale_pin_stops_the_build(tmp_path, mirror):
    """beta moves to 1.1 in the catalog, but its pins are still 1.0's: the download does not match, nothing added."""
    for arch in ("amd64", "arm64"):
        name = "beta-1.1.linux-%s.tar.gz" % arch
        mirror.put("example.org/beta/v1.1/%s" % name, make_tarball({"beta-1.1.linux-%s/beta" % arch: b"beta 1.1"}))
    sums = "".join("%s  beta-1.1.linux-%s.tar.gz\n" % (sha256(mirror.files["example.org/beta/v1.1/beta-1.1.linux-%s"
                                                                          ".tar.gz" % a]), a) for a in ("amd64", "arm64"))
    mirror.put("example.org/beta/v1.1/sha256sums.txt", sums.encode())
    path = pinned_catalog(mirror, str(tmp_path / "pinned.yml"), {"beta": real_pins(mirror, "beta")})
    data = yaml.safe_load(open(path))
    data["components"]["beta"]["version"] = "1.1"
    yaml.safe_dump(data, open(path, "w"))
    proc, out = run_bundle(tmp_path, mirror, "-e", "hpcobs_bundle_catalog=%s" % path)
    assert proc.returncode != 0
    assert "Pinned sha256 and upstream checksum file disagree" in proc.stdout
    assert "beta/amd64 beta-1.1.linux-amd64.tar.gz: files/artifacts.yml pins %s" % real_pins(mirror, "beta")["amd64"] \
        in proc.stdout
    assert not (out / "bundle" / "manifest.json").exists()


def test_a_pin_is_enforced_even_when_the_upstream_list_is_gone_or_rewritten(tmp_path, mirror):
    pins = {"alpha": real_pins(mirror, "alpha"), "beta": real_pins(mirror, "beta")}
    path = pinned_catalog(mirror, str(tmp_path / "pinned.yml"), pins)
    original = mirror.files["example.org/alpha/v1.0/alpha-1.0.linux-amd64.tar.gz"]
    # an attacker on the mirror replaces alpha's amd64 archive and rewrites the checksum list to match
    evil = make_tarball({"alpha-1.0.linux-amd64/alpha": b"evil"})
    mirror.put("example.org/alpha/v1.0/alpha-1.0.linux-amd64.tar.gz", evil)
    mirror.put("example.org/alpha/v1.0/sha256sums.txt", ("%s  alpha-1.0.linux-amd64.tar.gz\n" % sha256(evil)).encode())
    proc, out = run_bundle(tmp_path, mirror, "-e", "hpcobs_bundle_catalog=%s" % path,
                           "-e", '{"hpcobs_bundle_require_pins": true}')
    assert proc.returncode != 0
    assert "files/artifacts.yml pins %s" % pins["alpha"]["amd64"] in proc.stdout
    # without the list at all, the pin alone still decides: beta is built, alpha arm64 too (its list is gone)
    os.remove(os.path.join(mirror.root, "example.org/alpha/v1.0/sha256sums.txt"))
    mirror.put("example.org/alpha/v1.0/alpha-1.0.linux-amd64.tar.gz", original)
    proc, out = run_bundle(tmp_path, mirror, "-e", "hpcobs_bundle_catalog=%s" % path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "Pinned but not cross-checked (upstream checksum file unavailable): alpha/amd64" in proc.stdout
    assert "UNPINNED (checked against the upstream checksum file only): nothing" in proc.stdout


def test_a_plain_http_mirror_is_refused_unless_allowed(tmp_path, mirror):
    proc, out = run_bundle(tmp_path, mirror, "-e", '{"hpcobs_bundle_allow_http": false}')
    assert proc.returncode != 0
    assert "hpcobs_bundle_base_url %s is not https" % mirror.url in proc.stdout
    assert not (out / "bundle").exists()
