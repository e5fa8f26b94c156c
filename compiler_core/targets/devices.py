"""Virtual device profiles: one :class:`DeviceProfile` per target device string.

The vendor's NPUs are not available to us, so each device string names a documented *virtual
model* of the device (DESIGN.md section 8): the core counts, schemes, precisions and the presence
of the multi-function unit (MFU) follow the public documentation; the MAC array size, clock, SRAM
and bandwidth are chosen so that the peak INT8 throughput matches the published figures
(ARIES about 80 TOPS, REGULUS about 10 TOPS, ARIES memory bandwidth 66.7 GB/s).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

from compiler_core.errors import ArgumentError

logger = logging.getLogger(__name__)

ARIES = "ARIES"
REGULUS = "REGULUS"

SCHEME_ALL = "all"

_MIB = 1024 * 1024


@dataclass(frozen=True)
class CoreMode:
    """How one inference maps onto the local cores; the single definition every part reads.

    Attributes:
        name: ``single``, ``multi``, ``global4`` or ``global8``.
        cores_per_instance: Cores that work together on one input (the tile schedule splits each
            layer across them, spatially or by output channel, with a barrier after the layer).
        batch: Inputs one group of cores processes together; ``multi`` runs four inputs on the four
            cores of a cluster and broadcasts each weight transfer to all four.
        description: One line for the CLI and the GUI.
    """

    name: str
    cores_per_instance: int
    batch: int
    description: str

    def instances(self, total_cores: int) -> int:
        """Inputs in flight on a device with ``total_cores`` cores when every core is busy."""
        return max(1, total_cores // self.cores_per_instance)


CORE_MODES: Mapping[str, CoreMode] = MappingProxyType({mode.name: mode for mode in (
    CoreMode("single", 1, 1, "each local core runs its own model instance"),
    CoreMode("multi", 1, 4, "the four cores of a cluster run a batch of four, sharing each weight transfer"),
    CoreMode("global4", 4, 1, "four cores of a cluster split every layer of one input"),
    CoreMode("global8", 8, 1, "all eight cores split every layer of one input"),
)})
"""Core modes by name, in canonical order."""

ARIES_CORE_MODES = tuple(CORE_MODES)

@dataclass(frozen=True)
class DeviceProfile:
    """Capabilities of one target device, as the compiler and the cost model see them.

    Attributes:
        name: Device string accepted by ``target_device`` (e.g. ``"aries-rb"``).
        chip: Chip family, ``"ARIES"`` or ``"REGULUS"``.
        clusters: Number of core clusters.
        cores_per_cluster: Local NPU cores in each cluster.
        int8_macs_per_cycle_per_core: INT8 multiply-accumulates one core retires per cycle.
        clock_hz: NPU core clock.
        sram_bytes_per_core: On-chip SRAM available to one core for activations and weights.
        dram_bandwidth_bytes_per_s: Sustained DRAM bandwidth shared by all cores.
        weight_precisions: Weight integer formats (``"int4"``, ``"int8"``, ``"int16"``).
        activation_precisions: Activation integer formats (``"int8"``, ``"int16"``).
        has_mfu: Whether the multi-function unit (LUT nonlinearities, softmax/norm routines) exists.
        inference_schemes: Values accepted for ``inference_scheme`` (``"all"`` included on ARIES).
        float_io: Whether the NPU takes and returns float32 tensors; integer-only devices need the
            host to quantize inputs and dequantize outputs.
        usb_transfer_bytes_per_s: Effective host link bandwidth for USB-attached devices, else None.
        description: One line for ``qbcompiler presets``/the GUI device picker.
        multiplier_bits: Operand width of the MAC array's multipliers and of the vector unit's lanes
            (8: ``int8_macs_per_cycle_per_core`` is the int8 x int8 rate; wider operands take
            :meth:`mac_passes` passes). Mobilint publishes INT8 figures only; this is the virtual
            device's assumption (docs/cost-model.md, "int16").
    """

    name: str
    chip: str
    clusters: int
    cores_per_cluster: int
    int8_macs_per_cycle_per_core: int
    clock_hz: float
    sram_bytes_per_core: int
    dram_bandwidth_bytes_per_s: float
    weight_precisions: tuple[str, ...]
    activation_precisions: tuple[str, ...]
    has_mfu: bool
    inference_schemes: tuple[str, ...]
    float_io: bool = True
    usb_transfer_bytes_per_s: float | None = None
    description: str = ""
    multiplier_bits: int = 8

    @property
    def total_cores(self) -> int:
        """Local cores on the device (clusters x cores per cluster)."""
        return self.clusters * self.cores_per_cluster

    def mac_passes(self, activation_bits: int, weight_bits: int) -> int:
        """Passes of the MAC array per product: each operand is split into ``multiplier_bits`` limbs.

        int8 x int8 (and int4 weights) 1, int16 x int8 2, int16 x int16 4.
        """
        limbs = [max(1, -(-bits // self.multiplier_bits)) for bits in (activation_bits, weight_bits)]
        return limbs[0] * limbs[1]

    @property
    def peak_tops(self) -> float:
        """Peak INT8 throughput in TOPS (2 operations per MAC, all cores busy)."""
        ops_per_s = 2 * self.int8_macs_per_cycle_per_core * self.clock_hz * self.total_cores
        return ops_per_s / 1e12

    @property
    def core_modes(self) -> tuple[str, ...]:
        """Core modes an MXQ can be compiled for (the schemes without ``"all"``)."""
        return tuple(scheme for scheme in self.inference_schemes if scheme != SCHEME_ALL)

    @property
    def precisions(self) -> dict[str, tuple[str, ...]]:
        """Supported integer formats, ``{"weights": (...), "activations": (...)}``."""
        return {"weights": self.weight_precisions, "activations": self.activation_precisions}

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form, including the derived ``peak_tops`` and ``core_modes``."""
        data = asdict(self)
        data.update(peak_tops=round(self.peak_tops, 2), core_modes=list(self.core_modes))
        return {key: list(value) if isinstance(value, tuple) else value for key, value in data.items()}


