"""Hostile bundles against the controller's checks (roles/artifact/module_utils/hpcobs_bundle_check.py).

Every bundle here is built by the test in tmp_path: real .tar.gz archives, a manifest, SHA256SUMS, and signatures by
real ed25519 keys made with ssh-keygen (one trusted, one not). Each attack of the supply-chain review is replayed and
must be refused with a message that names what is wrong.
"""
import hashlib
import importlib.util
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location(
    "hpcobs_bundle_check", os.path.join(ROOT, "roles", "artifact", "module_utils", "hpcobs_bundle_check.py"))
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)
TOOL = os.path.join(ROOT, "scripts", "bundle-tool.py")


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def tar_bytes(members):
    """members: [(name, data or None for a directory, mode, type)]; type defaults to a regular file."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for member in members:
            name, data, mode = member[:3]
            kind = member[3] if len(member) > 3 else (tarfile.DIRTYPE if data is None else tarfile.REGTYPE)
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.uid, info.gid = kind, mode, 1234, 1234
            if kind == tarfile.SYMTYPE or kind == tarfile.LNKTYPE:
                info.linkname = data
                tar.addfile(info)
            elif kind in (tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE, tarfile.DIRTYPE):
                info.devmajor, info.devminor = 1, 3
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    base = tmp_path_factory.mktemp("keys")
    out = {}
    for who in ("site", "intruder"):
        key = str(base / who)
        line = subprocess.run(["python3", TOOL, "keygen", key, "--principal", "%s@example" % who], check=True,
                              capture_output=True, text=True).stdout
        signers = base / ("%s.allowed" % who)
        signers.write_text("# trusted\n" + line)
        out[who] = {"key": key, "allowed": str(signers)}
    return out


class Bundle:
    """A small bundle on disk: one component (node_exporter), amd64, a real archive."""

    def __init__(self, root, binary=b"#!/bin/sh\necho real\n"):
        self.dir = str(root / "bundle")
        self.archive = tar_bytes([("node_exporter-1.0.linux-amd64", None, 0o755),
                                  ("node_exporter-1.0.linux-amd64/node_exporter", binary, 0o755),
                                  ("node_exporter-1.0.linux-amd64/LICENSE", b"license\n", 0o644)])
        self.path = "artifacts/node_exporter/1.0/node_exporter-1.0.linux-amd64.tar.gz"
        self.manifest = {
            "format": 1, "created": "2026-12-01T00:00:00Z", "archs": ["amd64"], "missing": [],
            "components": {"node_exporter": {"version": "1.0", "files": {"amd64": {
                "path": self.path, "sha256": sha256(self.archive), "upstream_url": "https://example.org/x",
                "archive_root": "node_exporter-1.0.linux-amd64", "binaries": {"node_exporter": "node_exporter"},
                "install_tree": False}}}},
            "dashboards": {}, "collections": {},
        }
        self.write()

    def entry(self):
        return self.manifest["components"]["node_exporter"]["files"]["amd64"]

    def write(self, sums_extra=""):
        os.makedirs(os.path.join(self.dir, os.path.dirname(self.path)), exist_ok=True)
        with open(os.path.join(self.dir, self.path), "wb") as handle:
            handle.write(self.archive)
        data = json.dumps(self.manifest, indent=2).encode()
        with open(os.path.join(self.dir, "manifest.json"), "wb") as handle:
            handle.write(data)
        lines = ["%s  %s\n" % (digest, path) for path, digest in sorted(check.manifest_files(self.manifest).items())]
        lines.append("%s  manifest.json\n" % sha256(data))
        with open(os.path.join(self.dir, "SHA256SUMS"), "w", encoding="utf-8") as handle:
            handle.write("".join(sorted(lines)) + sums_extra)
        sig = os.path.join(self.dir, "SHA256SUMS.sig")
        if os.path.exists(sig):
            os.remove(sig)
        return self

    def sign(self, key):
        subprocess.run(["python3", TOOL, "sign", self.dir, "--key", key], check=True, capture_output=True)
        return self

    def pack(self, tarball):
        with tarfile.open(tarball, "w:gz") as tar:
            tar.add(self.dir, arcname="bundle")
        return tarball


@pytest.fixture
def signed(tmp_path, keys):
    return Bundle(tmp_path).sign(keys["site"]["key"])


# --- signature ----------------------------------------------------------------------------------------------------

def test_a_signed_bundle_passes_and_names_its_signer(signed, keys):
    result = check.check_bundle(signed.dir, keys["site"]["allowed"], check_files=True)
    assert result["signed"] and result["signer"] == "site@example" and result["warning"] is None
    assert result["manifest"]["components"]["node_exporter"]["version"] == "1.0"


def test_tampered_binary_with_regenerated_sums_and_resigned_by_another_key_is_refused(tmp_path, keys):
    """The attack of the review: replace the binary, rewrite manifest.json and SHA256SUMS, sign again."""
    bundle = Bundle(tmp_path, binary=b"#!/bin/sh\necho evil\n").sign(keys["intruder"]["key"])
    with pytest.raises(check.SignatureError, match=r"SHA256SUMS.sig was not made by any key of .*site.allowed"):
        check.check_bundle(bundle.dir, keys["site"]["allowed"])


def test_regenerated_sums_under_the_old_signature_is_refused(signed, keys):
    signed.manifest["components"]["node_exporter"]["files"]["amd64"]["sha256"] = "0" * 64
    sig = open(os.path.join(signed.dir, "SHA256SUMS.sig"), "rb").read()
    signed.write()
    with open(os.path.join(signed.dir, "SHA256SUMS.sig"), "wb") as handle:
        handle.write(sig)
    with pytest.raises(check.SignatureError, match=r"does not verify SHA256SUMS for site@example"):
        check.check_bundle(signed.dir, keys["site"]["allowed"])


def test_unsigned_bundle_is_refused_unless_overridden_loudly(tmp_path, keys):
    bundle = Bundle(tmp_path)
    with pytest.raises(check.UnsignedError, match="SHA256SUMS.sig is missing: the bundle is not signed"):
        check.check_bundle(bundle.dir, keys["site"]["allowed"])
    result = check.check_bundle(bundle.dir, keys["site"]["allowed"], allow_unsigned=True)
    assert not result["signed"]
    assert result["warning"].startswith("UNVERIFIED BUNDLE ACCEPTED BY OVERRIDE: SHA256SUMS.sig is missing")


def test_the_override_never_lets_a_bad_checksum_or_manifest_through(tmp_path, keys):
    bundle = Bundle(tmp_path)
    bundle.manifest["components"]["node_exporter"]["version"] = "../victim-dir"
    bundle.write()
    with pytest.raises(check.BundleError, match="bad version '../victim-dir'"):
        check.check_bundle(bundle.dir, keys["site"]["allowed"], allow_unsigned=True)


def test_an_empty_or_absent_allowed_signers_file_is_refused(signed, tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("# nobody yet\n\n")
    with pytest.raises(check.SignatureError, match="holds no trusted key"):
        check.check_bundle(signed.dir, str(empty))
    with pytest.raises(check.SignatureError, match="no allowed_signers file at"):
        check.check_bundle(signed.dir, str(tmp_path / "absent"))


def test_a_signature_in_another_namespace_is_refused(signed, keys):
    sums = os.path.join(signed.dir, "SHA256SUMS")
    os.remove(sums + ".sig")
    subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", keys["site"]["key"], "-n", "file", sums], check=True,
                   capture_output=True)
    with pytest.raises(check.SignatureError):
        check.check_bundle(signed.dir, keys["site"]["allowed"])


# --- SHA256SUMS ---------------------------------------------------------------------------------------------------

def test_sums_must_list_exactly_the_manifest_files(tmp_path, keys):
    bundle = Bundle(tmp_path)
    bundle.write(sums_extra="%s  artifacts/extra.bin\n" % ("1" * 64))
    bundle.sign(keys["site"]["key"])
    with pytest.raises(check.BundleError, match="lists files the manifest does not: artifacts/extra.bin"):
        check.check_bundle(bundle.dir, keys["site"]["allowed"])


def test_manifest_edited_after_signing_is_refused(signed, keys):
    path = os.path.join(signed.dir, "manifest.json")
    data = json.load(open(path))
    data["components"]["node_exporter"]["files"]["amd64"]["binaries"] = {"node_exporter": "LICENSE"}
    with open(path, "w") as handle:
        json.dump(data, handle)
    with pytest.raises(check.BundleError, match=r"SHA256SUMS disagrees with the manifest on manifest.json"):
        check.check_bundle(signed.dir, keys["site"]["allowed"])


def test_a_file_changed_after_signing_is_found_by_the_full_check(signed, keys):
    with open(os.path.join(signed.dir, signed.path), "ab") as handle:
        handle.write(b"\0")
    check.check_bundle(signed.dir, keys["site"]["allowed"])  # the preflight checks each archive it uses itself
    with pytest.raises(check.BundleError, match="has sha256 .* but SHA256SUMS says"):
        check.check_bundle(signed.dir, keys["site"]["allowed"], check_files=True)


@pytest.mark.parametrize("text,message", [
    ("%s  ../etc/passwd\n" % ("a" * 64), "not a plain relative path"),
    ("%s */etc/passwd\n" % ("a" * 64), "is not '<sha256>  <path>'"),
    ("%s  a\n%s  a\n" % ("a" * 64, "b" * 64), "lists a twice"),
])
def test_sums_format_is_strict(text, message):
    with pytest.raises(check.BundleError, match=message):
        check.parse_sums(text)


# --- hostile manifest fields (signed by the trusted key: the checks hold even against the key holder) ------------

def hostile(bundle, edit):
    edit(bundle.manifest)
    return bundle


@pytest.mark.parametrize("edit,message", [
    (lambda m: m["components"]["node_exporter"]["files"]["amd64"]["binaries"].update(
        {"node_exporter": "../../../../root/controller_secret"}), r"binary 'node_exporter' source is not a plain"),
    (lambda m: m["components"]["node_exporter"]["files"]["amd64"].update(
        binaries={"../escaped-bin": "node_exporter"}), r"binary name '../escaped-bin' is not a plain file name"),
    (lambda m: m["components"]["node_exporter"].update(version="../victim-dir"), r"bad version '../victim-dir'"),
    (lambda m: m["components"]["node_exporter"].update(version=".."), r"bad version '..'"),
    (lambda m: m["components"]["node_exporter"]["files"]["amd64"].update(path="/etc/shadow"),
     r"path is not a plain relative path"),
    (lambda m: m["components"]["node_exporter"]["files"]["amd64"].update(path="artifacts/loki/1.0/x.tar.gz"),
     r"path must lie under artifacts/node_exporter/1.0/"),
    (lambda m: m["components"]["node_exporter"]["files"]["amd64"].update(archive_root="/"),
     r"archive_root is not a plain relative path"),
    (lambda m: m["components"].update({"node_exporter; rm -rf /": {"version": "1", "files": {}}}),
     r"bad component name"),
    (lambda m: m["components"]["node_exporter"]["files"].update(
        s390x=dict(m["components"]["node_exporter"]["files"]["amd64"])), r"arch 's390x': unknown architecture"),
    (lambda m: m["components"]["node_exporter"]["files"]["amd64"].update(sha256="ABC"), r"sha256 is not a lowercase"),
    (lambda m: m.update(dashboards={"evil": {"path": "dashboards/../../x.json", "sha256": "a" * 64}}),
     r"dashboards entry 'evil' path is not a plain relative path"),
    (lambda m: m.update(collections={"a.b": {"path": "artifacts/a-b-1.tar.gz", "sha256": "a" * 64}}),
     r"collections entry 'a.b' path must lie under collections/"),
    (lambda m: m.update(format=2), r"not an hpcobs bundle manifest \(format 2"),
])
def test_hostile_manifest_fields_are_refused(tmp_path, keys, edit, message):
    bundle = hostile(Bundle(tmp_path), edit).write().sign(keys["site"]["key"])
    with pytest.raises(check.BundleError, match=message):
        check.check_bundle(bundle.dir, keys["site"]["allowed"])


def test_a_path_through_a_symlinked_directory_resolves_outside_the_bundle(tmp_path, keys):
    bundle = Bundle(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(os.path.join(bundle.dir, "artifacts", "node_exporter"))
    os.symlink(str(outside), os.path.join(bundle.dir, "artifacts", "node_exporter"))
    with pytest.raises(check.BundleError, match="resolves outside the bundle directory"):
        check.validate_manifest(bundle.manifest, bundle.dir)


def test_every_problem_is_listed_at_once(tmp_path):
    bundle = Bundle(tmp_path)
    entry = bundle.entry()
    entry["binaries"] = {"../x": "../../y"}
    entry["archive_root"] = "../r"
    with pytest.raises(check.BundleError) as raised:
        check.validate_manifest(bundle.manifest)
    assert str(raised.value).count(";") >= 2


# --- hostile archives (unpacked on the controller) ----------------------------------------------------------------

ROOTDIR = "node_exporter-1.0.linux-amd64"


@pytest.mark.parametrize("member,message", [
    ((ROOTDIR + "/node_exporter", "/etc/shadow", 0o777, tarfile.SYMTYPE), "is a symbolic link"),
    ((ROOTDIR + "/node_exporter", "etc/shadow", 0o644, tarfile.LNKTYPE), "is a hard link"),
    ((ROOTDIR + "/null", "", 0o666, tarfile.CHRTYPE), "is a character device"),
    ((ROOTDIR + "/fifo", "", 0o666, tarfile.FIFOTYPE), "is a FIFO"),
    ((ROOTDIR + "/node_exporter", b"x", 0o4755), "setuid/setgid/sticky"),
    ((ROOTDIR + "/../../escaped", b"x", 0o644), "not a plain relative path"),
    (("/etc/cron.d/evil", b"x", 0o644), "not a plain relative path"),
    (("elsewhere/node_exporter", b"x", 0o755), "lies outside its archive root"),
])
def test_hostile_archive_members_are_refused_and_nothing_is_left(tmp_path, member, message):
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(tar_bytes([(ROOTDIR, None, 0o755), member]))
    with pytest.raises(check.BundleError, match=message):
        check.safe_extract(str(archive), str(tmp_path / "out"), strip=ROOTDIR)
    assert sorted(os.listdir(tmp_path)) == ["a.tar.gz"]


def test_zip_symlink_member_is_refused(tmp_path):
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as z:
        info = zipfile.ZipInfo("loki-linux-amd64")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(info, "/etc/shadow")
    with pytest.raises(check.BundleError, match="not a regular file or directory"):
        check.safe_extract(str(archive), str(tmp_path / "out"))


def test_unpack_takes_no_owner_or_mode_from_the_archive(tmp_path):
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(tar_bytes([(ROOTDIR, None, 0o777), (ROOTDIR + "/bin", b"x", 0o777),
                                   (ROOTDIR + "/doc", b"y", 0o666)]))
    out = check.safe_extract(str(archive), str(tmp_path / "out"), strip=ROOTDIR)
    assert stat.S_IMODE(os.stat(os.path.join(out, "bin")).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(os.path.join(out, "doc")).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o755
    assert os.stat(os.path.join(out, "bin")).st_uid == os.getuid()


def test_unpack_verified_checks_binaries_every_time(tmp_path, signed):
    cache = tmp_path / "cache"
    entry = signed.entry()
    first = check.unpack_verified(os.path.join(signed.dir, signed.path), str(cache), entry)
    assert first["changed"] and open(first["sources"]["node_exporter"], "rb").read() == b"#!/bin/sh\necho real\n"
    # what the hosts' copies are compared with (roles/artifact install)
    assert first["sha256"] == {"node_exporter": hashlib.sha256(b"#!/bin/sh\necho real\n").hexdigest()}
    assert not check.unpack_verified(os.path.join(signed.dir, signed.path), str(cache), entry)["changed"]
    # an unpack cache left by an older, unchecked unpacker holds a link to a controller secret
    binary = first["sources"]["node_exporter"]
    os.remove(binary)
    os.symlink("/etc/shadow", binary)
    with pytest.raises(check.BundleError, match=r"binary node_exporter \(node_exporter\) resolves outside"):
        check.unpack_verified(os.path.join(signed.dir, signed.path), str(cache), entry)
    entry = dict(entry, binaries={"node_exporter": "missing"})
    with pytest.raises(check.BundleError, match="has no regular file missing"):
        check.unpack_verified(os.path.join(signed.dir, signed.path), str(cache), entry)


# --- the carried tarball (make unbundle) --------------------------------------------------------------------------

def test_unbundle_accepts_a_signed_bundle_with_plain_modes(tmp_path, signed, keys):
    tarball = signed.pack(str(tmp_path / "b.tar.gz"))
    result = check.unbundle(tarball, str(tmp_path / "dest"), keys["site"]["allowed"])
    assert result["signer"] == "site@example"
    got = {os.path.relpath(os.path.join(b, f), tmp_path / "dest") for b, _, fs in os.walk(tmp_path / "dest") for f in fs}
    assert got == {"manifest.json", "SHA256SUMS", "SHA256SUMS.sig", signed.path}
    for name in got:
        assert stat.S_IMODE(os.stat(tmp_path / "dest" / name).st_mode) == 0o644


def hostile_tarball(signed, tmp_path, extra):
    members = []
    for base, dirs, files in os.walk(signed.dir):
        rel = os.path.relpath(base, signed.dir)
        prefix = "bundle" if rel == "." else "bundle/" + rel
        members.append((prefix, None, 0o755))
        for name in files:
            members.append(("%s/%s" % (prefix, name), open(os.path.join(base, name), "rb").read(), 0o644))
    path = tmp_path / "hostile.tar.gz"
    path.write_bytes(tar_bytes(members + extra))
    return str(path)


@pytest.mark.parametrize("extra,message", [
    ([("bundle/suid-shell", b"x", 0o4755)], "setuid/setgid/sticky"),
    ([("bundle/null", "", 0o666, tarfile.CHRTYPE)], "is a character device"),
    ([("bundle/shadow", "/etc/shadow", 0o777, tarfile.SYMTYPE)], "is a symbolic link"),
    ([("bundle/notes.txt", b"unlisted", 0o644)], "holds files SHA256SUMS does not list: notes.txt"),
    ([("etc/cron.d/evil", b"x", 0o644)], "member etc/cron.d/evil is outside bundle/"),
])
def test_unbundle_refuses_a_hostile_tarball_and_leaves_nothing(tmp_path, signed, keys, extra, message):
    tarball = hostile_tarball(signed, tmp_path, extra)
    dest = tmp_path / "files" / ".bundle.new"
    with pytest.raises(check.BundleError, match=message):
        check.unbundle(tarball, str(dest), keys["site"]["allowed"])
    assert not (tmp_path / "files").exists() or os.listdir(tmp_path / "files") == []


def test_unbundle_script_refuses_and_keeps_the_current_bundle(tmp_path, keys):
    """scripts/unbundle.sh end to end on a tarball signed by an unknown key: files/bundle is left as it was."""
    bundle = Bundle(tmp_path, binary=b"evil").sign(keys["intruder"]["key"])
    tarball = bundle.pack(str(tmp_path / "b.tar.gz"))
    before = sorted(os.listdir(os.path.join(ROOT, "files")))
    env = dict(os.environ, HPCOBS_BUNDLE_ALLOWED_SIGNERS=keys["site"]["allowed"])
    proc = subprocess.run(["sh", os.path.join(ROOT, "scripts", "unbundle.sh"), tarball], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 1
    assert "bundle: REFUSED: SHA256SUMS.sig was not made by any key of" in proc.stderr
    assert "files/bundle was left as it was" in proc.stderr
    assert sorted(os.listdir(os.path.join(ROOT, "files"))) == before
    proc = subprocess.run(["sh", os.path.join(ROOT, "scripts", "unbundle.sh"), tarball], capture_output=True,
                          text=True, env=dict(env, HPCOBS_BUNDLE_ALLOW_UNSIGNED="please"))
    assert proc.returncode == 2 and "must be 'yes' or unset" in proc.stderr


def test_bundle_tool_verify_override_is_loud(tmp_path, keys):
    bundle = Bundle(tmp_path)
    proc = subprocess.run(["python3", TOOL, "verify", bundle.dir, "--allowed-signers", keys["site"]["allowed"]],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "REFUSED: SHA256SUMS.sig is missing" in proc.stderr
    proc = subprocess.run(["python3", TOOL, "verify", bundle.dir, "--allowed-signers", keys["site"]["allowed"],
                           "--allow-unsigned"], capture_output=True, text=True)
    assert proc.returncode == 0
    assert "!" * 100 in proc.stderr and "UNVERIFIED BUNDLE ACCEPTED BY OVERRIDE" in proc.stderr
    assert "every file verified" in proc.stdout
