"""Identities derived from the host name and the GPU index: stable across restarts, distinct between hosts."""

import hashlib
import uuid


def _digest(*parts):
    text = "hpcobs-gpusim|" + "|".join(str(p) for p in parts)
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


def gpu_uuid(hostname, index):
    return "GPU-" + str(uuid.UUID(bytes=_digest(hostname, "uuid", index)[:16], version=4))


def gpu_pci_parts(hostname, index):
    """(domain, bus): eight GPUs per PCI domain, ascending bus numbers."""
    domain, slot = divmod(index, 8)
    jitter = _digest(hostname, "pci", domain)[0] % 0x0E
    return domain, 0x10 + slot * 0x1D + jitter


def gpu_pci_bus_id(hostname, index):
    domain, bus = gpu_pci_parts(hostname, index)
    return "%08X:%02X:00.0" % (domain, bus)


def kernel_pci_id(pci_bus_id):
    """"00000000:3B:00.0" -> "0000:3b:00", the form NVRM prints in Xid lines."""
    domain, bus, devfn = pci_bus_id.split(":")
    return "%04x:%s:%s" % (int(domain, 16), bus.lower(), devfn.split(".")[0].lower())


def gpu_serial(hostname, index):
    return "1654%09d" % (int.from_bytes(_digest(hostname, "serial", index)[:8], "big") % 10 ** 9)


