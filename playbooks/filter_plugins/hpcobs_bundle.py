"""Filters used by playbooks/bundle.yml to plan, verify and describe an offline bundle.

They turn files/artifacts.yml into a download plan, read upstream checksum files and build manifest.json. Pure
functions with no I/O, unit-tested in tests/test_bundle_plan.py.
"""

import json
import re
from urllib.parse import urlsplit

try:  # Inside Ansible the error type is Ansible's; the unit tests import this file without Ansible.
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - exercised only outside Ansible
    class AnsibleFilterError(Exception):
        pass

MANIFEST_FORMAT = 1
SUPPORTED_ARCHS = ("amd64", "arm64")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMPONENT = re.compile(r"^[a-z0-9_]+$")
_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._+~-]{0,63}$")
_BINARY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")


def _expand(template, component, **values):
    try:
        return str(template).format(**values)
    except (KeyError, IndexError, ValueError) as exc:
        raise AnsibleFilterError(
            "files/artifacts.yml: component %s: cannot expand %r (%s); only {version} and {arch} are known"
            % (component, template, exc))


def rewrite_url(url, base_url):
    """Point an upstream URL at a site mirror that keeps the upstream host and path below base_url.

    https://github.com/o/r/x.tar.gz with base http://mirror.example/hpcobs becomes
    http://mirror.example/hpcobs/github.com/o/r/x.tar.gz. An empty base keeps the upstream URL.
    """
    if not base_url:
        return url
    parts = urlsplit(url)
    if not parts.netloc:
        raise AnsibleFilterError("not an absolute URL: %r" % url)
    path = parts.path
    if parts.query:
        path += "?" + parts.query
    return "%s/%s%s" % (str(base_url).rstrip("/"), parts.netloc, path)


def _checksum_source(name, spec, version, arch, base_url):
    """(upstream checksum list URL or None, pinned sha256 or None) of one archive.

    A pin (checksum.sha256 per arch) is the trust root; the upstream checksum list, when given too, is a cross-check
    that must agree with it. Without a pin the upstream list alone is used (and the bundle is reported unpinned).
    """
    checksum = spec.get("checksum") or {}
    if not isinstance(checksum, dict) or not checksum or not ({"sha256", "url"} & set(checksum)):
        raise AnsibleFilterError(
            "files/artifacts.yml: component %s has no checksum source (checksum.url or checksum.sha256)" % name)
    pinned = None
    if "sha256" in checksum:
        pins = checksum["sha256"]
        value = pins.get(arch) if isinstance(pins, dict) else pins
        value = str(value or "").lower()
        if not _SHA256.match(value):
            raise AnsibleFilterError(
                "files/artifacts.yml: component %s arch %s: checksum.sha256 is not a sha256 (%r)" % (name, arch, value))
        pinned = value
    checksum_url = None
    if "url" in checksum:
        checksum_url = _https(_expand(checksum["url"], name, version=version, arch=arch), name)
        checksum_url = rewrite_url(checksum_url, base_url)
    return checksum_url, pinned


def _https(url, name):
    if urlsplit(str(url)).scheme != "https":
        raise AnsibleFilterError("files/artifacts.yml: component %s: %s is not an https URL (upstream URLs must be "
                                 "https; a plain-http site mirror goes in hpcobs_bundle_base_url with "
                                 "hpcobs_bundle_allow_http)" % (name, url))
    return url


def apply_pins(catalog, pins):
    """The catalog with checksum.sha256 pins taken from pins: {component: {version, sha256: {arch: sha256}}}.

    Used for a catalog of another origin (the local mirror records the pins of what it repacked). Pins for another
    version than the catalog's are refused.
    """
    if not pins:
        return catalog
    if not isinstance(pins, dict):
        raise AnsibleFilterError("pins must be a mapping of component: {version, sha256: {arch: sha256}}")
    merged = dict(catalog, components=dict(catalog.get("components") or {}))
    for name, pin in sorted(pins.items()):
        spec = merged["components"].get(name)
        if spec is None:
            raise AnsibleFilterError("pins name component %s, which files/artifacts.yml does not list" % name)
        if str(pin.get("version")) != str(spec.get("version")):
            raise AnsibleFilterError("pins for %s are for version %s, files/artifacts.yml says %s"
                                     % (name, pin.get("version"), spec.get("version")))
        checksum = dict(spec.get("checksum") or {})
        checksum["sha256"] = dict(pin.get("sha256") or {})
        merged["components"][name] = dict(spec, checksum=checksum)
    return merged


