"""The simulated hardware: models, MIG layouts, identities and the value dynamics."""

import json
import math
import random
import re
import time

from .common import ConfigError, log
from .faults import fault_count, fault_rate
from .fields import NOT_IN_MIG
from .identity import gpu_pci_bus_id, gpu_serial, gpu_uuid


# ---------------------------------------------------------------------------
# GPU models
# ---------------------------------------------------------------------------

MODELS = {
    "NVIDIA H100 80GB HBM3": dict(
        fb_total=81559, fb_reserved=581, power_limit=700.0, power_min=200.0,
        idle_power=70.0, sm_idle=345, sm_max=1980, mem_clock=2619,
        video_idle=765, video_max=1755, pcie_gen=5, slowdown=90, shutdown=92,
        gpu_max_op=87, mem_max_op=95, mig=True, row_remap=True,
        vbios="96.00.99.00.01", inforom="G520.0200.00.05"),
    "NVIDIA H200": dict(
        fb_total=143771, fb_reserved=614, power_limit=700.0, power_min=200.0,
        idle_power=75.0, sm_idle=345, sm_max=1980, mem_clock=3201,
        video_idle=765, video_max=1755, pcie_gen=5, slowdown=90, shutdown=92,
        gpu_max_op=87, mem_max_op=95, mig=True, row_remap=True,
        vbios="96.00.A5.00.01", inforom="G525.0200.00.05"),
    "NVIDIA A100-SXM4-80GB": dict(
        fb_total=81920, fb_reserved=0, power_limit=400.0, power_min=100.0,
        idle_power=55.0, sm_idle=210, sm_max=1410, mem_clock=1593,
        video_idle=585, video_max=1290, pcie_gen=4, slowdown=90, shutdown=92,
        gpu_max_op=85, mem_max_op=95, mig=True, row_remap=True,
        vbios="92.00.36.00.02", inforom="G506.0210.00.04"),
    "NVIDIA A100-SXM4-40GB": dict(
        fb_total=40960, fb_reserved=0, power_limit=400.0, power_min=100.0,
        idle_power=52.0, sm_idle=210, sm_max=1410, mem_clock=1215,
        video_idle=585, video_max=1290, pcie_gen=4, slowdown=90, shutdown=92,
        gpu_max_op=85, mem_max_op=95, mig=True, row_remap=True,
        vbios="92.00.19.00.10", inforom="G506.0200.00.04"),
    "NVIDIA L40S": dict(
        fb_total=46068, fb_reserved=451, power_limit=350.0, power_min=100.0,
        idle_power=35.0, sm_idle=210, sm_max=2520, mem_clock=9001,
        video_idle=1215, video_max=1965, pcie_gen=4, slowdown=92, shutdown=95,
        gpu_max_op=89, mem_max_op=95, mig=False, row_remap=True,
        vbios="95.02.4B.00.02", inforom="G133.0242.00.03"),
}


