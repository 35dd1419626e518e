"""Damaged bundles and bad input stop the play with a clear message before anything changes on any host.

Each case runs ansible-playbook against the scenario's fresh hosts with a modified copy of the test bundle (files
are hard links; only manifest.json or the damaged file differ) or with bad variables, then checks the message and
that no file on the hosts changed. The last cases install for real and show that a damaged bundle on a re-run
leaves the running service and its binary as they were.
"""
import glob
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SCENARIO = os.path.join(ROOT, "molecule", "bundle_faults")
HOSTS = ["bf-debian12", "bf-debian13"]
# Paths that change on their own on a running host (journal, runtime state) or hold Ansible's own temp files.
VOLATILE = ("/proc", "/sys", "/run", "/dev", "/tmp", "/var/tmp", "/var/log", "/var/cache", "/root/.ansible",
            "/var/lib/systemd")
# The plays of this module unpack into their own controller cache, so what it holds comes from them alone.
CACHE_DIR = tempfile.mkdtemp(prefix="hpcobs-bf-cache-")


def podman(host, command):
    return subprocess.run(["podman", "exec", host, "sh", "-c", command], capture_output=True, text=True)


def source_bundle():
    path = os.environ.get("HPCOBS_BUNDLE_DIR") or os.path.join(ROOT, ".cache", "bundle-test", "bundle")
    assert os.path.exists(os.path.join(path, "manifest.json")), "no test bundle at %s" % path
    return path


def copy_bundle(dest):
    """A cheap copy of the test bundle: hard links, except manifest.json, SHA256SUMS(.sig) which are real copies."""
    src = source_bundle()
    shutil.copytree(src, dest, copy_function=os.link)
    for name in ("manifest.json", "SHA256SUMS", "SHA256SUMS.sig"):
        os.remove(os.path.join(dest, name))
        shutil.copy(os.path.join(src, name), os.path.join(dest, name))
    with open(os.path.join(dest, "manifest.json"), encoding="utf-8") as handle:
        return json.load(handle)


TOOL = os.path.join(ROOT, "scripts", "bundle-tool.py")
# The test bundle is signed by this machine's throw-away key (scripts/bundle.sh local); the plays trust it through
# HPCOBS_BUNDLE_ALLOWED_SIGNERS. A second key, made here, plays the intruder.
TEST_KEY = os.path.join(ROOT, ".cache", "signing", "bundle-key")
INTRUDER_DIR = tempfile.mkdtemp(prefix="hpcobs-bf-intruder-")
INTRUDER_KEY = os.path.join(INTRUDER_DIR, "key")
subprocess.run(["python3", TOOL, "keygen", INTRUDER_KEY, "--principal", "intruder@example"], check=True,
               capture_output=True)


def resign(bundle_dir, manifest, key=TEST_KEY):
    """Write manifest.json, SHA256SUMS for it and sign with key (None: unsigned), as scripts/bundle-tool.py does."""
    with open(os.path.join(bundle_dir, "manifest.json"), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=2)
    if key is None:
        # a hostile manifest cannot go through seal (it checks the manifest first): write SHA256SUMS here
        data = open(os.path.join(bundle_dir, "manifest.json"), "rb").read()
        entries = {"manifest.json": hashlib.sha256(data).hexdigest()}
        for component in manifest["components"].values():
            for item in component["files"].values():
                entries[item["path"]] = item["sha256"]
        for section in ("dashboards", "collections"):
            for item in manifest.get(section, {}).values():
                entries[item["path"]] = item["sha256"]
        with open(os.path.join(bundle_dir, "SHA256SUMS"), "w", encoding="utf-8") as handle:
            handle.writelines("%s  %s\n" % (digest, path) for path, digest in sorted(entries.items()))
        os.remove(os.path.join(bundle_dir, "SHA256SUMS.sig"))
        return
    proc = subprocess.run(["python3", TOOL, "seal", bundle_dir, "--key", key], capture_output=True, text=True)
    if proc.returncode != 0:  # a hostile manifest: seal refuses it, so sign by hand what an intruder would write
        resign(bundle_dir, manifest, key=None)
        subprocess.run(["python3", TOOL, "sign", bundle_dir, "--key", key], check=True, capture_output=True)


def write_manifest(bundle_dir, manifest):
    """A manifest edited by whoever holds the trusted key (a partial or hostile bundle, signed)."""
    resign(bundle_dir, manifest)


