"""Where the network trains: this process's CPU as it is, or through Lightning Fabric for an accelerator.

Fabric on one CPU at 32-bit precision leaves the module, the optimizer and ``backward`` as they are (its
``"32-true"`` precision casts float32 to float32), so there :class:`OnCpu` makes the same calls without it: the
weights are bit for bit those Fabric trains (``tests/test_stacked.py``). Importing Fabric costs about 9 CPU-s a
process (it imports torchmetrics, and with it scipy, matplotlib and transformers' models, and ``torch._dynamo``),
more than a small fit itself; each search worker, shard job and pool worker of ``model=auto`` paid it.
"""

from __future__ import annotations

import importlib.util

import torch


def needs_fabric(accelerator: str) -> bool:
    """Whether ``trainer.accelerator`` trains through Lightning Fabric: one named (``cuda``, ``gpu``, ``mps``), or
    ``auto`` where torch sees a CUDA or MPS device or XLA is installed. ``cpu``, and ``auto`` without any, do not."""
    if accelerator == "cpu":
        return False
    if accelerator != "auto":
        return True
    return bool(
        torch.cuda.is_available()
        or torch.backends.mps.is_available()
        or importlib.util.find_spec("torch_xla") is not None
    )


class OnCpu:
    """The Fabric calls the engine makes (``device``, ``setup``, ``to_device``, ``backward``), on this CPU."""

    device = torch.device("cpu")

    def setup(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer):
        return module, optimizer

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()
