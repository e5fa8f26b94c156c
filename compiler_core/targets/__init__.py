"""Target devices and op support: device profiles, support reports (from the op registry), CPU offload."""

from compiler_core.targets.devices import (
    CORE_MODES,
    DEVICES,
    CoreMode,
    DeviceProfile,
    devices_for_chip,
    get_device,
    list_devices,
    validate_inference_scheme,
)
from compiler_core.targets.offload import (
    OffloadPlan,
    apply_offload,
    body_computes,
    chosen_cpu_layers,
    plan_cpu_offload,
)
from compiler_core.targets.support import (
    NodeSupport,
    SupportReport,
    SupportStatus,
    check_support,
    format_report_table,
)

__all__ = [
    "CORE_MODES",
    "DEVICES",
    "CoreMode",
    "DeviceProfile",
    "NodeSupport",
    "OffloadPlan",
    "SupportReport",
    "SupportStatus",
    "apply_offload",
    "body_computes",
    "check_support",
    "devices_for_chip",
    "format_report_table",
    "get_device",
    "list_devices",
    "chosen_cpu_layers",
    "plan_cpu_offload",
    "validate_inference_scheme",
]
