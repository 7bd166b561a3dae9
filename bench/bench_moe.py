"""Mixture of experts and expert parallelism: the figures of Module 4's fourth dimension.

    python bench/bench_moe.py                 # presets, one EP run, the aux loss over 300 steps
    python bench/bench_moe.py --steps 20 --json
    python bench/bench_moe.py --plot moe.png   # also the per-expert token shares per step (layer 0)

1. Presets: total and active parameters of the real MoE models (the calculator's, equal to transformers' meta count
   in tests/test_memory_presets.py).
2. One EP run (tiny-qwen3-moe, DDP on 2 ranks, ep 2, --count-step): per rank the all-to-all bytes counted against
   the volume model of the router's counts, and the saved activations against the calculator.
3. The router's load-balancing loss: tiny-qwen3-moe trained on one process with the aux loss off, at the model's
   default weight and at a strong one; the expert imbalance (busiest expert over the mean) of the first and last
   tenth of the steps.
4. The cost of imbalance in step time: one MoE layer's experts (``coursekit.ep.dispatch.ExpertShard``) on 2 EP
   ranks, forward + backward, routed evenly and routed so that every choice lands on rank 0's experts. The busiest
   rank computes max/mean = 2x the rows and the other waits for it in the combine; predicted step =
   (balanced step - its expert compute) + 2 x that compute (the expert compute timed alone on the same rows).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("COURSEKIT_DEVICE", "cpu")


def train(*args) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "coursekit.cli", "train", "--json", "--quiet", *args],
                         capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout[out.stdout.index("{"):])["ranks"]


def ep_run(model: str) -> list[dict]:
    from coursekit.comm import volume
    from coursekit.memory import activation_bytes, preset

    shape, ep = preset(model), 2
    ranks = train("--model", model, "--strategy", "ddp", "--nproc", "2", "--ep", str(ep), "--steps", "2", "--seq",
                  "32", "--global-batch", "8", "--count-step", "--router-aux-loss-coef", "0")
    last = [r["steps"][-1]["expert_tokens"] for r in ranks]
    rows_out = []
    for q, r in enumerate(ranks):
        f = r["final"]
        plan, rows = volume.moe_step(last, q, shape.hidden, shape.experts)
        want = volume.payload_bytes(plan)
        reps = [activation_bytes(shape, f["micro_batch"], f["seq"], dtype="fp32", kernels="cpu", impl="hf",
                                 attention="sdpa", position_ids="per-sequence", ep=ep, expert_rows=x) for x in rows]
        rows_out.append({"rank": q, "rows_received": rows, "all_to_all_bytes": f["comm"]["all_to_all"]["bytes"],
                         "all_to_all_predicted": want, "saved_bytes": f["peak_saved_bytes"],
                         "saved_predicted": sum(x.layer_bytes for x in reps) + sum(reps[0].model.values())})
    return rows_out


def aux_effect(model: str, steps: int) -> list[dict]:
    out = []
    for coef in ("0", "default", "0.1"):
        extra = [] if coef == "default" else ["--router-aux-loss-coef", coef]
        rec = train("--model", model, "--strategy", "single", "--steps", str(steps), "--seq", "64",
                    "--global-batch", "8", "--lr", "3e-3", *extra)[0]
        imb = [s["expert_imbalance"] for s in rec["steps"]]
        k = max(1, steps // 10)
        out.append({"aux_loss_coef": coef, "imbalance_first": sum(imb[:k]) / k, "imbalance_last": sum(imb[-k:]) / k,
                    "loss_first": rec["steps"][0]["loss"], "loss_last": rec["steps"][-1]["loss"],
                    "expert_tokens": [s["expert_tokens"] for s in rec["steps"]]})  # [step][layer][expert]
    return out


def plot(aux: list[dict], path: str) -> None:
    """Per-expert share of layer 0's token choices per step, one panel per aux-loss weight (from the --json records)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(aux), figsize=(4 * len(aux), 3), sharey=True)
    for ax, r in zip(axes, aux):
        counts = [step[0] for step in r["expert_tokens"]]
        for e in range(len(counts[0])):
            ax.plot([c[e] / sum(c) for c in counts], lw=0.8, label=f"expert {e}")
        ax.axhline(1 / len(counts[0]), color="k", ls=":", lw=0.8)
        ax.set(title=f"aux loss coef {r['aux_loss_coef']}", xlabel="step")
    axes[0].set_ylabel("share of layer 0's choices")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