def damage(bundle_dir, relpath):
    """Replace a bundle file by a damaged copy (the original, hard-linked elsewhere, stays intact)."""
    path = os.path.join(bundle_dir, relpath)
    with open(path, "rb") as handle:
        data = handle.read()
    os.remove(path)
    with open(path, "wb") as handle:
        handle.write(data + b"\0")
    return hashlib.sha256(data + b"\0").hexdigest()


def run_play(playbook="apply.yml", bundle_dir=None, extra=(), env=None):
    environment = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
                       ANSIBLE_ROLES_PATH=os.path.join(ROOT, "roles"))
    if bundle_dir:
        environment["HPCOBS_BUNDLE_DIR"] = bundle_dir
    environment.update(env or {})
    cmd = ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], os.path.join(SCENARIO, playbook),
           "-e", json.dumps({"artifact_cache_dir": CACHE_DIR})]
    for item in extra:
        cmd += [item] if item.startswith("--") else ["-e", item]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=environment, timeout=900)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture
def untouched():
    """Assert that the hosts' files did not change while the test ran."""
    for host in HOSTS:
        assert podman(host, "touch /root/.hpcobs-marker && sleep 1").returncode == 0
    yield
    prune = " -o ".join("-path %s" % p for p in VOLATILE)
    for host in HOSTS:
        out = podman(host, "find / -xdev \\( %s \\) -prune -o -newer /root/.hpcobs-marker -print" % prune)
        changed = [line for line in out.stdout.splitlines() if line not in ("/", "/root")]
        assert changed == [], "%s changed: %s" % (host, changed[:20])
        assert podman(host, "getent passwd node_exporter").returncode != 0
        assert podman(host, "test -e /usr/local/bin/node_exporter").returncode != 0


def test_checksum_mismatch_names_file_and_both_checksums(tmp_path, untouched):
    bundle_dir = str(tmp_path / "bundle")
    manifest = copy_bundle(bundle_dir)
    entry = manifest["components"]["node_exporter"]["files"]["amd64"]
    actual = damage(bundle_dir, entry["path"])
    rc, out = run_play(bundle_dir=bundle_dir)
    assert rc != 0
    assert entry["path"] in out
    assert "has sha256 %s but manifest.json says %s" % (actual, entry["sha256"]) in out
    assert "nothing was changed on any host" in out


def test_every_architecture_among_the_targets_is_verified(tmp_path, untouched):
    """One host presents itself as aarch64 (fact cache): the damaged arm64 file stops the play on both hosts."""
    cache = tmp_path / "facts"
    env = {"ANSIBLE_CACHE_PLUGIN": "jsonfile", "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(cache),
           "ANSIBLE_CACHE_PLUGIN_TIMEOUT": "3600", "ANSIBLE_CACHE_PLUGIN_PREFIX": "host-"}
    proc = subprocess.run(["ansible", "-i", os.environ["MOLECULE_INVENTORY_FILE"], "all", "-m", "ansible.builtin.setup"],
                          capture_output=True, text=True, env=dict(os.environ, **env), timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:]
    cached = sorted(cache.glob("host-*bf-debian13"))
    assert len(cached) == 1, "fact cache: %s" % sorted(os.listdir(cache))
    facts_file = cached[0]

    def set_arch(arch):
        # ansible-core >= 2.19 wraps the cached facts as a JSON string under "__payload__"
        stored = json.loads(facts_file.read_text())
        facts = json.loads(stored["__payload__"]) if "__payload__" in stored else stored
        facts["ansible_architecture"] = arch
        if "__payload__" in stored:
            stored["__payload__"] = json.dumps(facts)
        else:
            stored = facts
        facts_file.write_text(json.dumps(stored))

    set_arch("aarch64")

    bundle_dir = str(tmp_path / "bundle")
    manifest = copy_bundle(bundle_dir)
    entry = manifest["components"]["node_exporter"]["files"]["arm64"]
    damage(bundle_dir, entry["path"])
    rc, out = run_play("apply-cached-facts.yml", bundle_dir=bundle_dir, env=env)
    assert rc != 0
    assert entry["path"] in out and "but manifest.json says %s" % entry["sha256"] in out
    assert "bf-debian12" in out and "bf-debian13" in out

    set_arch("ppc64le")
    rc, out = run_play("apply-cached-facts.yml", bundle_dir=source_bundle(), env=env)
    assert rc != 0
    assert "Unsupported architecture on bf-debian13: ppc64le" in out


