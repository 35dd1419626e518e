"""Checks of an offline bundle on the controller: signature, SHA256SUMS, every manifest field, hostile archives.

One place for this logic, used three ways:
  - the artifact role's module (library/hpcobs_bundle.py) in every preflight: the bundle's signature, its
    SHA256SUMS and its manifest, then the strict unpacking of each verified archive into the controller's cache;
  - scripts/unbundle.sh (through scripts/bundle-tool.py): a carried tarball is unpacked with no owner or mode taken
    from it, regular files and directories only, and accepted only when its file set equals SHA256SUMS exactly and
    the signature verifies;
  - the unit tests (tests/test_bundle_check.py), which import this file directly.

The trust root is SHA256SUMS.sig, an `ssh-keygen -Y sign` signature of SHA256SUMS in the namespace
"hpcobs-bundle", checked against an allowed_signers file (ssh-keygen(1), ALLOWED SIGNERS). SHA256SUMS names the
sha256 of manifest.json and of every file the manifest lists; the manifest names each archive's sha256. So one
signature covers every byte of the bundle.

Only the Python standard library and ssh-keygen (openssh-client) are needed, so an air-gapped controller can run
this before anything else is installed.
"""

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import zipfile

MANIFEST_FORMAT = 1
SUPPORTED_ARCHS = ("amd64", "arm64")
SIGNATURE_NAMESPACE = "hpcobs-bundle"
UNPACKED_MARKER = ".hpcobs-unpacked"

SHA256 = re.compile(r"^[0-9a-f]{64}$")
COMPONENT = re.compile(r"^[a-z0-9][a-z0-9_]{0,63}$")
DASHBOARD = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
COLLECTION = re.compile(r"^[a-z0-9][a-z0-9_]*\.[a-z0-9][a-z0-9_]*$")
# A version is one path segment: letters, digits and . _ + ~ - (no slash, never "." or "..").
VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._+~-]{0,63}$")
# An installed binary's name: one file name, no directory part.
BINARY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
SEGMENT = re.compile(r"^[A-Za-z0-9_@+~=,.-]{1,255}$")
SUMS_LINE = re.compile(r"^([0-9a-f]{64})  (\S+)$")


class BundleError(Exception):
    """A bundle that must not be used: the message says what is wrong and that nothing was changed."""


class UnsignedError(BundleError):
    pass


class SignatureError(BundleError):
    pass


def relative_path(value, what, allow_empty=False):
    """A relative path of plain segments (no '..', '.', empty segment, leading '/', backslash or control character)."""
    if not isinstance(value, str):
        raise BundleError("%s must be a string, got %r" % (what, value))
    if value == "" and allow_empty:
        return value
    segments = value.split("/")
    if not value or value.startswith("/") or any(s in ("", ".", "..") or not SEGMENT.match(s) for s in segments):
        raise BundleError("%s is not a plain relative path (no '..', no leading '/', letters, digits and ._-+~@=, "
                          "only): %r" % (what, value))
    return value


def _inside(base, path):
    base = os.path.realpath(base)
    real = os.path.realpath(path)
    return real == base or real.startswith(base + os.sep)


def _check_sha(value, what, errors):
    if not isinstance(value, str) or not SHA256.match(value):
        errors.append("%s is not a lowercase sha256: %r" % (what, value))


