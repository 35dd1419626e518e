"""The DCGM fields the simulator produces, their ids and the XID texts."""

import functools
import os


# ---------------------------------------------------------------------------
# DCGM fields the simulator can produce.  Types as in dcgm_fields.h:
# "i" = int64, "d" = double, "s" = string.
# ---------------------------------------------------------------------------

FIELD_TYPES = {
    # static information, usually used as "label" rows
    "DCGM_FI_DRIVER_VERSION": "s",
    "DCGM_FI_NVML_VERSION": "s",
    "DCGM_FI_CUDA_DRIVER_VERSION": "i",
    "DCGM_FI_DEV_NAME": "s",
    "DCGM_FI_DEV_BRAND": "s",
    "DCGM_FI_DEV_NVML_INDEX": "i",
    "DCGM_FI_DEV_SERIAL": "s",
    "DCGM_FI_DEV_UUID": "s",
    "DCGM_FI_DEV_MINOR_NUMBER": "i",
    "DCGM_FI_DEV_OEM_INFOROM_VER": "s",
    "DCGM_FI_DEV_PCI_BUSID": "s",
    "DCGM_FI_DEV_COMPUTE_MODE": "i",
    "DCGM_FI_DEV_PERSISTENCE_MODE": "i",
    "DCGM_FI_DEV_MIG_MODE": "i",
    "DCGM_FI_DEV_ECC_INFOROM_VER": "s",
    "DCGM_FI_DEV_POWER_INFOROM_VER": "s",
    "DCGM_FI_DEV_INFOROM_IMAGE_VER": "s",
    "DCGM_FI_DEV_VBIOS_VERSION": "s",
    # clocks
    "DCGM_FI_DEV_SM_CLOCK": "i",
    "DCGM_FI_DEV_MEM_CLOCK": "i",
    "DCGM_FI_DEV_VIDEO_CLOCK": "i",
    "DCGM_FI_DEV_APP_SM_CLOCK": "i",
    "DCGM_FI_DEV_APP_MEM_CLOCK": "i",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "i",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "i",
    "DCGM_FI_DEV_MAX_SM_CLOCK": "i",
    "DCGM_FI_DEV_MAX_MEM_CLOCK": "i",
    "DCGM_FI_DEV_MAX_VIDEO_CLOCK": "i",
    # temperature
    "DCGM_FI_DEV_MEMORY_TEMP": "i",
    "DCGM_FI_DEV_GPU_TEMP": "i",
    "DCGM_FI_DEV_MEM_MAX_OP_TEMP": "i",
    "DCGM_FI_DEV_GPU_MAX_OP_TEMP": "i",
    "DCGM_FI_DEV_SLOWDOWN_TEMP": "i",
    "DCGM_FI_DEV_SHUTDOWN_TEMP": "i",
    # power
    "DCGM_FI_DEV_POWER_USAGE": "d",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "i",
    "DCGM_FI_DEV_POWER_USAGE_INSTANT": "d",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "d",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN": "d",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX": "d",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": "d",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": "d",
    # PCIe
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": "i",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": "i",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "i",
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": "i",
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": "i",
    "DCGM_FI_DEV_PCIE_LINK_GEN": "i",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": "i",
    # utilization
    "DCGM_FI_DEV_GPU_UTIL": "i",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "i",
    "DCGM_FI_DEV_ENC_UTIL": "i",
    "DCGM_FI_DEV_DEC_UTIL": "i",
    # errors and violations
    "DCGM_FI_DEV_XID_ERRORS": "i",
    "DCGM_FI_DEV_POWER_VIOLATION": "i",
    "DCGM_FI_DEV_THERMAL_VIOLATION": "i",
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": "i",
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": "i",
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION": "i",
    "DCGM_FI_DEV_RELIABILITY_VIOLATION": "i",
    "DCGM_FI_DEV_TOTAL_APP_CLOCKS_VIOLATION": "i",
    "DCGM_FI_DEV_TOTAL_BASE_CLOCKS_VIOLATION": "i",
    # frame buffer
    "DCGM_FI_DEV_FB_TOTAL": "i",
    "DCGM_FI_DEV_FB_FREE": "i",
    "DCGM_FI_DEV_FB_USED": "i",
    "DCGM_FI_DEV_FB_RESERVED": "i",
    "DCGM_FI_DEV_FB_USED_PERCENT": "d",
    # ECC
    "DCGM_FI_DEV_ECC_CURRENT": "i",
    "DCGM_FI_DEV_ECC_PENDING": "i",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "i",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "i",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "i",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "i",
    # page retirement (not reported by GPUs that remap rows instead)
    "DCGM_FI_DEV_RETIRED_SBE": "i",
    "DCGM_FI_DEV_RETIRED_DBE": "i",
    "DCGM_FI_DEV_RETIRED_PENDING": "i",
    # row remapping
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "i",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "i",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "i",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "i",
    # NVLink
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "i",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "i",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "i",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "i",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "i",
    # vGPU
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "i",
    # profiling (DCP)
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "d",
    "DCGM_FI_PROF_SM_ACTIVE": "d",
    "DCGM_FI_PROF_SM_OCCUPANCY": "d",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "d",
    "DCGM_FI_PROF_DRAM_ACTIVE": "d",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": "d",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": "d",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": "d",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "i",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "i",
    "DCGM_FI_PROF_NVLINK_TX_BYTES": "i",
    "DCGM_FI_PROF_NVLINK_RX_BYTES": "i",
    "DCGM_FI_PROF_PCIE_TX_BYTES_TOTAL": "i",
    "DCGM_FI_PROF_PCIE_RX_BYTES_TOTAL": "i",
}

