#!/usr/bin/python
"""Ansible module of the pki role: the site CA and every host's key and certificate, on the controller."""

DOCUMENTATION = r"""
module: hpcobs_pki
short_description: Site CA and per-host certificates made with the openssl command line
description:
  - Makes the site CA when it is missing (unless I(ca_cert) names the site's own), then, for every host, a key and
    a certificate signed by the CA when they are missing, expire within I(renew_days), name other hosts than
    I(hosts) lists, or were signed by another CA. Reads each existing certificate once (one openssl run).
  - Supports check mode (reports what it would make, writes nothing).
options:
  dir: {description: Directory of the PKI (made with mode 0700)., type: path, required: true}
  hosts: {description: "{host: [subject alternative names]}", type: dict, required: true}
  days: {description: Validity of a host certificate in days., type: int, default: 397}
  renew_days: {description: Renew a host certificate that expires within this many days., type: int, default: 30}
  ca_days: {description: Validity of a new site CA in days., type: int, default: 3650}
  ca_subject: {description: Subject of a new site CA., type: str, default: /CN=hpcobs site CA}
  ca_cert: {description: The site's own CA certificate (then no CA is made)., type: path, default: ""}
  ca_key: {description: The key of the site's own CA (to sign host certificates with it)., type: path, default: ""}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.hpcobs_pki_check import ensure


def main():
    module = AnsibleModule(
        argument_spec={
            "dir": {"type": "path", "required": True},
            "hosts": {"type": "dict", "required": True},
            "days": {"type": "int", "default": 397},
            "renew_days": {"type": "int", "default": 30},
            "ca_days": {"type": "int", "default": 3650},
            "ca_subject": {"type": "str", "default": "/CN=hpcobs site CA"},
            "ca_cert": {"type": "path", "default": ""},
            "ca_key": {"type": "path", "default": ""},
        },
        supports_check_mode=True,
    )
    params = module.params
    if not 1 <= params["renew_days"] < params["days"]:
        module.fail_json(msg="renew_days must be at least 1 and less than days (%d, %d)"
                         % (params["renew_days"], params["days"]))
    if module.get_bin_path("openssl") is None:
        module.fail_json(msg="the openssl command is not on the controller (Debian: apt-get install openssl)")
    try:
        result = ensure(params["dir"], {str(k): [str(n) for n in v] for k, v in params["hosts"].items()},
                        params["days"], params["renew_days"], params["ca_days"], params["ca_subject"],
                        check_mode=module.check_mode, ca_cert=params["ca_cert"] or None,
                        ca_key=params["ca_key"] or None)
    except (ValueError, RuntimeError, OSError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=bool(result["ca_created"] or result["issued"]), **result)


if __name__ == "__main__":
    main()