IMBALANCE = r"""
import time, torch, torch.distributed as dist
from torch import nn
from coursekit import dist as ckdist
from coursekit.ep.dispatch import ExpertShard
from coursekit.launch import report
T, H, F, E, K, ITERS = {tokens}, 256, 512, 4, 2, {iters}

class Experts(nn.Module):  # transformers 5's fused experts' parameters: (E, 2F, H) and (E, H, F)
    def __init__(self):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(E, 2 * F, H) / H ** 0.5)
        self.down_proj = nn.Parameter(torch.randn(E, H, F) / F ** 0.5)
        self.act_fn = nn.SiLU()

def timed(fn):
    out = []
    for _ in range(ITERS):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return sorted(out)[len(out) // 2]

with ckdist.session(seed=0) as info:
    torch.manual_seed(0)
    shard = ExpertShard(Experts(), group=dist.group.WORLD, rank=info.rank, size=2)
    x = torch.randn(T, H, requires_grad=True)
    w = torch.full((T, K), 1 / K)
    even = torch.arange(T * K).reshape(T, K) % E  # every expert T*K/E choices: each rank T*K rows
    hot = torch.arange(T * K).reshape(T, K) % 2  # experts 0 and 1 (rank 0's) take every choice of both ranks
    step = lambda idx: shard(x, idx, w).sum().backward()  # noqa: E731
    rows = torch.randn(T * K // 2, H)  # one local expert's rows, balanced: T*K per rank over 2 experts
    def experts_only():  # the expert compute of the balanced step, alone: 2 local experts x T*K/2 rows, fwd + bwd
        for e in range(2):
            shard.expert(e, rows, shard.gate_up_proj, shard.down_proj).sum().backward()
    for fn in (lambda: step(even), lambda: step(hot), experts_only):
        fn()  # warm-up
    report({{"rank": info.rank, "balanced_s": timed(lambda: step(even)), "skewed_s": timed(lambda: step(hot)),
             "experts_s": timed(experts_only)}})
"""


def imbalance_cost(tokens: int = 2048, iters: int = 7) -> list[dict]:
    from coursekit.launch import launch_code

    res = launch_code(IMBALANCE.format(tokens=tokens, iters=iters), nproc=2, timeout=300, stream=False).results
    out = []
    for r in res:
        predicted = r["balanced_s"] - r["experts_s"] + 2 * r["experts_s"]  # the busiest rank: twice the rows
        out.append(r | {"predicted_skewed_s": predicted, "error": r["skewed_s"] / predicted - 1})
    return out


def main(argv=None) -> int:
    from coursekit.memory import preset

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--model", default="tiny-qwen3-moe")
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", metavar="PNG", help="per-expert token shares per step of the aux-loss runs")
    a = p.parse_args(argv)
    presets = {n: {"total": preset(n).num_params(), "active": preset(n).num_active_params()}
               for n in ("qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b", "mixtral-8x22b", a.model)}
    res = {"presets": presets, "ep_run": ep_run(a.model), "aux_loss": aux_effect(a.model, a.steps),
           "imbalance_cost": imbalance_cost()}
    if a.plot:
        plot(res["aux_loss"], a.plot)
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    for n, v in presets.items():
        print(f"{n:<18} {v['total']:>16,} total  {v['active']:>15,} active")
    for r in res["ep_run"]:
        print(f"ep rank {r['rank']}: rows received per layer {r['rows_received']}; all-to-all {r['all_to_all_bytes']:,} B"
              f" (volume model {r['all_to_all_predicted']:,}); saved {r['saved_bytes']:,} B (calculator "
              f"{r['saved_predicted']:,})")
    for r in res["aux_loss"]:
        print(f"aux loss coef {r['aux_loss_coef']:>7}: imbalance {r['imbalance_first']:.3f} -> {r['imbalance_last']:.3f}"
              f" over {a.steps} steps; loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}")
    for r in res["imbalance_cost"]:
        print(f"imbalance, ep rank {r['rank']}: balanced step {r['balanced_s'] * 1e3:.1f} ms (experts alone "
              f"{r['experts_s'] * 1e3:.1f}); all choices on rank 0's experts {r['skewed_s'] * 1e3:.1f} ms, predicted "
              f"{r['predicted_skewed_s'] * 1e3:.1f} ({r['error']:+.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