def test_component_missing_from_the_bundle(tmp_path, untouched):
    bundle_dir = str(tmp_path / "bundle")
    manifest = copy_bundle(bundle_dir)
    del manifest["components"]["node_exporter"]
    manifest["missing"].append({"component": "node_exporter", "arch": "amd64", "url": "https://example.invalid/x",
                                "reason": "checksum file unavailable: HTTP Error 404"})
    write_manifest(bundle_dir, manifest)
    rc, out = run_play(bundle_dir=bundle_dir)
    assert rc != 0
    assert "has no node_exporter: checksum file unavailable: HTTP Error 404" in out
    assert "It has: alertmanager" in out


def test_architecture_missing_from_the_bundle(tmp_path, untouched):
    bundle_dir = str(tmp_path / "bundle")
    manifest = copy_bundle(bundle_dir)
    del manifest["components"]["node_exporter"]["files"]["amd64"]
    write_manifest(bundle_dir, manifest)
    rc, out = run_play(bundle_dir=bundle_dir)
    assert rc != 0
    assert "has node_exporter for arm64 only" in out
    assert "bf-debian12, bf-debian13 need amd64" in out


def test_no_bundle_at_all(tmp_path, untouched):
    rc, out = run_play(bundle_dir=str(tmp_path / "nowhere"))
    assert rc != 0
    assert "No offline bundle at %s" % (tmp_path / "nowhere") in out
    assert "make bundle" in out


@pytest.mark.parametrize("variable,message", [
    ('{"node_exporter_ready_timeout": "soon"}', "node_exporter_ready_timeout"),
    ('{"node_exporter_collectors_enabled": {"systemd": true}}', "node_exporter_collectors_enabled"),
    ('{"node_exporter_listen_address": "9100"}', 'node_exporter_listen_address must be [host]:port (got "9100")'),
    ('{"node_exporter_textfile_dir": "var/lib/textfile"}', "node_exporter_textfile_dir an absolute path"),
    ('{"node_exporter_collectors_disabled": ["wifi; rm -rf /"]}', "is not a collector name"),
])
def test_bad_variables_are_refused(variable, message, untouched):
    rc, out = run_play(bundle_dir=source_bundle(), extra=[variable])
    assert rc != 0
    assert message in out


# --- supply chain: signature, hostile manifest, hostile archive ----------------------------------------------------

def tamper_node_exporter(bundle_dir, manifest):
    """Replace node_exporter's amd64 archive by another one and point the manifest at it (what an intruder does)."""
    entry = manifest["components"]["node_exporter"]["files"]["amd64"]
    entry["sha256"] = damage(bundle_dir, entry["path"])
    return entry


def test_tampered_and_resigned_with_another_key_is_refused(tmp_path, untouched):
    bundle_dir = str(tmp_path / "bundle")
    manifest = copy_bundle(bundle_dir)
    tamper_node_exporter(bundle_dir, manifest)
    resign(bundle_dir, manifest, key=INTRUDER_KEY)
    rc, out = run_play(bundle_dir=bundle_dir)
    assert rc != 0
    assert "SHA256SUMS.sig was not made by any key of %s" % os.environ["HPCOBS_BUNDLE_ALLOWED_SIGNERS"] in out
    assert "Nothing was changed on any host" in out


def test_tampered_under_the_old_signature_is_refused(tmp_path, untouched):
    bundle_dir = str(tmp_path / "bundle")
    manifest = copy_bundle(bundle_dir)
    tamper_node_exporter(bundle_dir, manifest)
    sig = open(os.path.join(bundle_dir, "SHA256SUMS.sig"), "rb").read()
    resign(bundle_dir, manifest, key=None)
    with open(os.path.join(bundle_dir, "SHA256SUMS.sig"), "wb") as handle:
        handle.write(sig)
    rc, out = run_play(bundle_dir=bundle_dir)
    assert rc != 0
    assert "does not verify SHA256SUMS for hpcobs-local-test" in out


