"""Saved activation bytes of one context-parallel attention call, measured and modelled, per CP rank.

``AttentionBlock`` is the attention of an HF Llama layer without RoPE: q/k/v projections, the CP attention core,
o_proj. ``measured_bytes`` runs it through the course's one measurement path (``coursekit.measure.activations``:
saved-for-backward storages, deduplicated) and splits the bytes by module; ``modelled_bytes`` is what the
calculator (``coursekit.memory.activations``, ``cp=C``) predicts for the same tensors, plus what it does not model.

What each implementation keeps, per rank, with n = b·s/C tokens, a heads, kvh K/V heads, d head dim, P bytes:
    ring     q, k, v of its own rows, the output, fp32 log-sum-exp: n·(a + 2·kvh)·d·P + n·a·d·P + 4·n·a — the
             calculator's flash-attention terms at s/C (``attn.q_rope`` ... ``attn.core_out``); the output is stored
             so that o_proj's input is the same storage.
    ulysses  the local SDPA saves its head-sharded q, k, v, output and log-sum-exp (the same sizes), *and* o_proj
             saves the output again after the all-to-all back: + n·a·d·P. With kvh < C each rank also keeps a whole
             replicated K/V head over the full sequence: k and v hold b·s·d instead of n·kvh·d elements each.
             ``coursekit memory --cp C --cp-impl ulysses`` counts both (``modelled_bytes`` keeps the split).

Whole model: ``launch("coursekit.cp.probe", ["--seq", "32", "--micro-batch", "2"], nproc=2)`` measures, on every CP
rank, the trainer's tiny Llama (MHA, GQA, and one K/V head) with each implementation, embedding to loss, set up as
the trainer sets up ``--cp C --cp-impl IMPL`` (``coursekit.parallel.run.build_run``: its CP parallelism, its data
path with the impl's layout): per-rank saved bytes to compare with ``coursekit memory --cp C --cp-impl IMPL --position-ids per-sequence --kernels cpu --dtype fp32``.
"""
from __future__ import annotations

import sys

import torch

from coursekit.measure.activations import saved_activation_bytes


class _Core(torch.nn.Module):
    """The attention function as a module, so the measurement attributes its saved tensors to it."""

    def __init__(self, attention):
        super().__init__()
        self.attention = attention

    def forward(self, q, k, v):
        return self.attention(q, k, v)


