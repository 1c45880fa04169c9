"""The GPU a kernel runs on: its family name (the key results are filed under) and its limits; the cores a host
process may use beside it."""

import os
import re
from dataclasses import dataclass
from functools import lru_cache

import torch


@dataclass(frozen=True)
class Gpu:
    family: str  # "h100", "a100", ..., or "interpreter"
    name: str  # the device name as the driver reports it
    capability: tuple[int, int]
    multiprocessors: int
    shared_memory_per_block: int  # bytes a program may use (opt-in maximum)
    registers_per_multiprocessor: int

    @property
    def has_tma(self) -> bool:
        """Tensor descriptors (TMA) run on Hopper and newer, and in Triton's interpreter."""
        return self.family == "interpreter" or self.capability >= (9, 0)


# Triton's interpreter runs kernels on the CPU with numpy: no hardware limit applies, but we keep
# Hopper-like limits so that a variant valid here is valid on a real GPU too.
INTERPRETER = Gpu("interpreter", "Triton interpreter (CPU)", (9, 0), 1, 232448, 65536)


# GPUs whose limits we know without seeing them, to export or plan for a GPU that is not here.
KNOWN = {gpu.family: gpu for gpu in (
    INTERPRETER,
    Gpu("h100", "NVIDIA H100 80GB HBM3", (9, 0), 132, 232448, 65536),
    Gpu("h200", "NVIDIA H200", (9, 0), 132, 232448, 65536),
    Gpu("a100", "NVIDIA A100-SXM4-80GB", (8, 0), 108, 166912, 65536),
)}


def by_family(family: str) -> Gpu:
    """The GPU here if it is of `family`, else the known limits of that family."""
    here = current()
    if here.family == family:
        return here
    if family not in KNOWN:
        raise ValueError(f"unknown GPU family '{family}' and no such GPU here: use one of {sorted(KNOWN)}")
    return KNOWN[family]


def tma_aligned(*tensors: torch.Tensor) -> bool:
    """Whether TMA can read and write these tensors: 16-byte aligned addresses and strides (all but the last)."""
    return all(t.data_ptr() % 16 == 0 and all(s * t.element_size() % 16 == 0 for s in t.stride()[:-1])
               for t in tensors)


def usable_cores() -> int:
    """The cores this process may run on: its affinity (taskset, a container's cpuset), not the machine's count,
    so that worker pools sized from it do not oversubscribe the cores a job was given."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (no affinity on this platform)
        return os.cpu_count() or 2


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_interprets() -> bool:
    """Whether Triton was imported for its interpreter. It reads TRITON_INTERPRET once for its own library
    functions (tl.max, tl.sum, ...), when it is imported: set later, the variable reaches only the kernels
    compiled after it, which then fail calling the library ("Cannot call @triton.jit'd outside of the scope of
    a kernel")."""
    from triton.language import standard
    from triton.runtime.jit import JITFunction

    return not isinstance(standard.zeros, JITFunction)


def family_of(device_name: str, multiprocessors: int | None = None) -> str:
    """The family results are filed under: what changes the winners, not only the chip. 'NVIDIA H100 80GB HBM3'
    -> 'h100'; its PCIe and NVL boards -> 'h100-pcie', 'h100-nvl' (fewer SMs, other memory and clocks); a board
    of a known family with another SM count gets it appended ('h100-114sm'); unknown names become a lower-case
    slug."""
    known = re.search(r"\b([ABHLV]\d{2,3}|GH200|GB200|B200|RTX ?\d{4})\b", device_name, re.IGNORECASE)
    if not known:
        return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    family = known.group(1).replace(" ", "").lower()
    board = re.search(r"\b(PCIe|NVL)\b", device_name, re.IGNORECASE)
    if board:
        return f"{family}-{board.group(1).lower()}"
    if multiprocessors is not None and family in KNOWN and multiprocessors != KNOWN[family].multiprocessors:
        return f"{family}-{multiprocessors}sm"
    return family


@lru_cache(maxsize=None)
def _cuda_gpu(index: int) -> Gpu:
    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", 0) or 49152
    return Gpu(family_of(props.name, props.multi_processor_count), props.name, (props.major, props.minor),
               props.multi_processor_count, smem, getattr(props, "regs_per_multiprocessor", 65536))


def current(device: torch.device | None = None) -> Gpu:
    """The GPU that tensors on `device` run on (the interpreter for CPU tensors under TRITON_INTERPRET=1)."""
    if device is not None and device.type == "cpu":
        return INTERPRETER
    if interpreting() or not torch.cuda.is_available():
        return INTERPRETER
    index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
    return _cuda_gpu(index)
