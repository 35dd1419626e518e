"""Filters of the lab_slurm role.

    hpcobs_lab_slurm_accounting_problems  what lab_slurm_conf_extra asks of Slurm's accounting storage that the lab's
                                          settings do not give it, as sentences ([] when all is well)

Slurm's rule (slurmctld's _init_tres, src/slurmctld/controller.c; the same message in 26.05.5): every
AccountingStorageTRES name is one of the built-in TRES (cpu, mem, energy, node, billing, vmem, pages, fs/disk) or
of the form bb/, gres/, license/, fs/ or ic/ plus a name; anything else is fatal ("Unknown tres type"), and a TRES
that is not built in is fatal unless slurmdbd is the accounting storage ("slurmdbd is required to run with TRES
gres/gpu. Either setup slurmdbd or remove this TRES from your configuration."). slurmctld then stops at start, and
every client only says "Unable to contact slurm controller". The lab writes the accounting storage itself
(lab_slurm_accounting), so lab_slurm_conf_extra may not set it.
Pure functions, unit tested in tests/test_lab_slurm_filters.py.
"""

from __future__ import annotations

import re

BUILT_IN = ("cpu", "mem", "energy", "node", "billing", "vmem", "pages", "fs/disk")
NAMED_TYPES = ("bb", "gres", "license", "fs", "ic")
ROLE_KEYS = ("accountingstoragetype", "accountingstoragehost", "accountingstorageport")
LINE = re.compile(r"^([A-Za-z]+)=(.*)$")


def hpcobs_lab_slurm_accounting_problems(conf_extra, accounting):
    """Problems of lab_slurm_conf_extra given lab_slurm_accounting (bool)."""
    problems = []
    if not isinstance(conf_extra, (list, tuple)):
        return ["lab_slurm_conf_extra must be a list of \"Key=value\" lines, got %r" % (conf_extra,)]
    for line in conf_extra:
        match = LINE.match(line) if isinstance(line, str) else None
        if not match:
            continue  # the shape of the lines is checked by the preflight's own assertion
        key, value = match.group(1).lower(), match.group(2).strip()
        if key in ROLE_KEYS:
            problems.append(
                "lab_slurm_conf_extra sets %s: the role writes the accounting storage itself (lab_slurm_accounting: "
                "true for slurmdbd, false for none); remove that line" % match.group(1))
            continue
        if key != "accountingstoragetres":
            continue
        for name in (part.strip() for part in value.split(",")):
            if not name:
                continue
            lower = name.lower()
            if lower in BUILT_IN:
                continue
            kind, slash, tail = lower.partition("/")
            if not slash or kind not in NAMED_TYPES or not tail:
                problems.append(
                    "AccountingStorageTRES has %r, which Slurm does not know (slurmctld stops with \"Unknown tres "
                    "type\"): use one of %s, or bb/, gres/, license/, fs/, ic/ and a name"
                    % (name, ", ".join(BUILT_IN)))
            elif not accounting:
                problems.append(
                    "AccountingStorageTRES has %s, which slurmctld tracks only with slurmdbd as its accounting "
                    "storage (without it slurmctld stops at start: \"slurmdbd is required to run with TRES %s\"): "
                    "set lab_slurm_accounting: true (slurmdbd and MariaDB on the controller) or remove it" % (name, name))
    return problems


class FilterModule:
    def filters(self):
        return {"hpcobs_lab_slurm_accounting_problems": hpcobs_lab_slurm_accounting_problems}