_ARIES_CORE = {
    # 4096 MACs x 1.22 GHz x 2 ops x 8 cores = 79.95 TOPS, the published "about 80 TOPS".
    "int8_macs_per_cycle_per_core": 4096,
    "clock_hz": 1.22e9,
    "sram_bytes_per_core": 4 * _MIB,
}
_REGULUS_CORE = {
    "chip": REGULUS,
    "clusters": 1,
    "cores_per_cluster": 1,
    "inference_schemes": ("single",),
    # One core at a lower clock for a sub-3 W SoC: 8192 MACs x 0.61 GHz x 2 ops = 9.99 TOPS.
    "int8_macs_per_cycle_per_core": 8192,
    "clock_hz": 0.61e9,
    "sram_bytes_per_core": 4 * _MIB,
    # LPDDR4X-4266 on a 32-bit bus.
    "dram_bandwidth_bytes_per_s": 17.0e9,
}
_PRECISIONS = {"weight_precisions": ("int4", "int8", "int16"), "activation_precisions": ("int8", "int16")}

_PROFILES = (
    DeviceProfile(
        name="aries-rb",
        chip=ARIES,
        clusters=2,
        cores_per_cluster=4,
        dram_bandwidth_bytes_per_s=66.7e9,
        has_mfu=True,
        inference_schemes=(*ARIES_CORE_MODES, SCHEME_ALL),
        **_ARIES_CORE,
        **_PRECISIONS,
        description="ARIES PCIe card: 2 clusters x 4 cores, about 80 TOPS INT8, MFU",
    ),
    DeviceProfile(
        name="regulus-ra",
        has_mfu=False,
        **_REGULUS_CORE,
        **_PRECISIONS,
        description="REGULUS SoC, older boards: 1 core, about 10 TOPS, no MFU (no LUT nonlinear ops)",
    ),
    DeviceProfile(
        name="regulus-rb",
        has_mfu=True,
        **_REGULUS_CORE,
        **_PRECISIONS,
        description="REGULUS SoC: 1 core, about 10 TOPS, MFU",
    ),
    DeviceProfile(
        name="regulus-rb-usb",
        has_mfu=True,
        float_io=False,
        usb_transfer_bytes_per_s=400e6,
        **_REGULUS_CORE,
        **_PRECISIONS,
        description="REGULUS over USB 3.0 (about 400 MB/s): as regulus-rb, integer-only NPU I/O",
    ),
)

