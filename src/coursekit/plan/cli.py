"""``coursekit plan``: the fastest layout that fits, with the reasoning shown.

    coursekit plan --model llama3-8b --gpus 16 --gpus-per-node 8 --gpu H100-80GB --seq 8192 --global-batch 128
    coursekit plan ... --layout dp_shard=16,tp=1,micro_batch=1,recompute=selective     # evaluate one layout
    coursekit plan ... --json --top 0                                                   # every candidate
    coursekit plan ... --plot plan.png                                                  # memory vs step time

Bad input (unknown GPU or model, a node size that does not divide the GPU count, no layout that fits): one line
``error: ...`` and exit 2.
"""
from __future__ import annotations

import argparse
import json
import sys

from coursekit.memory.gpus import GiB
from coursekit.plan.overlap import GRAD_DTYPES
from coursekit.plan.steptime import DTYPES
from coursekit.plan.hardware import hardware, load_overrides, network
from coursekit.plan.layout import parse_layout
from coursekit.plan.search import evaluate, explain, pareto, plan
from coursekit.spec.run import ATTENTION

KERNEL = {"sdpa": "flash", "eager": "eager"}  # the trainer's attention name -> the planner's kernel model


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="coursekit plan", description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--model", required=True, help="preset name or path to an HF config.json")
    p.add_argument("--gpus", type=int, required=True, help="GPUs in the job")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (NVLink domain)")
    p.add_argument("--gpu", default="H100-80GB", help="GPU preset (see coursekit.plan.hardware)")
    p.add_argument("--seq", type=int, required=True, help="tokens per sequence")
    p.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    p.add_argument("--network", default="ib-400", help="inter-node network preset: ib-400, ib-200, roce-200, ...")
    p.add_argument("--dtype", default="bf16", choices=DTYPES,
                   help="compute dtype; fp8: the linear layers on FP8 tensor cores (torchao float8), the rest bf16")
    p.add_argument("--compile", action="store_true", help="torch.compile: fused element-wise kernels")
    p.add_argument("--elementwise", default="eager", choices=("eager", "fused"),
                   help="element-wise kernels: eager (the modeling code's own aten ops, as the course's trainer and "
                        "torchtitan run them; default) or fused (Megatron-LM / Transformer Engine / Apex kernels)")
    p.add_argument("--attention", default="sdpa", choices=ATTENTION,
                   help="attention implementation, the trainer's names: sdpa (on a GPU its flash kernel: no score "
                        "matrix kept; default) or eager (scores kept and moved through HBM)")
    p.add_argument("--top", type=int, default=5, help="how many to show (0: every candidate, with --json)")
    p.add_argument("--json", action="store_true", help="print candidates as a JSON list")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="memory vs predicted step time, Pareto front")
    p.add_argument("--ep", type=int, default=None, help="MoE models: search only layouts with this expert-parallel "
                   "degree (default: every one dividing the experts and the dp x cp ranks)")
    p.add_argument("--layout", default=None, help="evaluate one layout: k=v,... (keys: dp_replicate, dp_shard, tp, "
                   "pp, cp, micro_batch, recompute, zero, engine, pp_schedule, microbatches, virtual_stages, "
                   "cp_impl, sp, overlap, grad_reduce_dtype; or the trainer's names: strategy=zero3, grad_accum, pp_virtual)")
    p.add_argument("--hardware", default=None, metavar="FILE", help="YAML/JSON overrides (gpu, network, "
                   "collectives: coursekit.comm.bench rows)")
    p.add_argument("--overlap", default=None, metavar="NAMES", help="communication overlapped beyond each engine's "
                   "defaults, '+'-joined, no-NAME for off: grad_reduce, param_gather (Megatron --overlap-param-gather), "
                   "prefetch, tp (--tp-comm-overlap / async TP); set on every layout it applies to")
    p.add_argument("--grad-reduce-dtype", default=None, choices=tuple(GRAD_DTYPES),
                   help="gradients on the wire (default fp32; bf16: Megatron --grad-reduce-in-bf16)")
    return p