def validate_manifest(manifest, bundle_dir=None):
    """Check every field of manifest.json; raise BundleError listing every problem found.

    With bundle_dir, each file path must also resolve (symlinks followed) inside bundle_dir.
    """
    errors = []

    def check_path(value, what, prefix=None):
        try:
            relative_path(value, what)
        except BundleError as exc:
            errors.append(str(exc))
            return
        if prefix and not value.startswith(prefix):
            errors.append("%s must lie under %s, got %r" % (what, prefix, value))
        if bundle_dir and not _inside(bundle_dir, os.path.join(bundle_dir, value)):
            errors.append("%s resolves outside the bundle directory %s: %r" % (what, bundle_dir, value))

    if not isinstance(manifest, dict):
        raise BundleError("manifest.json is not a JSON object")
    if manifest.get("format") != MANIFEST_FORMAT:
        raise BundleError("manifest.json is not an hpcobs bundle manifest (format %r, want %d)"
                          % (manifest.get("format"), MANIFEST_FORMAT))
    archs = manifest.get("archs", [])
    if not isinstance(archs, list) or any(a not in SUPPORTED_ARCHS for a in archs):
        errors.append("archs must be a list of %s, got %r" % ("/".join(SUPPORTED_ARCHS), archs))
    components = manifest.get("components")
    if not isinstance(components, dict):
        raise BundleError("manifest.json: components must be an object")
    for name, component in sorted(components.items()):
        where = "component %r" % name
        if not COMPONENT.match(str(name)):
            errors.append("%s: bad component name (a-z, 0-9, _)" % where)
            continue
        if not isinstance(component, dict) or not isinstance(component.get("files"), dict):
            errors.append("%s: expected an object with files" % where)
            continue
        version = component.get("version")
        if not isinstance(version, str) or not VERSION.match(version) or ".." in version:
            errors.append("%s: bad version %r (one path segment: letters, digits, . _ + ~ -; never '..')"
                          % (where, version))
            continue
        for arch, entry in sorted(component["files"].items()):
            at = "%s arch %r" % (where, arch)
            if arch not in SUPPORTED_ARCHS:
                errors.append("%s: unknown architecture" % at)
                continue
            if not isinstance(entry, dict):
                errors.append("%s: expected an object" % at)
                continue
            check_path(entry.get("path"), "%s path" % at, prefix="artifacts/%s/%s/" % (name, version))
            _check_sha(entry.get("sha256"), "%s sha256" % at, errors)
            try:
                relative_path(entry.get("archive_root", ""), "%s archive_root" % at, allow_empty=True)
            except BundleError as exc:
                errors.append(str(exc))
            binaries = entry.get("binaries")
            if not isinstance(binaries, dict) or not binaries:
                errors.append("%s: binaries must be a non-empty object" % at)
                continue
            for dest, src in sorted(binaries.items()):
                if not BINARY_NAME.match(str(dest)):
                    errors.append("%s: binary name %r is not a plain file name" % (at, dest))
                try:
                    relative_path(src, "%s binary %r source" % (at, dest))
                except BundleError as exc:
                    errors.append(str(exc))
            if not isinstance(entry.get("install_tree", False), bool):
                errors.append("%s: install_tree must be true or false" % at)
    for section, pattern, prefix in (("dashboards", DASHBOARD, "dashboards/"),
                                     ("collections", COLLECTION, "collections/")):
        entries = manifest.get(section, {})
        if not isinstance(entries, dict):
            errors.append("%s must be an object" % section)
            continue
        for key, entry in sorted(entries.items()):
            where = "%s entry %r" % (section, key)
            if not pattern.match(str(key)):
                errors.append("%s: bad name" % where)
                continue
            if not isinstance(entry, dict):
                errors.append("%s: expected an object" % where)
                continue
            check_path(entry.get("path"), "%s path" % where, prefix=prefix)
            _check_sha(entry.get("sha256"), "%s sha256" % where, errors)
    if errors:
        raise BundleError("manifest.json is not acceptable: %s" % "; ".join(errors))
    return manifest


def manifest_files(manifest):
    """{bundle path: sha256} of every file the manifest lists."""
    files = {}
    for component in manifest.get("components", {}).values():
        for entry in component["files"].values():
            files[entry["path"]] = entry["sha256"]
    for section in ("dashboards", "collections"):
        for entry in manifest.get(section, {}).values():
            files[entry["path"]] = entry["sha256"]
    return files


def parse_sums(text):
    """SHA256SUMS as {path: sha256}; strictly "<sha256>  <relative path>" lines, no duplicates."""
    sums = {}
    for number, line in enumerate(text.splitlines(), 1):
        found = SUMS_LINE.match(line)
        if not found:
            raise BundleError("SHA256SUMS line %d is not '<sha256>  <path>': %r" % (number, line[:200]))
        digest, path = found.groups()
        relative_path(path, "SHA256SUMS line %d path" % number)
        if path in sums:
            raise BundleError("SHA256SUMS lists %s twice" % path)
        sums[path] = digest
    return sums