def model_spec(name, power_limit=None, fb_total=None):
    spec = MODELS.get(name)
    if spec is None:
        # An unlisted model: a generic data-centre GPU sized from its name.
        spec = dict(MODELS["NVIDIA H100 80GB HBM3"])
        match = re.search(r"(\d+)\s*GB", name)
        if match:
            spec["fb_total"] = int(match.group(1)) * 1024
            spec["fb_reserved"] = 0
        spec["power_limit"] = 400.0
        spec["idle_power"] = 50.0
    spec = dict(spec)
    if power_limit is not None:
        spec["power_limit"] = float(power_limit)
        spec["idle_power"] = min(spec["idle_power"], spec["power_limit"] / 5.0)
    if fb_total is not None:
        spec["fb_total"] = int(fb_total)
        spec["fb_reserved"] = min(spec["fb_reserved"], spec["fb_total"] // 50)
    spec["name"] = name
    return spec


def cuda_driver_version(driver):
    major = driver.split(".", 1)[0]
    table = {"535": 12020, "545": 12030, "550": 12040, "555": 12050,
             "560": 12060, "565": 12070, "570": 12080, "575": 12090,
             "580": 13000}
    return table.get(major, 12040)


# ---------------------------------------------------------------------------
# MIG layouts
# ---------------------------------------------------------------------------

MIG_SLICES = 7
PROFILE_RE = re.compile(r"([1-7])g\.(\d+)gb")
# GPU instance ids used for each slice size, in allocation order.
GI_IDS = {7: [0], 4: [1], 3: [1, 2], 2: [3, 4, 5], 1: [7, 8, 9, 10, 11, 12, 13]}
COUNT_LAYOUTS = {1: [7], 2: [3, 3], 3: [3, 2, 2], 4: [2, 2, 2, 1],
                 5: [2, 2, 1, 1, 1], 6: [2, 1, 1, 1, 1, 1], 7: [1] * 7}


class MigInstance:
    def __init__(self, gi_id, profile, slices, fb_total):
        self.gi_id = gi_id
        self.profile = profile
        self.slices = slices
        self.fb_total = fb_total


def slice_gb(spec):
    return max(1, int(round(spec["fb_total"] / 1024.0 / 8.0)))


def profile_name(slices, spec):
    if slices == 7:
        gb = int(round(spec["fb_total"] / 1024.0))
    elif slices == 3:
        gb = 4 * slice_gb(spec)
    else:
        gb = slices * slice_gb(spec)
    return "%dg.%dgb" % (slices, gb)


def parse_mig_spec(spec_text):
    """Parse "0:2,1:3g.40gb+2g.20gb" into {0: 2, 1: ["3g.40gb", "2g.20gb"]}."""
    layout = {}
    for part in spec_text.split(","):
        part = part.strip()
        if not part:
            continue
        gpu_text, sep, what = part.partition(":")
        if not sep or not gpu_text.strip().isdigit():
            raise ConfigError("bad MIG spec %r: expected <gpu>:<count> or "
                              "<gpu>:<profile>+<profile>" % part)
        what = what.strip()
        if what.isdigit():
            layout[int(gpu_text)] = int(what)
        else:
            layout[int(gpu_text)] = [p.strip() for p in what.split("+")]
    return layout


def normalize_mig(value):
    """Accept the config forms: spec string, list of spec strings, mapping."""
    if value is None:
        return {}
    if isinstance(value, str):
        return parse_mig_spec(value)
    if isinstance(value, list):
        layout = {}
        for item in value:
            if not isinstance(item, str):
                raise ConfigError("mig list items must be strings like '0:2'")
            layout.update(parse_mig_spec(item))
        return layout
    if isinstance(value, dict):
        layout = {}
        for key, item in value.items():
            if not str(key).isdigit():
                raise ConfigError("mig keys must be GPU indexes, got %r" % key)
            if isinstance(item, int) and not isinstance(item, bool):
                layout[int(key)] = item
            elif isinstance(item, list) and all(isinstance(p, str) for p in item):
                layout[int(key)] = list(item)
            elif isinstance(item, str):
                layout[int(key)] = parse_mig_spec("%s:%s" % (key, item))[int(key)]
            else:
                raise ConfigError("bad mig entry for GPU %s: %r" % (key, item))
        return layout
    raise ConfigError("mig must be a string, a list or a mapping")


def build_mig_instances(what, spec):
    if not spec.get("mig"):
        raise ConfigError("model %r does not support MIG" % spec["name"])
    if isinstance(what, int):
        if what not in COUNT_LAYOUTS:
            raise ConfigError("a GPU holds 1 to 7 MIG instances, not %d" % what)
        sizes = COUNT_LAYOUTS[what]
        profiles = [profile_name(s, spec) for s in sizes]
    else:
        profiles = list(what)
        sizes = []
        for prof in profiles:
            match = PROFILE_RE.fullmatch(prof)
            if not match:
                raise ConfigError("bad MIG profile %r (expected like 3g.40gb)" % prof)
            sizes.append(int(match.group(1)))
    if not profiles:
        raise ConfigError("empty MIG layout")
    if sum(sizes) > MIG_SLICES:
        raise ConfigError("MIG layout %s needs %d slices; a GPU has %d"
                          % ("+".join(profiles), sum(sizes), MIG_SLICES))
    used = set()
    instances = []
    for prof, size in zip(profiles, sizes):
        free = [i for i in GI_IDS.get(size, []) if i not in used]
        if not free:
            free = [i for i in range(1, 15) if i not in used]
        gi_id = free[0]
        used.add(gi_id)
        gb = int(PROFILE_RE.fullmatch(prof).group(2))
        fb_total = min(int(gb * 1024 * 0.98), spec["fb_total"])
        instances.append(MigInstance(gi_id, prof, size, fb_total))
    return instances


# ---------------------------------------------------------------------------
# Simulation
# ---------------------------------------------------------------------------

AMBIENT_C = 28.0
TEMP_TAU_S = 20.0


class Entity:
    """A monitored entity: a whole GPU or one MIG GPU instance."""

    __slots__ = ("gpu", "inst", "key", "values", "fb_target")

    def __init__(self, gpu, inst):
        self.gpu = gpu
        self.inst = inst
        self.key = str(gpu.index) if inst is None else "%d.%d" % (gpu.index, inst.gi_id)
        self.values = {}
        self.fb_target = None


class Gpu:
    def __init__(self, index, hostname, spec, driver, mig_instances):
        self.index = index
        self.spec = spec
        self.driver = driver
        self.uuid = gpu_uuid(hostname, index)
        self.pci_bus_id = gpu_pci_bus_id(hostname, index)
        self.serial = gpu_serial(hostname, index)
        self.mig = mig_instances or []
        if self.mig:
            self.entities = [Entity(self, inst) for inst in self.mig]
        else:
            self.entities = [Entity(self, None)]
        self.values = {}
        # dynamic state
        self.last_tick = None
        self.power = spec["idle_power"]
        self.temp = None
        self.energy_mj = 0.0
        self.acc = {"thermal_violation_ns": 0.0, "power_violation_ns": 0.0,
                    "pcie_replay": 0.0, "nvlink_crc_flit": 0.0, "nvlink_crc_data": 0.0,
                    "nvlink_replay": 0.0, "nvlink_recovery": 0.0, "nvlink_bytes": 0.0,
                    "pcie_tx_bytes": 0.0, "pcie_rx_bytes": 0.0}

    def to_state(self):
        return {"energy_mj": self.energy_mj, "power_w": self.power, "temp_c": self.temp,
                "last_tick": self.last_tick, "acc": dict(self.acc)}

    def from_state(self, data):
        self.energy_mj = float(data.get("energy_mj", 0.0))
        self.power = float(data.get("power_w", self.spec["idle_power"]))
        temp = data.get("temp_c")
        self.temp = float(temp) if temp is not None else None
        last = data.get("last_tick")
        self.last_tick = float(last) if last is not None else None
        for key, value in (data.get("acc") or {}).items():
            if key in self.acc:
                self.acc[key] = float(value)


def initial_energy_mj(spec):
    """Energy since driver load: idle power over the host's uptime."""
    try:
        with open("/proc/uptime", "r", encoding="ascii") as handle:
            uptime = float(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        uptime = 0.0
    return spec["idle_power"] * min(uptime, 10 * 365 * 86400) * 1000.0


class Simulator:
    def __init__(self, settings, rng=None):
        self.settings = settings
        self.hostname = settings["hostname"]
        self.spec = model_spec(settings["model"], settings.get("power_limit_w"),
                               settings.get("fb_total_mib"))
        self.driver = settings["driver_version"]
        self.rng = rng or random.Random(settings.get("seed"))
        self.busy_gpus = set(settings.get("busy_gpus") or [])
        layout = settings.get("mig") or {}
        for gpu_index in layout:
            if gpu_index >= settings["gpus"] or gpu_index < 0:
                raise ConfigError("MIG layout names GPU %d, but there are %d GPUs"
                                  % (gpu_index, settings["gpus"]))
        self.gpus = []
        for index in range(settings["gpus"]):
            instances = build_mig_instances(layout[index], self.spec) if index in layout else []
            self.gpus.append(Gpu(index, self.hostname, self.spec, self.driver, instances))

    # -- persistence -------------------------------------------------------

    def load_state(self, path):
        try:
            with open(path, "r", encoding="utf-8") as handle:
                data = json.load(handle)
        except FileNotFoundError:
            data = {}
        except (OSError, ValueError) as exc:
            log("WARN", "ignoring unreadable state file", path=path, error=exc)
            data = {}
        per_uuid = data.get("gpus", {}) if isinstance(data, dict) else {}
        started = time.time()
        for gpu in self.gpus:
            saved = per_uuid.get(gpu.uuid)
            if isinstance(saved, dict):
                gpu.from_state(saved)
            else:
                gpu.energy_mj = initial_energy_mj(gpu.spec)
            if gpu.last_tick is None or gpu.last_tick > started:
                # time runs from start-up (or from the last saved tick)
                gpu.last_tick = started

    def state_document(self):
        return {"version": 1, "hostname": self.hostname, "saved_at": time.time(),
                "gpus": {gpu.uuid: gpu.to_state() for gpu in self.gpus}}

    def topology_document(self):
        return {"version": 1, "hostname": self.hostname, "model": self.spec["name"],
                "gpus": [{"index": g.index, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id,
                          "mig": [{"gpu_instance_id": i.gi_id, "profile": i.profile}
                                  for i in g.mig]} for g in self.gpus]}

    # -- dynamics ------------------------------------------------------------

    def visible_entities(self, faults):
        out = []
        for gpu in self.gpus:
            if "offbus" in faults.get(str(gpu.index), {}):
                continue
            out.extend(gpu.entities)
        return out

    def tick(self, now, mapping, faults_doc):
        faults = faults_doc.get("faults", {})
        retired = faults_doc.get("retired", {})
        for gpu in self.gpus:
            gpu_faults = faults.get(str(gpu.index), {})
            if "offbus" in gpu_faults:
                gpu.last_tick = now
                continue
            self._tick_gpu(gpu, now, mapping or {}, gpu_faults,
                           retired.get(str(gpu.index), {}))

    def _busy(self, entity, mapping):
        if entity.gpu.index in self.busy_gpus:
            return True
        return bool(mapping.get(entity.key))

    def _tick_gpu(self, gpu, now, mapping, faults, retired):
        rng = self.rng
        spec = gpu.spec
        limit = spec["power_limit"]
        idle = spec["idle_power"]
        last = gpu.last_tick if gpu.last_tick is not None else now
        dt = max(0.0, now - last)
        hang = "hang" in faults

        # load per entity, then for the whole GPU
        loads = {}
        for entity in gpu.entities:
            busy = self._busy(entity, mapping)
            loads[entity.key] = rng.uniform(0.90, 0.99) if busy and not hang else 0.0
        if gpu.mig:
            load = sum(loads[e.key] * e.inst.slices for e in gpu.entities) / MIG_SLICES
        else:
            load = loads[gpu.entities[0].key]
        busy_any = any(self._busy(e, mapping) for e in gpu.entities)

        # power
        if "power" in faults:
            power = limit * rng.uniform(1.06, 1.12)
        elif hang:
            power = idle * rng.uniform(1.5, 1.7)
        else:
            power = idle + (limit * 0.955 - idle) * load + rng.gauss(0.0, limit * 0.006)
            power = max(idle * 0.9, min(power, limit * 0.985))
        prev_power = gpu.power
        gpu.energy_mj += (prev_power + power) / 2.0 * dt * 1000.0
        gpu.power = power

        # temperature follows power with a first-order lag
        target = AMBIENT_C + power * (76.0 - AMBIENT_C) / (limit * 0.95)
        if gpu.temp is None:
            gpu.temp = target
        else:
            gpu.temp += (target - gpu.temp) * (1.0 - math.exp(-dt / TEMP_TAU_S))
        temp = gpu.temp + rng.uniform(-0.4, 0.4)
        mem_temp = temp + 6.0 + rng.uniform(-0.5, 0.5)
        if "thermal" in faults:
            temp = max(temp, spec["slowdown"] - 0.5 + rng.uniform(0.0, 1.5))
            mem_temp = max(mem_temp, spec["mem_max_op"] + rng.uniform(0.5, 2.0))

        # accumulate counters while faults are active (overlap with this tick)
        def active_for(kind):
            fault = faults.get(kind)
            if fault is None:
                return 0.0
            start = max(last, float(fault.get("since", now)))
            return max(0.0, now - start)

        def rate(kind):
            return fault_rate(faults.get(kind, {}), kind)

        acc = gpu.acc
        acc["thermal_violation_ns"] += active_for("thermal") * 1e9
        acc["power_violation_ns"] += active_for("power") * 1e9
        acc["pcie_replay"] += active_for("pcie") * rate("pcie")
        nvl = active_for("nvlink") * rate("nvlink")
        acc["nvlink_crc_flit"] += nvl
        acc["nvlink_crc_data"] += nvl / 5.0
        acc["nvlink_replay"] += nvl / 2.0
        acc["nvlink_recovery"] += nvl / 20.0
        gpu.last_tick = now

        # clocks
        if "thermal" in faults:
            sm_clock = int(spec["sm_max"] * rng.uniform(0.50, 0.60))
        elif "power" in faults:
            sm_clock = int(spec["sm_max"] * rng.uniform(0.70, 0.80))
        elif busy_any or hang:
            sm_clock = spec["sm_max"] - 15 * rng.randint(0, 8)
        else:
            sm_clock = spec["sm_idle"]
        reasons = 0
        if not busy_any and not hang:
            reasons |= 0x1
        if "power" in faults:
            reasons |= 0x4
        if "thermal" in faults:
            reasons |= 0x20 | 0x40

        def count(kind):
            fault = faults.get(kind)
            return fault_count(fault, kind, now) if fault is not None else 0

        dbe, sbe = count("ecc-dbe"), count("ecc-sbe")
        xid = faults.get("xid")
        link_width = 8 if "pcie" in faults else 16
        v = gpu.values
        v.clear()
        v.update({
            "DCGM_FI_DRIVER_VERSION": gpu.driver,
            "DCGM_FI_NVML_VERSION": "12.%s" % gpu.driver,
            "DCGM_FI_CUDA_DRIVER_VERSION": cuda_driver_version(gpu.driver),
            "DCGM_FI_DEV_NAME": spec["name"],
            "DCGM_FI_DEV_BRAND": "NVIDIA",
            "DCGM_FI_DEV_NVML_INDEX": gpu.index,
            "DCGM_FI_DEV_SERIAL": gpu.serial,
            "DCGM_FI_DEV_UUID": gpu.uuid,
            "DCGM_FI_DEV_MINOR_NUMBER": gpu.index,
            "DCGM_FI_DEV_OEM_INFOROM_VER": "1.1",
            "DCGM_FI_DEV_PCI_BUSID": gpu.pci_bus_id,
            "DCGM_FI_DEV_COMPUTE_MODE": 0,
            "DCGM_FI_DEV_PERSISTENCE_MODE": 1,
            "DCGM_FI_DEV_MIG_MODE": 1 if gpu.mig else 0,
            "DCGM_FI_DEV_ECC_INFOROM_VER": "7.0",
            "DCGM_FI_DEV_POWER_INFOROM_VER": None,
            "DCGM_FI_DEV_INFOROM_IMAGE_VER": spec["inforom"],
            "DCGM_FI_DEV_VBIOS_VERSION": spec["vbios"],
            "DCGM_FI_DEV_SM_CLOCK": sm_clock,
            "DCGM_FI_DEV_MEM_CLOCK": spec["mem_clock"],
            "DCGM_FI_DEV_VIDEO_CLOCK": (spec["video_max"] if (busy_any or hang)
                                        else spec["video_idle"]),
            "DCGM_FI_DEV_APP_SM_CLOCK": spec["sm_max"],
            "DCGM_FI_DEV_APP_MEM_CLOCK": spec["mem_clock"],
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": reasons,
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": reasons,
            "DCGM_FI_DEV_MAX_SM_CLOCK": spec["sm_max"],
            "DCGM_FI_DEV_MAX_MEM_CLOCK": spec["mem_clock"],
            "DCGM_FI_DEV_MAX_VIDEO_CLOCK": spec["video_max"],
            "DCGM_FI_DEV_MEMORY_TEMP": int(round(mem_temp)),
            "DCGM_FI_DEV_GPU_TEMP": int(round(temp)),
            "DCGM_FI_DEV_MEM_MAX_OP_TEMP": spec["mem_max_op"],
            "DCGM_FI_DEV_GPU_MAX_OP_TEMP": spec["gpu_max_op"],
            "DCGM_FI_DEV_SLOWDOWN_TEMP": spec["slowdown"],
            "DCGM_FI_DEV_SHUTDOWN_TEMP": spec["shutdown"],
            "DCGM_FI_DEV_POWER_USAGE": power,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": int(gpu.energy_mj),
            "DCGM_FI_DEV_POWER_USAGE_INSTANT": power + rng.gauss(0.0, limit * 0.01),
            "DCGM_FI_DEV_POWER_MGMT_LIMIT": limit,
            "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN": spec["power_min"],
            "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX": limit,
            "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": limit,
            "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": limit,
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": int(acc["pcie_replay"]),
            "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": spec["pcie_gen"],
            "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": 16,
            "DCGM_FI_DEV_PCIE_LINK_GEN": spec["pcie_gen"],
            "DCGM_FI_DEV_PCIE_LINK_WIDTH": link_width,
            "DCGM_FI_DEV_XID_ERRORS": int(xid.get("code", 0)) if xid else 0,
            "DCGM_FI_DEV_POWER_VIOLATION": int(acc["power_violation_ns"]),
            "DCGM_FI_DEV_THERMAL_VIOLATION": int(acc["thermal_violation_ns"]),
            "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": 0,
            "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": 0,
            "DCGM_FI_DEV_LOW_UTIL_VIOLATION": 0,
            "DCGM_FI_DEV_RELIABILITY_VIOLATION": 0,
            "DCGM_FI_DEV_TOTAL_APP_CLOCKS_VIOLATION": int(acc["thermal_violation_ns"]
                                                          + acc["power_violation_ns"]),
            "DCGM_FI_DEV_TOTAL_BASE_CLOCKS_VIOLATION": int(acc["thermal_violation_ns"]),
            "DCGM_FI_DEV_ECC_CURRENT": 1,
            "DCGM_FI_DEV_ECC_PENDING": 1,
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": sbe,
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": dbe,
            "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": int(retired.get("ecc_sbe_agg", 0)) + sbe,
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": int(retired.get("ecc_dbe_agg", 0)) + dbe,
            "DCGM_FI_DEV_RETIRED_SBE": None if spec["row_remap"] else 0,
            "DCGM_FI_DEV_RETIRED_DBE": None if spec["row_remap"] else 0,
            "DCGM_FI_DEV_RETIRED_PENDING": None if spec["row_remap"] else 0,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (int(retired.get("remapped_rows", 0))
                                                        + count("row-remap")),
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": 1 if "row-remap-failure" in faults else 0,
            "DCGM_FI_DEV_ROW_REMAP_PENDING": 1 if "row-remap" in faults else 0,
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": int(acc["nvlink_crc_flit"]),
            "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": int(acc["nvlink_crc_data"]),
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": int(acc["nvlink_replay"]),
            "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": int(acc["nvlink_recovery"]),
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
        })

        # per-entity values
        # traffic counters integrate the entities' rates: cumulative, so they never go down
        for entity in gpu.entities:
            pcie, nvlink = self._entity_values(entity, loads[entity.key], hang, gpu)
            acc["pcie_tx_bytes"] += pcie * dt
            acc["pcie_rx_bytes"] += pcie * 1.7 * dt
            acc["nvlink_bytes"] += nvlink * dt
        v["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] = int(acc["nvlink_bytes"])
        v["DCGM_FI_PROF_PCIE_TX_BYTES_TOTAL"] = int(acc["pcie_tx_bytes"])
        v["DCGM_FI_PROF_PCIE_RX_BYTES_TOTAL"] = int(acc["pcie_rx_bytes"])

    def _entity_values(self, entity, load, hang, gpu):
        rng = self.rng
        spec = gpu.spec
        if entity.inst is None:
            fb_total = spec["fb_total"]
            fb_reserved = spec["fb_reserved"]
        else:
            fb_total = entity.inst.fb_total
            fb_reserved = 0
        usable = fb_total - fb_reserved
        if load > 0.0:
            if entity.fb_target is None:
                entity.fb_target = usable * rng.uniform(0.70, 0.92)
            fb_used = int(min(usable, entity.fb_target + rng.uniform(-64, 64)))
        elif hang:
            if entity.fb_target is None:
                entity.fb_target = usable * rng.uniform(0.85, 0.92)
            fb_used = int(entity.fb_target)
        else:
            entity.fb_target = None
            fb_used = 0
        util = int(round(load * 100.0)) if load > 0.0 else (rng.choice((0, 0, 0, 1)) if hang else 0)
        active = load
        pcie = rng.uniform(1.5e8, 6.0e8) if load > 0.0 else rng.uniform(2.0e4, 8.0e4)
        nvlink = rng.uniform(2.5e9, 4.0e9) if load > 0.0 else 0.0
        v = entity.values
        v.clear()
        v.update({
            "DCGM_FI_DEV_GPU_UTIL": util,
            "DCGM_FI_DEV_MEM_COPY_UTIL": int(rng.uniform(25, 55)) if load > 0.0 else 0,
            "DCGM_FI_DEV_ENC_UTIL": 0,
            "DCGM_FI_DEV_DEC_UTIL": 0,
            "DCGM_FI_DEV_FB_TOTAL": fb_total,
            "DCGM_FI_DEV_FB_FREE": fb_total - fb_reserved - fb_used,
            "DCGM_FI_DEV_FB_USED": fb_used,
            "DCGM_FI_DEV_FB_RESERVED": fb_reserved,
            "DCGM_FI_DEV_FB_USED_PERCENT": 100.0 * fb_used / fb_total if fb_total else 0.0,
            "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": int(pcie / 1024),
            "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": int(pcie * 1.7 / 1024),
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": active,
            "DCGM_FI_PROF_SM_ACTIVE": active * rng.uniform(0.85, 0.95),
            "DCGM_FI_PROF_SM_OCCUPANCY": active * rng.uniform(0.30, 0.45),
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": active * rng.uniform(0.35, 0.55),
            "DCGM_FI_PROF_DRAM_ACTIVE": active * rng.uniform(0.25, 0.60),
            "DCGM_FI_PROF_PIPE_FP64_ACTIVE": active * rng.uniform(0.0, 0.03),
            "DCGM_FI_PROF_PIPE_FP32_ACTIVE": active * rng.uniform(0.10, 0.20),
            "DCGM_FI_PROF_PIPE_FP16_ACTIVE": active * rng.uniform(0.02, 0.08),
            "DCGM_FI_PROF_PCIE_TX_BYTES": int(pcie),
            "DCGM_FI_PROF_PCIE_RX_BYTES": int(pcie * 1.7),
            "DCGM_FI_PROF_NVLINK_TX_BYTES": int(nvlink / 2),
            "DCGM_FI_PROF_NVLINK_RX_BYTES": int(nvlink / 2),
        })
        if entity.inst is not None:
            for name in NOT_IN_MIG:
                v[name] = None
        return pcie, nvlink


def field_value(name, entity):
    if name in entity.values:
        return entity.values[name]
    return entity.gpu.values.get(name)