def _table(cands, best) -> str:
    head = (f"{'#':>2} {'layout':<44} {'fits':>4} {'GiB':>6} {'step s':>8} {'tok/s/GPU':>10} {'MFU':>6}")
    rows = [head, "-" * len(head)]
    for i, c in enumerate(cands, 1):
        p = c.prediction
        rows.append(f"{i:>2} {c.layout.short():<44} {'yes' if c.fits else 'NO':>4} {c.peak_bytes / GiB:>6.1f} "
                    f"{p.step_time_s:>8.3f} {p.tokens_per_s_per_gpu:>10.0f} {p.mfu:>6.1%}")
        rows.append(f"   why: {explain(c, best)}")
        ov = p.overlap
        on = [k for k, v in ov.items() if v is True]
        rows.append(f"   assumed: overlap {', '.join(on) or 'none'}; gradients reduced in {ov['grad_reduce_dtype']}")
        if c.unchecked:  # outside what the published runs behind the model cover
            rows.append(f"   unchecked: {'; '.join(c.unchecked)}")
    return "\n".join(rows)


def plot(cands, path: str) -> str:
    """Peak memory vs predicted step time of every candidate; the Pareto front (fitting) marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    fit = [c for c in cands if c.fits]
    unfit = [c for c in cands if not c.fits]
    for group, style, label in ((fit, dict(color="C0", s=8), "fits"), (unfit, dict(color="0.7", s=6), "does not fit")):
        if group:
            ax.scatter([c.prediction.step_time_s for c in group], [c.peak_bytes / GiB for c in group], label=label,
                       **style)
    front = pareto(cands)
    if front:
        ax.plot([c.prediction.step_time_s for c in front], [c.peak_bytes / GiB for c in front], "-o", color="C3",
                ms=4, label="Pareto front")
    if cands:
        ax.axhline(cands[0].capacity_bytes / GiB, color="k", ls=":", lw=1, label="GPU memory less slack")
    ax.set_xscale("log")
    ax.set_xlabel("predicted step time (s)")
    ax.set_ylabel("peak memory per GPU (GiB)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        hw, net = hardware(args.gpu), network(args.network)
        if args.hardware:
            hw, net = load_overrides(args.hardware, hw, net)
        common = dict(gpus=args.gpus, gpus_per_node=args.gpus_per_node, seq=args.seq, global_batch=args.global_batch,
                      dtype=args.dtype, attention=KERNEL[args.attention], hw=hw, net=net, compile=args.compile,
                      elementwise=args.elementwise)
        if args.top < 0:
            raise ValueError(f"--top must be >= 0, got {args.top}")
        for flag in ("gpus", "gpus_per_node", "seq", "global_batch", "ep"):
            if getattr(args, flag) is not None and getattr(args, flag) < 1:
                raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
        extra = {k: v for k, v in (("overlap", args.overlap), ("grad_reduce_dtype", args.grad_reduce_dtype)) if v}
        if args.layout:
            layout = parse_layout(args.layout)
            for k, v in extra.items():
                if layout.get(k, v) != v:
                    raise ValueError(f"--{k.replace('_', '-')} {v} and --layout {k}={layout[k]} disagree; give one")
                layout[k] = v
            if args.ep is not None:
                if layout.get("ep", args.ep) != args.ep:
                    raise ValueError(f"--ep {args.ep} and --layout ep={layout['ep']} disagree; give one")
                layout["ep"] = args.ep
            cands = [evaluate(args.model, layout, **common)]
        else:
            fixed = {**({"ep": args.ep} if args.ep is not None else {}), **extra}
            cands = plan(args.model, keep_unfit=bool(args.plot) or (args.json and args.top == 0), fixed=fixed,
                         **common)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    shown = cands if args.top == 0 else cands[:args.top]
    if args.plot:
        plot(cands, args.plot)
    if args.json:
        print(json.dumps([c.to_dict() for c in shown], indent=1))
        return 0
    c0 = cands[0]
    print(f"{args.model} on {args.gpus} x {hw.name} ({args.gpus_per_node} per node, {net.name}), seq {args.seq}, "
          f"global batch {args.global_batch}: {len(cands)} candidate(s)"
          + ("" if args.layout else f", best {len(shown)} shown"))
    print(_table(shown, c0))
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
