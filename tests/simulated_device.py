"""A second device on a CPU-only machine, with CUDA's rules about mixing devices, for the device audit.

Why: every tensor the engine, the learner, priming or the weight path makes must live on the device of the
tensors it meets. On a CPU-only machine every tensor is on the CPU, so a tensor made without `device=` is
never caught there; the first CUDA run found one at its first decode step (issue 24). This module gives the
test process a device that is not the CPU: tensors "on" it are CPU tensors wrapped in `OnDevice`, a tensor
subclass that reports the device ``simgpu`` (torch's PrivateUse1 backend, renamed), and every operation on
them runs under `SimulatedDevice`, a dispatch mode that unwraps, runs the real CPU kernel, wraps the result
back, and first applies CUDA's device rules, raising `DeviceMix` with CUDA's own message where CUDA would:

- an operation may not mix tensors of the device with CPU tensors of one element or more (CUDA accepts
  CPU scalars, 0-dim tensors, as operands; so does this);
- indexing: indices may be on the CPU when the indexed tensor is on the device, never the other way round
  (the H200 crash: ``indices should be either on cpu or on the same device as the indexed tensor (cpu)``);
- copies between devices (``.to``, ``copy_``, ``.cpu()``, ``.item()``, ``.tolist()``) are allowed, and
  counted as host transfers (`host_reads`): a decode step that asks the device something every row
  already told the host costs a synchronisation on a GPU;
- a random draw on the device from a CPU ``torch.Generator`` is refused, and ``.numpy()`` of a device tensor.

Results are computed by the CPU kernels on the same numbers, so a run under the simulation gives the same
tokens as a run on the CPU (the audit checks that too). The registration is process-wide and cannot be
undone, so the audit runs in a subprocess of its own (`tests/device_audit.py`).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

NAME = "simgpu"
aten = torch.ops.aten
_registered = False


class DeviceMix(RuntimeError):
    """What CUDA would raise: tensors of two devices met in one operation."""


def register() -> torch.device:
    """Make the device exist in this process (once); returns it."""
    global _registered
    if not _registered:
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        _setup_privateuseone_for_python_backend(NAME)
        _registered = True
    return torch.device(NAME, 0)


class OnDevice(torch.Tensor):
    """A CPU tensor (`elem`) that reports the simulated device."""

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            layout=elem.layout, device=torch.device(NAME, 0), requires_grad=elem.requires_grad)

    def __init__(self, elem: torch.Tensor) -> None:
        self.elem = elem

    def __repr__(self) -> str:
        return f"OnDevice({self.elem!r})"

    def __tensor_flatten__(self):  # a traceable wrapper: Module.to swaps parameters in place (ties survive)
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return OnDevice(inner["elem"])

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"{func} on a {NAME} tensor outside SimulatedDevice()")


_CROSS_DEVICE = {aten._to_copy.default, aten.to.dtype_layout, aten.to.device, aten.to.other, aten.copy_.default,
                 aten._copy_from.default, aten._local_scalar_dense.default, aten.item.default}
_INDEXING = {aten.index.Tensor, aten.index_put_.default, aten._index_put_impl_.default, aten.index_put.default}


def _on_device(value) -> bool:
    return isinstance(value, OnDevice)


def _check(func, args, kwargs) -> None:
    """Raise what CUDA raises for this mix of devices (see the module docstring)."""
    generator = kwargs.get("generator")
    named = kwargs.get("device")
    if generator is not None and named is not None and torch.device(named).type == NAME \
            and generator.device.type != NAME:
        raise DeviceMix(f"{func}: Expected a '{NAME}' device type for generator but found '{generator.device.type}'")
    if func in _CROSS_DEVICE:
        return
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    if not any(_on_device(t) for t in tensors):
        return
    if func in _INDEXING:
        indexed, indices = args[0], [i for i in args[1] if i is not None]
        if not _on_device(indexed) and any(_on_device(i) for i in indices):
            raise DeviceMix(f"{func}: indices should be either on cpu or on the same device as the indexed tensor "
                            f"({indexed.device})")
        tensors = [t for t in tensors if not any(t is i for i in indices)]
    host = [t for t in tensors if not _on_device(t) and t.dim() > 0]
    if host:
        shapes = [(str(t.device), tuple(t.shape)) for t in tensors]
        raise DeviceMix(f"{func}: Expected all tensors to be on the same device, but found at least two devices, "
                        f"{NAME}:0 and {host[0].device}! (operands {shapes})")


class SimulatedDevice(TorchDispatchMode):
    """Runs operations on `OnDevice` tensors by CUDA's device rules (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.host_reads = 0  # device -> host transfers (.cpu(), .item(), .tolist(), bool(), ...)
        self.device_ops = 0  # operations that ran on the device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        _check(func, args, kwargs)
        named = [torch.device(d) for d in [kwargs.get("device"), *[a for a in args if isinstance(a, torch.device)]]
                 if d is not None]
        to_device = any(d.type == NAME for d in named)
        if to_device:  # the CPU kernel makes it; the result is wrapped below
            kwargs = {k: (torch.device("cpu") if k == "device" else v) for k, v in kwargs.items()}
            args = tuple(torch.device("cpu") if isinstance(a, torch.device) else a for a in args)
        involved = to_device or any(_on_device(t) for t in tree_flatten((args, kwargs))[0])
        out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
        if not involved:
            return out
        self.device_ops += 1
        if isinstance(out, (bool, int, float)):  # .item(), bool(), int(), torch.equal, ...: a value read back
            self.host_reads += 1
            return out
        if named and not to_device:  # .cpu(), .to("cpu"): a copy to the host
            self.host_reads += func in _CROSS_DEVICE
            return out
        if func is aten.copy_.default or (func._schema.is_mutable and _on_device(args[0]) and out is args[0].elem):
            return args[0]
        return tree_map(lambda t: OnDevice(t) if type(t) is torch.Tensor else t, out)


def _unwrap(value):
    return value.elem if isinstance(value, OnDevice) else value


class _HostViews(TorchFunctionMode):
    """The few calls that never reach the dispatcher: building tensors from Python data on the device
    (`torch.tensor(..., device=)`), reading a device tensor into Python (`.tolist()`, counted) or numpy
    (refused, as on CUDA), and its data pointer."""

    def __init__(self, mode: SimulatedDevice) -> None:
        super().__init__()
        self.mode = mode

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.tensor, torch.as_tensor, torch.asarray) and kwargs.get("device") is not None \
                and torch.device(kwargs["device"]).type == NAME:
            kwargs["device"] = "cpu"
            return OnDevice(func(*args, **kwargs))
        if args and _on_device(args[0]):
            if func is torch.Tensor.tolist:
                self.mode.host_reads += 1
                return args[0].elem.tolist()
            if func in (torch.Tensor.numpy, torch.Tensor.__array__):
                raise TypeError(f"can't convert {NAME}:0 device type tensor to numpy. Use Tensor.cpu() to copy the "
                                "tensor to host memory first.")
            if func is torch.Tensor.data_ptr:
                return args[0].elem.data_ptr()
        return func(*args, **kwargs)


@contextlib.contextmanager
def simulated() -> Iterator[SimulatedDevice]:
    """Everything inside runs with the simulated device's rules; yields the mode (its counters)."""
    register()
    mode = SimulatedDevice()
    with _HostViews(mode), mode:
        yield mode