def bundle_plan(catalog, archs=None, components=None, base_url="", allow_http=False, require_pins=False):
    """Expand the catalog (files/artifacts.yml) into one download item per component and architecture.

    Upstream URLs must be https; base_url (a site mirror) too unless allow_http. With require_pins every archive
    must have a pinned sha256.
    """
    if not isinstance(catalog, dict) or not isinstance(catalog.get("components"), dict):
        raise AnsibleFilterError("files/artifacts.yml: expected a mapping with a 'components' mapping")
    if base_url and urlsplit(str(base_url)).scheme != "https" and not allow_http:
        raise AnsibleFilterError("hpcobs_bundle_base_url %s is not https: a plain-http mirror can be altered on the "
                                 "way; set -e '{\"hpcobs_bundle_allow_http\": true}' only for a mirror on this machine "
                                 "or one you otherwise trust" % base_url)
    known = catalog["components"]
    archs = list(archs or catalog.get("archs") or SUPPORTED_ARCHS)
    unknown_archs = sorted(set(archs) - set(SUPPORTED_ARCHS))
    if unknown_archs:
        raise AnsibleFilterError(
            "unknown architecture(s) %s; supported: %s" % (", ".join(unknown_archs), ", ".join(SUPPORTED_ARCHS)))
    if components in (None, "", "all"):
        wanted = sorted(known)
    else:
        wanted = list(components)
        missing = sorted(set(wanted) - set(known))
        if missing:
            raise AnsibleFilterError(
                "unknown component(s) %s; files/artifacts.yml lists: %s"
                % (", ".join(missing), ", ".join(sorted(known))))
    plan = []
    for name in wanted:
        spec = known[name]
        if not _COMPONENT.match(name):
            raise AnsibleFilterError("files/artifacts.yml: bad component name %r (use a-z, 0-9, _)" % name)
        for key in ("version", "url", "binaries"):
            if not spec.get(key):
                raise AnsibleFilterError("files/artifacts.yml: component %s has no %s" % (name, key))
        version = str(spec["version"])
        if not _VERSION.match(version) or ".." in version:
            raise AnsibleFilterError("files/artifacts.yml: component %s: bad version %r" % (name, version))
        for dest in spec["binaries"]:
            if not _BINARY.match(str(dest)):
                raise AnsibleFilterError("files/artifacts.yml: component %s: binary name %r is not a file name"
                                         % (name, dest))
        published = spec.get("archs") or catalog.get("archs") or SUPPORTED_ARCHS
        for arch in archs:
            if arch not in published:
                continue
            url = _https(_expand(spec["url"], name, version=version, arch=arch), name)
            filename = urlsplit(url).path.rsplit("/", 1)[-1]
            if not filename:
                raise AnsibleFilterError("files/artifacts.yml: component %s: URL %s names no file" % (name, url))
            checksum_url, sha256 = _checksum_source(name, spec, version, arch, base_url)
            if require_pins and not sha256:
                raise AnsibleFilterError("files/artifacts.yml: component %s arch %s has no pinned sha256 "
                                         "(hpcobs_bundle_require_pins); scripts/update-pins.py adds it" % (name, arch))
            plan.append({
                "component": name,
                "version": version,
                "arch": arch,
                "url": rewrite_url(url, base_url),
                "upstream_url": url,
                "filename": filename,
                "path": "artifacts/%s/%s/%s" % (name, version, filename),
                "checksum_url": checksum_url,
                "sha256": sha256,
                "pinned": bool(sha256),
                "archive_root": _expand(spec.get("archive_root", ""), name, version=version, arch=arch),
                "binaries": {
                    str(dest): _expand(src, name, version=version, arch=arch)
                    for dest, src in sorted(spec["binaries"].items())
                },
                "install_tree": bool(spec.get("install_tree", False)),
            })
    return plan