DEVICES: Mapping[str, DeviceProfile] = MappingProxyType({profile.name: profile for profile in _PROFILES})
"""The registry of device strings; adding a device is one :class:`DeviceProfile` above."""


def list_devices() -> list[str]:
    """Return every valid ``target_device`` string, in registry order."""
    return list(DEVICES)


def devices_for_chip(chip: str) -> list[str]:
    """Return the device strings of one chip family (``"ARIES"`` or ``"REGULUS"``, any case)."""
    return [name for name, profile in DEVICES.items() if profile.chip == chip.upper()]


def get_device(name: str) -> DeviceProfile:
    """Look up the profile of a device string.

    Args:
        name: A device string such as ``"aries-rb"``; case and surrounding spaces are ignored.

    Returns:
        The matching :class:`DeviceProfile`.

    Raises:
        ArgumentError: ``name`` is not a device string. Chip names (``ARIES``, ``REGULUS``) get a
            message of their own listing the device strings of that chip.
    """
    key = name.strip().lower() if isinstance(name, str) else ""
    if key in DEVICES:
        return DEVICES[key]
    valid = ", ".join(DEVICES)
    if key.upper() in (ARIES, REGULUS):
        chip_devices = ", ".join(devices_for_chip(key))
        raise ArgumentError(
            f"'{name}' is a chip name, not a device string; {key.upper()} devices are: {chip_devices}.",
            hint=f"Pass one of: {valid}.",
            argument="target_device",
            value=name,
        )
    close = difflib.get_close_matches(key, list(DEVICES), n=1)
    suggestion = f" Did you mean '{close[0]}'?" if close else ""
    raise ArgumentError(
        f"Unknown target device {name!r}.{suggestion}",
        hint=f"Valid device strings: {valid}.",
        argument="target_device",
        value=str(name),
    )


def validate_inference_scheme(device: str | DeviceProfile, scheme: str) -> list[str]:
    """Check an ``inference_scheme`` against a device and expand it to the core modes to compile.

    ``"all"`` means every core mode of the device: single, multi, global4 and global8 on ARIES,
    only single on REGULUS (one core).

    Args:
        device: Device string or profile.
        scheme: ``"single"``, ``"multi"``, ``"global4"``, ``"global8"`` or ``"all"``.

    Returns:
        The core modes to compile, in canonical order.

    Raises:
        ArgumentError: The device is unknown or does not offer the scheme; the message names the
            schemes the device allows.
    """
    profile = device if isinstance(device, DeviceProfile) else get_device(device)
    key = scheme.strip().lower() if isinstance(scheme, str) else ""
    if key == SCHEME_ALL:
        return list(profile.core_modes)
    if key in profile.core_modes:
        return [key]
    allowed = ", ".join(dict.fromkeys((*profile.inference_schemes, SCHEME_ALL)))
    raise ArgumentError(
        f"inference_scheme {scheme!r} is not available on {profile.name} "
        f"({profile.chip}, {profile.total_cores} core(s)); allowed: {allowed}.",
        hint="On REGULUS only 'single' exists ('all' means 'single' there)."
        if profile.chip == REGULUS
        else "",
        argument="inference_scheme",
        value=str(scheme),
        device=profile.name,
    )