def check_sums_cover_manifest(sums, manifest, manifest_sha256):
    """SHA256SUMS must list exactly manifest.json and the manifest's files, with the same digests."""
    want = dict(manifest_files(manifest))
    want["manifest.json"] = manifest_sha256
    extra = sorted(set(sums) - set(want))
    lacking = sorted(set(want) - set(sums))
    differ = sorted(p for p in set(want) & set(sums) if want[p] != sums[p])
    problems = []
    if lacking:
        problems.append("does not list %s" % ", ".join(lacking))
    if extra:
        problems.append("lists files the manifest does not: %s" % ", ".join(extra))
    if differ:
        problems.append("disagrees with the manifest on %s" % ", ".join(
            "%s (SHA256SUMS %s, %s %s)" % (p, sums[p], "actual" if p == "manifest.json" else "manifest", want[p])
            for p in differ))
    if problems:
        raise BundleError("SHA256SUMS %s" % "; ".join(problems))


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _ssh_keygen(args, stdin_path=None):
    with open(stdin_path, "rb") if stdin_path else open(os.devnull, "rb") as stdin:
        try:
            return subprocess.run(["ssh-keygen"] + args, stdin=stdin, capture_output=True, text=True, timeout=60)
        except FileNotFoundError:
            raise BundleError("ssh-keygen is not installed (Debian/Ubuntu: openssh-client; EL: openssh): it "
                              "verifies the bundle's signature")