class AttentionBlock(torch.nn.Module):
    """x (b, s/C, hidden) -> q, k, v projections -> ``attention(q, k, v)`` -> o_proj, as HF Llama lays tensors out."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, attention):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.q_proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.k_proj = torch.nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = torch.nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.core = _Core(attention)
        self.o_proj = torch.nn.Linear(hidden, hidden, bias=False)

    def forward(self, input_ids, labels=None, use_cache=False):  # the measurement's calling convention; x = input_ids
        b, s, _ = input_ids.shape
        heads = lambda t, n: t.view(b, s, n, self.head_dim).transpose(1, 2)  # noqa: E731  (b, n, s, d)
        q = heads(self.q_proj(input_ids), self.heads)
        k, v = heads(self.k_proj(input_ids), self.kv_heads), heads(self.v_proj(input_ids), self.kv_heads)
        out = self.core(q, k, v)  # (b, heads, s, d)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


def measured_bytes(block: AttentionBlock, x: torch.Tensor) -> dict[str, int]:
    """Saved bytes of one forward of ``block`` on this rank's ``x``: the attention core, o_proj's input, and their
    sum ``attention`` (the projections' saved input x is the norm's output, counted elsewhere)."""
    r = saved_activation_bytes(block, x, breakdown=True)
    core, o_proj = r["by_module"].get("core", 0), r["by_module"].get("o_proj", 0)
    return {"core": core, "o_proj_input": o_proj, "attention": core + o_proj}


def modelled_bytes(impl: str, *, batch: int, seq: int, hidden: int, heads: int, kv_heads: int, cp: int,
                   dtype: str = "fp32") -> dict[str, int]:
    """The attention terms modelled two ways (HF Llama on CPU, flash SDPA): derived by hand here — ring's flash
    terms at s/C (q, k and v of the rank's n = b·s/C rows, the output, the fp32 log-sum-exp) plus, for Ulysses, the
    terms ring does not have — and as the calculator counts them with ``cp_impl``. Returns {"ring_terms",
    "ulysses_extra", "attention": their sum, "calculator"}."""
    from coursekit.memory.activations import DTYPE_BYTES, activation_bytes
    from coursekit.memory.shapes import ModelShape

    shape = ModelShape(layers=1, hidden=hidden, heads=heads, kv_heads=kv_heads, vocab=256, ffn=hidden)
    attn = lambda terms: sum(v for k, v in terms.items() if k.startswith("attn."))  # noqa: E731
    P, d, n = DTYPE_BYTES[dtype], hidden // heads, batch * seq // cp
    ring = n * (heads + 2 * kv_heads) * d * P + n * heads * d * P + 4 * n * heads  # q k v, out, fp32 LSE
    extra = 0
    if impl == "ulysses" and cp > 1:
        extra += n * heads * d * P  # the output twice: head-sharded (saved by SDPA) and sequence-sharded (o_proj)
        if kv_heads < cp:  # one replicated K/V head over the whole sequence, instead of kv_heads over s/C
            extra += 2 * (batch * seq * d - n * kv_heads * d) * P
    elif impl != "ring":
        raise ValueError(f"unknown implementation {impl!r}")
    calc = attn(activation_bytes(shape, batch, seq, dtype=dtype, kernels="cpu", cp=cp, cp_impl=impl).per_layer)
    return {"ring_terms": ring, "ulysses_extra": extra, "attention": ring + extra, "calculator": calc}


class TrainerLoss(torch.nn.Module):
    """The trainer's forward and loss (``coursekit.parallel.loss.cross_entropy`` on pre-shifted labels) in the
    measurement's calling convention."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, labels=None, position_ids=None, use_cache=False):
        from coursekit.parallel.loss import cross_entropy

        return cross_entropy(self.lm(input_ids=input_ids, position_ids=position_ids, use_cache=use_cache).logits,
                             labels)


def run(argv) -> dict:
    """Per CP rank: saved bytes of the whole tiny Llama with each impl and K/V head count (see the docstring), each
    set up as the trainer sets up ``--cp C --cp-impl IMPL`` (``coursekit.parallel.run.build_run``)."""
    from coursekit import dist as ckdist
    from coursekit.options import parse
    from coursekit.parallel.run import build_run

    t = parse(["--strategy", "ddp", *argv]).train
    b = t.micro_batch or 2
    out = []
    with ckdist.session(seed=t.seed) as info:
        cp, rank = info.world_size, info.rank
        for kv in (4, 2, 1):  # tiny-llama's 4 query heads: MHA, GQA with kv = C (at C = 2), one K/V head
            for impl in ("ring", "ulysses"):
                opts = parse(["--strategy", "ddp", *argv, "--micro-batch", str(b), "--grad-accum", "1",
                              "--global-batch", str(b), "--cp", str(cp), "--cp-impl", impl])
                r = build_run(info, opts, setup=False, model_overrides={"num_key_value_heads": kv})
                batch, = r.micro_batches(0)
                m = saved_activation_bytes(TrainerLoss(r.model.train()), batch.input_ids, labels=batch.labels,
                                           breakdown=True, position_ids=batch.position_ids)
                out.append({"impl": impl, "kv_heads": kv, "cp": cp, "micro_batch": b, "seq": t.seq,
                            "total_bytes": m["total_bytes"], "by_layer": m["by_layer"]})
    return {"rank": rank, "runs": out}


def main(argv=None) -> int:
    from coursekit.launch import report

    report(run(list(sys.argv[1:] if argv is None else argv)))
    return 0


if __name__ == "__main__":
    from coursekit.launch import finish

    finish(main())  # results reported: skip the interpreter's slow teardown