def sha256_from_list(text, filename, source="checksum file"):
    """Return the sha256 for filename from a sha256sum-style list, or the lone hash of a single-hash file."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip() and not line.startswith("#")]
    for line in lines:
        fields = line.split()
        if len(fields) >= 2 and fields[-1].lstrip("*").rsplit("/", 1)[-1] == filename:
            value = fields[0].lower()
            if _SHA256.match(value):
                return value
    if len(lines) == 1:
        fields = lines[0].split()
        if len(fields) == 1 and _SHA256.match(fields[0].lower()):
            return fields[0].lower()
    raise AnsibleFilterError("%s has no sha256 for %s" % (source, filename))


def bundle_expectations(plan, checksum_results):
    """Attach the sha256 to trust to each plan item.

    checksum_results are the registered results of fetching every checksum_url (ansible.builtin.uri with
    return_content, looped over the URLs). Returns {"download", "missing", "conflicts", "unpinned", "unchecked"}:
      - a pinned item is downloaded against its pin; its upstream list, when fetched, must agree (else a conflict,
        which stops the build); when the list cannot be fetched the item is listed in "unchecked";
      - an unpinned item takes the upstream list's sha256 (listed in "unpinned"); when the list cannot be fetched or
        does not name it, it cannot be verified and is never downloaded ("missing").
    """
    fetched = {r.get("item"): r for r in checksum_results or []}
    download, missing, conflicts, unpinned, unchecked = [], [], [], [], []
    for item in plan:
        result = fetched.get(item["checksum_url"]) if item.get("checksum_url") else None
        listed, reason = None, "no upstream checksum file in files/artifacts.yml"
        if item.get("checksum_url"):
            if result is None or result.get("failed") or result.get("status") != 200:
                reason = "checksum file unavailable: %s" % ((result or {}).get("msg") or "not fetched")
            else:
                try:
                    listed = sha256_from_list(result.get("content", ""), item["filename"], source=item["checksum_url"])
                except AnsibleFilterError as exc:
                    reason = str(exc)
        label = "%s/%s" % (item["component"], item["arch"])
        if item.get("sha256"):
            if listed and listed != item["sha256"]:
                conflicts.append({"component": item["component"], "arch": item["arch"], "pinned": item["sha256"],
                                  "upstream": listed, "message": "%s %s: files/artifacts.yml pins %s, the upstream "
                                  "checksum file %s says %s" % (label, item["filename"], item["sha256"],
                                                                 item["checksum_url"], listed)})
                continue
            if not listed and item.get("checksum_url"):
                unchecked.append("%s (%s)" % (label, reason))
            download.append(item)
            continue
        if not listed:
            missing.append({"component": item["component"], "arch": item["arch"], "url": item["checksum_url"],
                            "reason": reason})
            continue
        unpinned.append(label)
        download.append(dict(item, sha256=listed))
    return {"download": download, "missing": missing, "conflicts": conflicts, "unpinned": unpinned,
            "unchecked": unchecked}


_MISMATCH = re.compile(r"did not match (?:sha256:)?([0-9a-fA-F]{64}); it was ([0-9a-fA-F]{64})")


def bundle_downloads(download_results):
    """Sort the registered get_url results into verified files, unreachable ones and checksum mismatches."""
    verified, missing, mismatches = {}, [], []
    for result in download_results or []:
        item = result["item"]
        if not result.get("failed"):
            verified[item["path"]] = item["sha256"]
            continue
        message = str(result.get("msg", ""))
        found = _MISMATCH.search(message)
        if found:
            mismatches.append({
                "component": item["component"], "arch": item["arch"], "file": item["path"], "url": item["url"],
                "expected": found.group(1).lower(), "actual": found.group(2).lower(),
                "message": "%s (from %s): sha256 is %s, %s says %s"
                           % (item["path"], item["url"], found.group(2).lower(),
                              "the pin of files/artifacts.yml" if item.get("pinned") else "the upstream checksum",
                              found.group(1).lower()),
            })
        else:
            missing.append({"component": item["component"], "arch": item["arch"], "url": item["url"],
                            "reason": message or "download failed"})
    return {"verified": verified, "missing": missing, "mismatches": mismatches}


def bundle_manifest(plan, sha256s, missing=None, dashboards=None, collections=None, created="", archs=None):
    """Build manifest.json from the downloaded plan items.

    sha256s maps an item's bundle path to its verified sha256; items absent from it are left out (they are listed in
    missing with the reason).
    """
    components = {}
    for item in plan:
        digest = sha256s.get(item["path"])
        if not digest:
            continue
        entry = components.setdefault(item["component"], {"version": item["version"], "files": {}})
        entry["files"][item["arch"]] = {
            "path": item["path"],
            "sha256": digest,
            "upstream_url": item["upstream_url"],
            "archive_root": item["archive_root"],
            "binaries": item["binaries"],
            "install_tree": item["install_tree"],
        }
    return {
        "format": MANIFEST_FORMAT,
        "created": created,
        "archs": sorted(set(archs or [item["arch"] for item in plan])),
        "components": components,
        "missing": sorted(missing or [], key=lambda m: (m.get("component", ""), m.get("arch", ""))),
        "dashboards": dashboards or {},
        "collections": collections or {},
    }


def sha256sums(manifest):
    """SHA256SUMS text (sha256sum -c format) for every file the manifest names."""
    entries = []
    for component in manifest.get("components", {}).values():
        for item in component["files"].values():
            entries.append((item["path"], item["sha256"]))
    for section in ("dashboards", "collections"):
        for item in manifest.get(section, {}).values():
            entries.append((item["path"], item["sha256"]))
    return "".join("%s  %s\n" % (digest, path) for path, digest in sorted(entries))


def _relative(path, bundle_dir):
    prefix = str(bundle_dir).rstrip("/") + "/"
    if not str(path).startswith(prefix):
        raise AnsibleFilterError("%s is outside the bundle directory %s" % (path, bundle_dir))
    return str(path)[len(prefix):]


def dashboard_entries(stat_results, bundle_dir):
    """Manifest entries for the dashboards downloaded (stat results looped over the get_url results)."""
    entries = {}
    for result in stat_results or []:
        stat = result.get("stat") or {}
        if not stat.get("exists"):
            continue
        source = result["item"]["item"]
        entries[source["key"]] = {
            "id": source["value"]["id"],
            "revision": source["value"]["revision"],
            "path": _relative(stat["path"], bundle_dir),
            "sha256": stat["checksum"],
        }
    return entries


def dashboard_missing(stat_results, catalog_dashboards):
    """Dashboards of the catalog that were not downloaded, in the manifest's 'missing' form."""
    have = {r["item"]["item"]["key"] for r in stat_results or [] if (r.get("stat") or {}).get("exists")}
    return [{"component": "dashboard:%s" % key, "arch": "any", "url": str(spec.get("url", "")),
             "reason": "grafana.com dashboard %s revision %s not fetched" % (spec.get("id"), spec.get("revision"))}
            for key, spec in sorted((catalog_dashboards or {}).items()) if key not in have]