def trusted_keys(allowed_signers):
    """The key lines of an allowed_signers file (comments and blank lines left out)."""
    if not allowed_signers or not os.path.isfile(allowed_signers):
        raise SignatureError("no allowed_signers file at %r: the bundle's signature cannot be checked. Put the "
                             "public key of whoever signs the site's bundles there (README, offline bundle)"
                             % allowed_signers)
    with open(allowed_signers, encoding="utf-8") as handle:
        keys = [line for line in handle.read().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise SignatureError("%s holds no trusted key: add the public key of whoever signs the site's bundles "
                             "(README, offline bundle)" % allowed_signers)
    return keys


def verify_signature(sums_path, sig_path, allowed_signers):
    """Check sig_path is a valid signature of sums_path by a key of allowed_signers; return the signer's principal."""
    if not os.path.isfile(sig_path):
        raise UnsignedError("%s is missing: the bundle is not signed" % os.path.basename(sig_path))
    trusted_keys(allowed_signers)
    found = _ssh_keygen(["-Y", "find-principals", "-f", allowed_signers, "-s", sig_path])
    principals = [p for p in found.stdout.split() if p]
    if found.returncode != 0 or not principals:
        raise SignatureError("%s was not made by any key of %s (%s)"
                             % (os.path.basename(sig_path), allowed_signers,
                                (found.stderr.strip() or "no matching principal")[:300]))
    checked = _ssh_keygen(["-Y", "verify", "-f", allowed_signers, "-I", principals[0], "-n", SIGNATURE_NAMESPACE,
                           "-s", sig_path], stdin_path=sums_path)
    if checked.returncode != 0:
        raise SignatureError("the signature %s does not verify SHA256SUMS for %s (namespace %s): %s"
                             % (os.path.basename(sig_path), principals[0], SIGNATURE_NAMESPACE,
                                (checked.stderr.strip() or checked.stdout.strip())[:300]))
    return principals[0]


def check_bundle(bundle_dir, allowed_signers, allow_unsigned=False, check_files=False):
    """Check an unpacked bundle on the controller; return {manifest, signer, signed, warning}.

    Order: the signature of SHA256SUMS (unless allow_unsigned, which turns an unsigned or badly signed bundle into a
    warning), every manifest field, SHA256SUMS' own format, SHA256SUMS listing exactly manifest.json (with its actual
    sha256) and the manifest's files. check_files also reads every listed file and compares its sha256 (make unbundle
    does; the preflight checks each archive it needs instead).
    """
    manifest_path = os.path.join(bundle_dir, "manifest.json")
    sums_path = os.path.join(bundle_dir, "SHA256SUMS")
    if not os.path.isfile(manifest_path):
        raise BundleError("no offline bundle at %s (manifest.json not found)" % bundle_dir)
    if not os.path.isfile(sums_path):
        raise BundleError("%s has no SHA256SUMS" % bundle_dir)
    signer, warning = None, None
    try:
        signer = verify_signature(sums_path, sums_path + ".sig", allowed_signers)
    except (UnsignedError, SignatureError) as exc:
        if not allow_unsigned:
            raise
        warning = ("UNVERIFIED BUNDLE ACCEPTED BY OVERRIDE: %s. Nothing proves where %s came from."
                   % (exc, bundle_dir))
    manifest_sha = sha256_file(manifest_path)
    with open(manifest_path, encoding="utf-8") as handle:
        try:
            manifest = json.load(handle)
        except ValueError as exc:
            raise BundleError("manifest.json is not JSON: %s" % exc)
    validate_manifest(manifest, bundle_dir)
    with open(sums_path, encoding="utf-8") as handle:
        sums = parse_sums(handle.read())
    check_sums_cover_manifest(sums, manifest, manifest_sha)
    if check_files:
        for path, digest in sorted(sums.items()):
            full = os.path.join(bundle_dir, path)
            if not os.path.isfile(full) or os.path.islink(full):
                raise BundleError("%s is listed in SHA256SUMS but is not a regular file of the bundle" % path)
            actual = sha256_file(full)
            if actual != digest:
                raise BundleError("%s has sha256 %s but SHA256SUMS says %s" % (path, actual, digest))
    return {"manifest": manifest, "signer": signer, "signed": signer is not None, "warning": warning}


# --- archives ---------------------------------------------------------------------------------------------------

def _member_name(name, what):
    name = name[2:] if name.startswith("./") else name
    name = name.rstrip("/")
    return relative_path(name, "%s member" % what)


def archive_members(path):
    """[(name, kind 'file'|'dir', mode, reader)] of a .tar.gz/.tgz/.tar or .zip; anything else is refused.

    Refused: symbolic and hard links, devices, FIFOs, absolute names, '..' segments, setuid/setgid/sticky bits,
    duplicate names.
    """
    what = os.path.basename(path)
    members, seen = [], set()

    def add(name, kind, mode, reader):
        if mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
            raise BundleError("%s: member %s has a setuid/setgid/sticky bit (mode %o)" % (what, name, mode))
        if name in seen:
            raise BundleError("%s: member %s appears twice" % (what, name))
        seen.add(name)
        members.append((name, kind, mode, reader))

    if path.endswith(".zip"):
        archive = zipfile.ZipFile(path)
        for info in archive.infolist():
            name = _member_name(info.filename, what)
            mode = info.external_attr >> 16
            kind = "dir" if info.is_dir() else "file"
            fmt = stat.S_IFMT(mode)
            if fmt and not ((kind == "dir" and fmt == stat.S_IFDIR) or (kind == "file" and fmt == stat.S_IFREG)):
                raise BundleError("%s: member %s is not a regular file or directory (mode %o)" % (what, name, mode))
            add(name, kind, stat.S_IMODE(mode), (lambda i=info: archive.open(i)))
        return members
    try:
        archive = tarfile.open(path, "r:*")
    except tarfile.TarError as exc:
        raise BundleError("%s is not a readable archive: %s" % (what, exc))
    for info in archive.getmembers():
        if info.name in (".", "./"):
            continue
        name = _member_name(info.name, what)
        if info.isdir():
            kind = "dir"
        elif info.isreg():
            kind = "file"
        else:
            kinds = {tarfile.SYMTYPE: "a symbolic link", tarfile.LNKTYPE: "a hard link", tarfile.CHRTYPE:
                     "a character device", tarfile.BLKTYPE: "a block device", tarfile.FIFOTYPE: "a FIFO"}
            raise BundleError("%s: member %s is %s; only regular files and directories are accepted"
                              % (what, name, kinds.get(info.type, "of type %r" % info.type)))
        add(name, kind, info.mode, (lambda i=info: archive.extractfile(i)))
    return members


def safe_extract(path, dest, strip=""):
    """Extract path into dest (which must not exist yet) with no owner or mode from the archive.

    Files get 0755 when the archive marks them executable by their owner, else 0644; directories 0755. strip, when
    set, is a leading directory every member must lie under; it is removed from the names. On any failure dest is
    removed and BundleError raised.
    """
    strip = relative_path(strip or "", "archive_root", allow_empty=True)
    members = archive_members(path)
    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    partial = tempfile.mkdtemp(prefix="." + os.path.basename(dest) + ".", suffix=".partial", dir=parent)
    try:
        for name, kind, mode, reader in members:
            if strip:
                if name == strip:
                    continue
                if not name.startswith(strip + "/"):
                    raise BundleError("%s: member %s lies outside its archive root %s"
                                      % (os.path.basename(path), name, strip))
                name = name[len(strip) + 1:]
            target = os.path.join(partial, name)
            if not _inside(partial, os.path.dirname(target)):
                raise BundleError("%s: member %s resolves outside the extraction directory" % (path, name))
            if kind == "dir":
                os.makedirs(target, mode=0o755, exist_ok=True)
                os.chmod(target, 0o755)
                continue
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            if os.path.lexists(target):
                raise BundleError("%s: member %s would overwrite another" % (os.path.basename(path), name))
            source = reader()
            with source, open(target, "xb") as out:
                shutil.copyfileobj(source, out)
            os.chmod(target, 0o755 if mode & stat.S_IXUSR else 0o644)
        os.chmod(partial, 0o755)
        os.rename(partial, dest)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return dest


def unpack_verified(archive_path, cache_root, entry):
    """Unpack a verified archive into <cache_root>/<sha256>/ once, then check its binaries; return their sources and
    the sha256 of each (what the hosts' copies are compared with).

    The binaries' sources must be regular files (not links) that resolve inside the unpacked directory; each call
    checks this again, so an unpack cache from an older run is not trusted blindly.
    """
    digest = entry["sha256"]
    if not SHA256.match(digest):
        raise BundleError("not a sha256: %r" % digest)
    target = os.path.join(cache_root, digest)
    changed = False
    if not os.path.isfile(os.path.join(target, UNPACKED_MARKER)):
        if os.path.lexists(target):
            shutil.rmtree(target)
        safe_extract(archive_path, target, strip=entry.get("archive_root", ""))
        with open(os.path.join(target, UNPACKED_MARKER), "w", encoding="utf-8") as handle:
            handle.write(entry["path"] + "\n")
        changed = True
    sources = {}
    for name, src in sorted(entry["binaries"].items()):
        full = os.path.join(target, relative_path(src, "binary %s source" % name))
        if not _inside(target, full):
            raise BundleError("binary %s (%s) resolves outside %s" % (name, src, target))
        if os.path.islink(full) or not os.path.isfile(full):
            raise BundleError("%s has no regular file %s for binary %s" % (entry["path"], src, name))
        sources[name] = full
    digests = {}
    for name, full in sources.items():
        digest_of = hashlib.sha256()
        with open(full, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest_of.update(block)
        digests[name] = digest_of.hexdigest()
    return {"changed": changed, "dir": target, "sources": sources, "sha256": digests}


def unbundle(tarball, dest, allowed_signers, allow_unsigned=False):
    """Unpack a carried bundle tarball into dest (which must not exist) and check it completely.

    The tarball must hold bundle/ only, regular files and directories; nothing is taken from it but names and
    contents (files 0644, directories 0755, owned by whoever runs this). The files unpacked must be exactly those
    of SHA256SUMS plus SHA256SUMS.sig, each with its sha256, and the signature must verify (unless allow_unsigned).
    On any failure dest is removed.
    """
    members = archive_members(tarball)
    for name, kind, _, _ in members:
        if name != "bundle" and not name.startswith("bundle/"):
            raise BundleError("%s: member %s is outside bundle/" % (os.path.basename(tarball), name))
    work = dest + ".extract"
    if os.path.lexists(work):
        shutil.rmtree(work)
    try:
        safe_extract(tarball, work, strip="bundle")
        for base, _, files in os.walk(work):
            for name in files:
                full = os.path.join(base, name)
                os.chmod(full, 0o644)
        result = check_bundle(work, allowed_signers, allow_unsigned=allow_unsigned, check_files=True)
        with open(os.path.join(work, "SHA256SUMS"), encoding="utf-8") as handle:
            listed = set(parse_sums(handle.read()))
        present = {os.path.relpath(os.path.join(b, f), work) for b, _, fs in os.walk(work) for f in fs}
        unlisted = sorted(present - listed - {"SHA256SUMS", "SHA256SUMS.sig"})
        if unlisted:
            raise BundleError("the tarball holds files SHA256SUMS does not list: %s" % ", ".join(unlisted[:20]))
        os.rename(work, dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return result
