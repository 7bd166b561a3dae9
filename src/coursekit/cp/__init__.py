"""Context parallelism (Module 4): attention over a sequence split across C ranks, exact, forward and backward.

- ``shard``   cut a sequence into per-rank pieces and glue them back (contiguous, or zig-zag for causal balance);
  the trainer's data path shards input ids, labels and position ids with it (``shard_batch``).
- ``ulysses`` DeepSpeed-Ulysses: all-to-all from a sequence split to a head split, local attention, all-to-all
  back (``ulysses_attention``).
- ``ring``    Ring Attention: K/V blocks passed around a ring with point-to-point sends overlapping the compute,
  online-softmax merging, zig-zag load balance, a custom two-ring backward (``ring_attention``).
- ``hf``      ``use_cp_attention(model, impl, group)``: a Hugging Face model's attention layers run either one.
- ``probe``   saved activation bytes of one CP attention block per rank, measured and modelled.

What each communicates is modelled in ``coursekit.comm.volume`` (``ulysses_attention``, ``ring_attention``), pure
Python, and checked against ``CollectiveCounter`` in tests/test_cp_attention.py.
"""
_LAZY = {"ulysses_attention": "coursekit.cp.ulysses", "ring_attention": "coursekit.cp.ring",
         "use_cp_attention": "coursekit.cp.hf"}


def attention(impl: str):
    """The attention function for ``--cp-impl`` ``impl`` ('ulysses' or 'ring'); its inputs use ``layout_for(impl)``."""
    from coursekit.cp.shard import layout_for

    layout_for(impl)  # validates the name
    return __getattr__(f"{impl}_attention")


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'coursekit.cp' has no attribute {name!r}")