def collection_entries(found_files, bundle_dir):
    """Manifest entries for the collection tarballs (ansible.builtin.find results with sha256 checksums)."""
    entries = {}
    for found in found_files or []:
        name = found["path"].rsplit("/", 1)[-1]
        stem = name[:-len(".tar.gz")] if name.endswith(".tar.gz") else name
        parts = stem.split("-", 2)
        if len(parts) != 3:
            raise AnsibleFilterError("unexpected collection tarball name %s (want namespace-name-version.tar.gz)" % name)
        entries["%s.%s" % (parts[0], parts[1])] = {
            "version": parts[2],
            "path": _relative(found["path"], bundle_dir),
            "sha256": found["checksum"],
        }
    return entries


def installed_collection(list_json, name, version):
    """Directory of an installed collection at exactly `version`, from `ansible-galaxy collection list --format json`."""
    data = json.loads(list_json) if isinstance(list_json, str) else list_json
    for root, collections in sorted((data or {}).items()):
        found = (collections or {}).get(name)
        if found and str(found.get("version")) == str(version):
            return "%s/%s" % (root.rstrip("/"), name.replace(".", "/"))
    seen = sorted("%s %s in %s" % (name, (c or {}).get(name, {}).get("version"), root)
                  for root, c in (data or {}).items() if name in (c or {}))
    raise AnsibleFilterError("Galaxy is unreachable and %s %s is not installed here (found: %s)"
                             % (name, version, ", ".join(seen) or "none"))


