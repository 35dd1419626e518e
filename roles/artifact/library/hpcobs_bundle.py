#!/usr/bin/python
"""Ansible module: check the offline bundle on the controller, or unpack verified archives from it strictly."""

DOCUMENTATION = r"""
module: hpcobs_bundle
short_description: Check the hpcobs offline bundle (signature, SHA256SUMS, manifest) or unpack its archives safely
description:
  - C(step=check) verifies SHA256SUMS.sig (ssh-keygen -Y verify, namespace hpcobs-bundle) against an allowed_signers
    file, then that SHA256SUMS lists exactly manifest.json (with its actual sha256) and the manifest's files, and
    that every manifest field is safe to use as a name or a path. Returns the manifest.
  - C(step=unpack) unpacks verified archives into the controller's cache (one directory per sha256) with regular
    files and directories only, no owner or mode from the archive, and checks every binary's source resolves to a
    regular file inside it.
  - Runs on the controller (delegate_to localhost). The logic is in module_utils/hpcobs_bundle_check.py.
options:
  step:
    type: str
    required: true
    choices: [check, unpack]
    description: What to do.
  bundle_dir:
    type: path
    required: true
    description: The unpacked bundle (manifest.json, SHA256SUMS, SHA256SUMS.sig).
  allowed_signers:
    type: path
    description: allowed_signers file of the keys trusted to sign bundles (step=check).
  allow_unsigned:
    type: bool
    default: false
    description: Accept an unsigned or wrongly signed bundle with a loud warning (step=check).
  cache_dir:
    type: path
    description: Controller directory of unpacked archives (step=unpack).
  files:
    type: list
    elements: dict
    description: Manifest file entries to unpack (step=unpack).
"""

RETURN = r"""
manifest: {description: The checked manifest (step=check), type: dict, returned: success}
signer: {description: Principal whose key signed SHA256SUMS, or null, type: str, returned: success}
signed: {description: Whether the signature verified, type: bool, returned: success}
unpacked: {description: Per archive sha256, its directory, binary sources and their sha256 (step=unpack), type: dict, returned: success}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.hpcobs_bundle_check import BundleError, check_bundle, relative_path, unpack_verified


def main():
    module = AnsibleModule(
        argument_spec=dict(
            step=dict(type="str", required=True, choices=["check", "unpack"]),
            bundle_dir=dict(type="path", required=True),
            allowed_signers=dict(type="path"),
            allow_unsigned=dict(type="bool", default=False),
            cache_dir=dict(type="path"),
            files=dict(type="list", elements="dict", default=[]),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        if params["step"] == "check":
            result = check_bundle(params["bundle_dir"], params["allowed_signers"], params["allow_unsigned"])
            if result["warning"]:
                module.warn(result["warning"])
            module.exit_json(changed=False, **result)
        if not params["cache_dir"]:
            module.fail_json(msg="step=unpack needs cache_dir")
        unpacked, changed = {}, False
        for entry in params["files"]:
            # the entries come from the checked manifest; their paths are checked again as this step may run alone
            relative_path(entry.get("path", ""), "archive path")
            outcome = unpack_verified("%s/%s" % (params["bundle_dir"], entry["path"]), params["cache_dir"], entry)
            changed = changed or outcome["changed"]
            unpacked[entry["sha256"]] = outcome
        module.exit_json(changed=changed, unpacked=unpacked)
    except BundleError as exc:
        module.fail_json(msg="%s. Nothing was changed on any host." % exc)


if __name__ == "__main__":
    main()