# Fields computed by dcgm-exporter itself rather than read from DCGM: the names its counters CSV parser accepts
# (IdentifyMetricType, internal/pkg/counters/exporter_counters.go, release 4.5.3-4.8.2). The simulator does not
# produce them; a CSV row naming one is skipped with a warning.
EXPORTER_FIELDS = {
    "DCGM_EXP_XID_ERRORS_COUNT", "DCGM_EXP_CLOCK_EVENTS_COUNT",
    "DCGM_EXP_GPU_HEALTH_STATUS", "DCGM_EXP_P2P_STATUS",
}

PROM_TYPES = ("gauge", "counter", "histogram", "summary", "label")

# Fields the driver does not report for a MIG instance.
NOT_IN_MIG = {
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
}

XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
UNKNOWN_XID = "Unknown Error"
DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def _data_lines(name):
    with open(os.path.join(DATA_DIR, name), "r", encoding="utf-8") as handle:
        for line in handle:
            line = line.rstrip("\n")
            if line and not line.startswith("#"):
                yield line


@functools.lru_cache(maxsize=None)
def dcgm_field_ids():
    """{field name: DCGM field id} for every name dcgm-exporter accepts (data/dcgm-fields.txt)."""
    ids = {}
    for line in _data_lines("dcgm-fields.txt"):
        number, name = line.split(" ", 1)
        ids[name] = int(number)
    return ids


def dcgm_field_id(name):
    """The DCGM field id of `name`, or None when DCGM has no such field."""
    return dcgm_field_ids().get(name)


# dcgm-exporter renders its families in the order of its Counter keys (field id first): text/template visits a map
# in sorted key order. Every simulated field has an id.
FIELD_IDS = {name: dcgm_field_ids()[name] for name in FIELD_TYPES}


@functools.lru_cache(maxsize=None)
def xid_texts():
    """err_msg per XID code (data/xid-texts.txt: dcgm-exporter's table, from NVIDIA's XID catalogue)."""
    texts = {}
    for line in _data_lines("xid-texts.txt"):
        code, text = line.split("\t", 1)
        texts[int(code)] = text
    return texts


def xid_name(code):
    """dcgm-exporter's err_msg for an XID code; codes beyond its table are "Unknown Error"."""
    return xid_texts().get(code, UNKNOWN_XID)