def missing_summary(manifest):
    """One line per component that the bundle lacks for at least one architecture."""
    lines = {}
    for item in manifest.get("missing", []):
        lines.setdefault(item["component"], []).append(item["arch"])
    return ["%s (%s)" % (name, ", ".join(sorted(archs))) for name, archs in sorted(lines.items())]


def artifact_binaries(archive, bin_dir, names=()):
    """What hpcobs_files installs of an unpacked archive (the unpack step's outcome: sources and sha256 per binary
    name): [{dest, src, sha256, owner, group, mode}], root's 0755 programs in bin_dir; names: those of the archive's
    binaries to install (empty: all). A name the archive does not have is an error, not skipped silently."""
    sources, digests = archive.get("sources", {}), archive.get("sha256", {})
    unknown = sorted(set(names or ()) - set(sources))
    if unknown:
        raise AnsibleFilterError("artifact_binaries names %s, which the archive does not have (it has: %s)"
                                 % (", ".join(unknown), ", ".join(sorted(sources))))
    return [{"dest": "%s/%s" % (bin_dir.rstrip("/"), name), "src": sources[name], "sha256": digests[name],
             "owner": "root", "group": "root", "mode": "0755"}
            for name in sorted(sources) if not names or name in names]


_BUNDLE_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def artifact_pending(component, controller_vars, facts):
    """True until this run has verified and unpacked the component for the host's architecture (roles/artifact
    records that on the controller: artifact_unpacked, {component: [arch, ...]}); controller_vars: localhost's
    variables, facts: the host's ansible_facts. A host of an unknown architecture stays pending (the verification
    refuses it)."""
    arch = _BUNDLE_ARCH.get((facts or {}).get("architecture", ""))
    if arch is None:
        return True
    unpacked = (controller_vars or {}).get("artifact_unpacked") or {}
    return arch not in unpacked.get(str(component), [])


class FilterModule:
    def filters(self):
        return {
            "hpcobs_bundle_plan": bundle_plan,
            "hpcobs_bundle_apply_pins": apply_pins,
            "hpcobs_rewrite_url": rewrite_url,
            "hpcobs_sha256_from_list": sha256_from_list,
            "hpcobs_bundle_expectations": bundle_expectations,
            "hpcobs_bundle_downloads": bundle_downloads,
            "hpcobs_bundle_manifest": bundle_manifest,
            "hpcobs_sha256sums": sha256sums,
            "hpcobs_missing_summary": missing_summary,
            "hpcobs_dashboard_entries": dashboard_entries,
            "hpcobs_dashboard_missing": dashboard_missing,
            "hpcobs_collection_entries": collection_entries,
            "hpcobs_installed_collection": installed_collection,
            "hpcobs_artifact_binaries": artifact_binaries,
            "hpcobs_artifact_pending": artifact_pending,
        }
