#!/usr/bin/env python3
"""Build a local stand-in for the upstream release hosts, from Debian packages.

For every component of files/artifacts.yml that scripts/local-mirror/sources.yml maps to a Debian package, this
downloads the package for each architecture (apt-get download, with a private apt state so the machine's own apt
configuration is untouched), extracts the real binaries and repacks them exactly where and how upstream publishes
them: the archive at the URL path of files/artifacts.yml under <out>/<host>/..., with the upstream checksum file
next to it. playbooks/bundle.yml then runs against it through its normal download path (hpcobs_bundle_base_url).

    build.py mirror --out .cache/mirror           # archives + checksum files, all archs of artifacts.yml
    build.py tools  --out .cache/tools/bin        # host-arch test tools (vmalert-tool, amtool, promtool, ...)

Archives are byte-for-byte reproducible (sorted members, fixed mtime and owner), so a rebuilt mirror keeps its
checksums and an existing bundle is not downloaded again. Each archive carries a note naming the Debian package
and version its binaries came from.
"""
import argparse
import gzip
import hashlib
import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from urllib.parse import urlsplit

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
MTIME = 1700000000
DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def log(message):
    sys.stderr.write("local-mirror: %s\n" % message)


def debian_mirror():
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "debian-mirror.py")], check=True,
                          capture_output=True, text=True).stdout.strip()


class Apt:
    """apt-get with its own sources, lists and cache under state_dir (the system's apt state is not touched)."""

    def __init__(self, state_dir, suite, archs):
        self.state = os.path.abspath(state_dir)
        for sub in ("lists/partial", "cache/archives/partial", "etc/preferences.d", "etc/apt.conf.d"):
            os.makedirs(os.path.join(self.state, sub), exist_ok=True)
        keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
        signed = " [signed-by=%s]" % keyring if os.path.exists(keyring) else ""
        with open(os.path.join(self.state, "etc", "sources.list"), "w", encoding="utf-8") as handle:
            handle.write("deb%s %s %s main\n" % (signed, debian_mirror(), suite))
        self.options = [
            "-o", "Dir::Etc::SourceList=%s/etc/sources.list" % self.state,
            "-o", "Dir::Etc::SourceParts=/dev/null",
            "-o", "Dir::Etc::Preferences=%s/etc/preferences" % self.state,
            "-o", "Dir::Etc::PreferencesParts=%s/etc/preferences.d" % self.state,
            "-o", "Dir::State::Lists=%s/lists" % self.state,
            "-o", "Dir::Cache=%s/cache" % self.state,
            "-o", "APT::Architectures=%s" % ",".join(archs),
            "-o", "APT::Sandbox::User=root",
            "-o", "Debug::NoLocking=1",
        ]

    def update(self):
        subprocess.run(["apt-get", "-q", *self.options, "update"], check=True, stdout=subprocess.DEVNULL)

    def candidate(self, package, arch):
        out = subprocess.run(["apt-cache", *self.options, "show", "--no-all-versions", "%s:%s" % (package, arch)],
                             check=True, capture_output=True, text=True).stdout
        fields = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line and not line[0].isspace())
        return fields["Version"], fields["Filename"].rsplit("/", 1)[-1]

    def download(self, package, arch, dest_dir):
        version, filename = self.candidate(package, arch)
        path = os.path.join(dest_dir, filename)
        if not os.path.exists(path):
            subprocess.run(["apt-get", "-q", *self.options, "download", "%s:%s=%s" % (package, arch, version)],
                           check=True, cwd=dest_dir, stdout=subprocess.DEVNULL)
        return version, path


_EXTRACTED = {}


def deb_extract(deb, member_paths, dest_dir):
    """Extract a .deb once into a temporary directory under dest_dir (dpkg-deb), return {path: local file}."""
    tmp = _EXTRACTED.get(deb)
    if tmp is None:
        tmp = _EXTRACTED[deb] = tempfile.mkdtemp(dir=dest_dir)
        subprocess.run(["dpkg-deb", "-x", deb, tmp], check=True)
    found = {}
    for member in member_paths:
        path = os.path.join(tmp, member)
        if not os.path.isfile(path):
            raise SystemExit("%s has no %s" % (deb, member))
        found[member] = path
    return tmp, found