def test_unsigned_bundle_is_refused_and_the_override_is_loud(tmp_path, untouched):
    bundle_dir = str(tmp_path / "bundle")
    manifest = copy_bundle(bundle_dir)
    resign(bundle_dir, manifest, key=None)
    rc, out = run_play(bundle_dir=bundle_dir)
    assert rc != 0
    assert "SHA256SUMS.sig is missing: the bundle is not signed" in out
    # the override, as -e key=value (a string) like an operator types it; --check so that nothing is installed
    rc, out = run_play(bundle_dir=bundle_dir, extra=["hpcobs_bundle_allow_unsigned=true", "--check"])
    assert rc == 0, out[-3000:]
    assert "UNVERIFIED BUNDLE ACCEPTED BY OVERRIDE: SHA256SUMS.sig is missing" in out
    assert "!" * 100 in out


@pytest.mark.parametrize("edit,message", [
    (lambda f, c: f.update(binaries={"node_exporter": "../../../../../../root/.ssh/id_ed25519"}),
     "binary 'node_exporter' source is not a plain relative path"),
    (lambda f, c: f.update(binaries={"../escaped-bin": "node_exporter"}),
     "binary name '../escaped-bin' is not a plain file name"),
    (lambda f, c: c.update(version="../victim-dir"), "bad version '../victim-dir'"),
])
def test_hostile_manifest_signed_by_the_trusted_key_is_refused(tmp_path, untouched, edit, message):
    bundle_dir = str(tmp_path / "bundle")
    manifest = copy_bundle(bundle_dir)
    component = manifest["components"]["node_exporter"]
    for item in component["files"].values():
        edit(item, component)
    write_manifest(bundle_dir, manifest)
    rc, out = run_play(bundle_dir=bundle_dir)
    assert rc != 0
    assert "manifest.json is not acceptable" in out and message in out


def test_hostile_archive_signed_by_the_trusted_key_is_refused(tmp_path, untouched):
    """node_exporter's archive holds a symlink to a controller secret where the binary should be."""
    bundle_dir = str(tmp_path / "bundle")
    manifest = copy_bundle(bundle_dir)
    for arch, entry in manifest["components"]["node_exporter"]["files"].items():
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w:gz") as tar:
            info = tarfile.TarInfo("%s/node_exporter" % entry["archive_root"])
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/shadow"
            tar.addfile(info)
        path = os.path.join(bundle_dir, entry["path"])
        os.remove(path)
        with open(path, "wb") as handle:
            handle.write(raw.getvalue())
        entry["sha256"] = hashlib.sha256(raw.getvalue()).hexdigest()
    write_manifest(bundle_dir, manifest)
    rc, out = run_play(bundle_dir=bundle_dir)
    assert rc != 0
    assert "member %s/node_exporter is a symbolic link; only regular files and directories are accepted" \
        % manifest["components"]["node_exporter"]["files"]["amd64"]["archive_root"] in out


def test_install_then_a_damaged_bundle_leaves_the_running_service_alone(tmp_path):
    rc, out = run_play(bundle_dir=source_bundle())
    assert rc == 0, out[-3000:]
    before = {h: podman(h, "sha256sum /usr/local/bin/node_exporter; systemctl show -p MainPID --value node_exporter"
                        ).stdout for h in HOSTS}
    bundle_dir = str(tmp_path / "bundle")
    manifest = copy_bundle(bundle_dir)
    damage(bundle_dir, manifest["components"]["node_exporter"]["files"]["amd64"]["path"])
    rc, out = run_play(bundle_dir=bundle_dir)
    assert rc != 0 and "but manifest.json says" in out
    for host in HOSTS:
        assert podman(host, "sha256sum /usr/local/bin/node_exporter; systemctl show -p MainPID --value node_exporter"
                      ).stdout == before[host]
        assert podman(host, "systemctl is-active node_exporter").stdout.strip() == "active"


def test_stale_unpacked_cache_is_not_trusted_blindly(tmp_path):
    """The controller's unpack cache is keyed by the verified archive's sha256: a damaged archive never maps to it."""
    caches = glob.glob(os.path.join(CACHE_DIR, "*", ".hpcobs-unpacked"))
    manifest = json.load(open(os.path.join(source_bundle(), "manifest.json"), encoding="utf-8"))
    digests = {f["sha256"] for c in manifest["components"].values() for f in c["files"].values()}
    assert caches, "the install above should have unpacked at least one archive"
    for marker in caches:
        assert os.path.basename(os.path.dirname(marker)) in digests

