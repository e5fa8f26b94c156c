"""Target devices and op support: device profiles, the rule table, support reports, CPU offload."""

from compiler_core.targets.devices import (
    DEVICES,
    DeviceProfile,
    devices_for_chip,
    get_device,
    list_devices,
    validate_inference_scheme,
)
from compiler_core.targets.offload import OffloadPlan, apply_offload, plan_cpu_offload
from compiler_core.targets.rules import SUPPORT_RULES, OpRule, get_rule, supported_op_types
from compiler_core.targets.support import (
    NodeSupport,
    SupportReport,
    SupportStatus,
    check_support,
    format_report_table,
)

__all__ = [
    "DEVICES",
    "SUPPORT_RULES",
    "DeviceProfile",
    "NodeSupport",
    "OffloadPlan",
    "OpRule",
    "SupportReport",
    "SupportStatus",
    "apply_offload",
    "check_support",
    "devices_for_chip",
    "format_report_table",
    "get_device",
    "get_rule",
    "list_devices",
    "plan_cpu_offload",
    "supported_op_types",
    "validate_inference_scheme",
]