def upstream_version(debian_version):
    version = debian_version.split(":", 1)[-1].rsplit("-", 1)[0]
    return version.split("+ds", 1)[0].split("+dfsg", 1)[0]


def _tar_info(name, size, mode):
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, mode, MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def pack(archive_path, members):
    """Write a reproducible .tar.gz or .zip holding members: [(name in archive, bytes, mode)]."""
    os.makedirs(os.path.dirname(archive_path), exist_ok=True)
    tmp = archive_path + ".tmp"
    members = sorted(members)
    if archive_path.endswith(".zip"):
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data, mode in members:
                info = zipfile.ZipInfo(name, date_time=(2023, 11, 14, 22, 13, 20))
                info.external_attr = (0o100000 | mode) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, data)
    else:
        with open(tmp, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=MTIME, compresslevel=1) as gz:
                with tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
                    dirs = sorted({name.rsplit("/", 1)[0] for name, _, _ in members if "/" in name})
                    for directory in dirs:
                        info = _tar_info(directory, 0, 0o755)
                        info.type = tarfile.DIRTYPE
                        tar.addfile(info)
                    for name, data, mode in members:
                        tar.addfile(_tar_info(name, len(data), mode), io.BytesIO(data))
    os.replace(tmp, archive_path)


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def local_path(out, url):
    parts = urlsplit(url)
    return os.path.join(out, parts.netloc, parts.path.lstrip("/"))


def build_mirror(out, state_dir):
    with open(os.path.join(ROOT, "files", "artifacts.yml"), encoding="utf-8") as handle:
        catalog = yaml.safe_load(handle)
    with open(os.path.join(HERE, "sources.yml"), encoding="utf-8") as handle:
        sources = yaml.safe_load(handle)
    archs = catalog["archs"]
    apt = Apt(state_dir, sources["suite"], archs)
    apt.update()
    debs = os.path.join(state_dir, "debs")
    os.makedirs(debs, exist_ok=True)
    checksum_lists = {}
    pins = {}
    built, lacking = [], []
    for name, spec in sorted(catalog["components"].items()):
        source = sources["components"].get(name)
        if not source:
            lacking.append(name)
            continue
        version = str(spec["version"])
        for arch in spec.get("archs", archs):
            deb_version, deb = apt.download(source["package"], arch, debs)
            if upstream_version(deb_version) != version:
                log("WARNING: %s %s: Debian has %s, artifacts.yml says %s; the archive is labelled %s"
                    % (name, arch, deb_version, version, version))
            fmt = dict(version=version, arch=arch)
            root = spec.get("archive_root", "").format(**fmt)
            wanted = {dest: src for dest, src in source["binaries"].items()}
            unknown = sorted(set(wanted) - set(spec["binaries"]))
            if unknown:
                raise SystemExit("sources.yml: %s lists binaries %s that artifacts.yml does not" % (name, unknown))
            _, files = deb_extract(deb, list(wanted.values()), state_dir)
            members = []
            for dest, src in sorted(wanted.items()):
                inner = spec["binaries"][dest].format(**fmt)
                with open(files[src], "rb") as handle:
                    members.append(("%s/%s" % (root, inner) if root else inner, handle.read(), 0o755))
            note = ("These binaries were repacked by hpcobs' local mirror from the Debian package %s %s (%s),\n"
                    "in the layout of the upstream release archive. They are not the upstream build.\n"
                    % (source["package"], deb_version, arch)).encode()
            members.append(("%s/README.hpcobs-local-mirror" % root if root else "README.hpcobs-local-mirror",
                            note, 0o644))
            url = spec["url"].format(**fmt)
            archive = local_path(out, url)
            pack(archive, members)
            checksum_url = spec["checksum"]["url"].format(**fmt)
            digest = sha256_file(archive)
            checksum_lists.setdefault(local_path(out, checksum_url), {})[os.path.basename(archive)] = digest
            pins.setdefault(name, {"version": version, "sha256": {}})["sha256"][arch] = digest
            built.append("%s/%s" % (name, arch))
    for path, entries in checksum_lists.items():
        lines = ["%s  %s\n" % (digest, name) for name, digest in sorted(entries.items())]
        if path.endswith(".sha256") and len(lines) == 1:
            lines = [lines[0].split()[0] + "\n"]
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            handle.writelines(lines)
        os.replace(path + ".tmp", path)
    # The pins of these archives (they are repacks, so upstream's pins cannot apply): scripts/bundle.sh local lays
    # them over files/artifacts.yml, so the local bundle goes through the pinned path with the checksum files above
    # as its cross-check.
    with open(os.path.join(out, "pins.yml.tmp"), "w", encoding="utf-8") as handle:
        handle.write("# sha256 pins of the local mirror's repacked archives (written by scripts/local-mirror/build.py)\n")
        yaml.safe_dump(pins, handle, sort_keys=True)
    os.replace(os.path.join(out, "pins.yml.tmp"), os.path.join(out, "pins.yml"))
    log("built %d archives (%s)" % (len(built), ", ".join(built)))
    if lacking:
        log("no Debian source for: %s (a bundle built from this mirror lacks them)" % ", ".join(lacking))


