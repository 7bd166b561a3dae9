"""The one measurement path: what a live job actually holds, saves and peaks at.

- ``state_bytes``: per-rank bytes of parameters, gradients and optimizer state as held (plain tensors, DTensor local
  shards, DeepSpeed partitions), each storage counted once.
- ``saved_activation_bytes`` (activations.py): saved-for-backward bytes of one forward pass.
- ``PeakMemory``: peak bytes where the backend reports them (CUDA allocator on GPU; torch's tracker on CPU).
"""
from coursekit.measure.states import PeakMemory, optimizer_state_bytes, state_bytes, tensor_bytes  # noqa: F401


def __getattr__(name):  # activations import lazily (they pull in autograd hooks only when used)
    if name == "saved_activation_bytes":
        from coursekit.measure.activations import saved_activation_bytes

        return saved_activation_bytes
    raise AttributeError(name)
