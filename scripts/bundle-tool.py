#!/usr/bin/env python3
"""Sign, verify and unpack hpcobs offline bundles (ssh-keygen -Y, namespace hpcobs-bundle). Standard library only.

    bundle-tool.py keygen  KEY [--principal NAME]          new ed25519 signing key KEY (+ KEY.pub), prints the
                                                            allowed_signers line that trusts it
    bundle-tool.py sign    BUNDLE_DIR --key KEY             sign BUNDLE_DIR/SHA256SUMS -> SHA256SUMS.sig
    bundle-tool.py seal    BUNDLE_DIR [--key KEY]           rewrite SHA256SUMS from manifest.json (after editing it),
                                                            then sign it (unsigned without --key)
    bundle-tool.py verify  BUNDLE_DIR [--allowed-signers F] [--allow-unsigned]
                                                            signature, SHA256SUMS, manifest, every file's sha256
    bundle-tool.py unbundle TARBALL DEST [--allowed-signers F] [--allow-unsigned]
                                                            strict unpack of a carried tarball into DEST, then verify

The checks are those of the preflight (roles/artifact/module_utils/hpcobs_bundle_check.py). The allowed_signers file
defaults to HPCOBS_BUNDLE_ALLOWED_SIGNERS, else files/bundle-allowed-signers. KEY may be a public key whose private
half is in ssh-agent (a passphrase-protected or hardware key): ssh-keygen then asks the agent to sign.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "hpcobs_bundle_check", os.path.join(ROOT, "roles", "artifact", "module_utils", "hpcobs_bundle_check.py"))
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)


def allowed_signers_default():
    return os.environ.get("HPCOBS_BUNDLE_ALLOWED_SIGNERS") or os.path.join(ROOT, "files", "bundle-allowed-signers")


def keygen(key, principal):
    if os.path.exists(key):
        raise check.BundleError("%s exists already; not overwritten" % key)
    os.makedirs(os.path.dirname(os.path.abspath(key)), exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", principal, "-f", key], check=True,
                   stdin=subprocess.DEVNULL)
    return allowed_signers_line(key + ".pub", principal)


def allowed_signers_line(pub, principal):
    with open(pub, encoding="utf-8") as handle:
        fields = handle.read().split()
    return '%s namespaces="%s" %s %s\n' % (principal, check.SIGNATURE_NAMESPACE, fields[0], fields[1])


def sign(bundle_dir, key):
    sums = os.path.join(bundle_dir, "SHA256SUMS")
    if not os.path.isfile(sums):
        raise check.BundleError("%s has no SHA256SUMS to sign" % bundle_dir)
    if not os.path.isfile(key):
        raise check.BundleError("no signing key at %s" % key)
    sig = sums + ".sig"
    if os.path.lexists(sig):
        os.remove(sig)
    proc = subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", key, "-n", check.SIGNATURE_NAMESPACE, sums],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0 or not os.path.isfile(sig):
        raise check.BundleError("ssh-keygen could not sign %s with %s: %s" % (sums, key, proc.stderr.strip()[:300]))
    return sig


def seal(bundle_dir, key=None):
    """SHA256SUMS for manifest.json and every file it lists (the digests the manifest names), then sign it."""
    manifest_path = os.path.join(bundle_dir, "manifest.json")
    with open(manifest_path, encoding="utf-8") as handle:
        manifest = json.load(handle)
    check.validate_manifest(manifest, bundle_dir)
    entries = dict(check.manifest_files(manifest))
    entries["manifest.json"] = check.sha256_file(manifest_path)
    sums = os.path.join(bundle_dir, "SHA256SUMS")
    with open(sums + ".tmp", "w", encoding="utf-8") as handle:
        handle.writelines("%s  %s\n" % (digest, path) for path, digest in sorted(entries.items()))
    os.replace(sums + ".tmp", sums)
    if os.path.lexists(sums + ".sig"):
        os.remove(sums + ".sig")
    return sign(bundle_dir, key) if key else sums


def report(result, what):
    if result["warning"]:
        bar = "!" * 100
        sys.stderr.write("%s\n%s\n%s\n" % (bar, result["warning"], bar))
    else:
        print("bundle: %s signed by %s" % (what, result["signer"]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("keygen")
    p.add_argument("key")
    p.add_argument("--principal", default="hpcobs-bundle")
    p = sub.add_parser("sign")
    p.add_argument("bundle_dir")
    p.add_argument("--key", required=True)
    p = sub.add_parser("seal")
    p.add_argument("bundle_dir")
    p.add_argument("--key")
    for name, positional in (("verify", ["bundle_dir"]), ("unbundle", ["tarball", "dest"])):
        p = sub.add_parser(name)
        for arg in positional:
            p.add_argument(arg)
        p.add_argument("--allowed-signers", default=allowed_signers_default())
        p.add_argument("--allow-unsigned", action="store_true",
                       help="accept an unsigned or wrongly signed bundle, with a loud warning")
    args = parser.parse_args()
    try:
        if args.command == "keygen":
            sys.stdout.write(keygen(args.key, args.principal))
        elif args.command == "sign":
            print("bundle: signed %s" % sign(args.bundle_dir, args.key))
        elif args.command == "seal":
            print("bundle: sealed %s" % seal(args.bundle_dir, args.key))
        elif args.command == "verify":
            result = check.check_bundle(args.bundle_dir, args.allowed_signers, args.allow_unsigned, check_files=True)
            report(result, args.bundle_dir)
            print("bundle: every file verified")
        else:
            result = check.unbundle(args.tarball, args.dest, args.allowed_signers, args.allow_unsigned)
            report(result, args.tarball)
    except check.BundleError as exc:
        sys.stderr.write("bundle: REFUSED: %s\n" % exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