def build_tools(out, state_dir):
    with open(os.path.join(HERE, "sources.yml"), encoding="utf-8") as handle:
        sources = yaml.safe_load(handle)
    arch = DEB_ARCH.get(platform.machine())
    if not arch:
        raise SystemExit("unsupported host architecture %s" % platform.machine())
    apt = Apt(state_dir, sources["suite"], [arch])
    apt.update()
    debs = os.path.join(state_dir, "debs")
    os.makedirs(debs, exist_ok=True)
    os.makedirs(out, exist_ok=True)
    by_package = {}
    for tool, spec in sources["tools"].items():
        by_package.setdefault(spec["package"], {})[tool] = spec["path"]
    for package, tools in sorted(by_package.items()):
        _, deb = apt.download(package, arch, debs)
        _, files = deb_extract(deb, list(tools.values()), state_dir)
        for tool, path in tools.items():
            shutil.copy2(files[path], os.path.join(out, tool + ".tmp"))
            os.replace(os.path.join(out, tool + ".tmp"), os.path.join(out, tool))
    log("tools in %s: %s" % (out, ", ".join(sorted(sources["tools"]))))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["mirror", "tools"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--state", default=os.path.join(ROOT, ".cache", "apt"), help="private apt state and .deb cache")
    parser.add_argument("--force", action="store_true", help="rebuild even when the inputs have not changed")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    stamp = os.path.join(out, ".hpcobs-inputs-%s" % args.what)
    inputs = inputs_digest()
    if not args.force and os.path.exists(stamp):
        with open(stamp, encoding="utf-8") as handle:
            if handle.read().strip() == inputs:
                log("%s in %s is up to date" % (args.what, out))
                return 0
    try:
        if args.what == "mirror":
            build_mirror(out, os.path.abspath(args.state))
        else:
            build_tools(out, os.path.abspath(args.state))
    finally:
        for tmp in _EXTRACTED.values():
            shutil.rmtree(tmp, ignore_errors=True)
    with open(stamp, "w", encoding="utf-8") as handle:
        handle.write(inputs + "\n")
    return 0


def inputs_digest():
    """What the output depends on: this script, sources.yml, artifacts.yml and the Debian mirror."""
    digest = hashlib.sha256(debian_mirror().encode())
    for path in (os.path.abspath(__file__), os.path.join(HERE, "sources.yml"),
                 os.path.join(ROOT, "files", "artifacts.yml")):
        with open(path, "rb") as handle:
            digest.update(handle.read())
    return digest.hexdigest()


if __name__ == "__main__":
    sys.exit(main())
