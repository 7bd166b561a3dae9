"""3-D layouts on 8 CPU processes, and the pipeline bubble measured per schedule against theory.

    .venv/bin/python bench/bench_parallel.py            # dp8, dp2 x tp2 x pp2, tp2 x cp2 x dp2; bubbles at m = 1, 2, 4, 8
    .venv/bin/python bench/bench_parallel.py --quick    # bubbles only, 2 stages, m = 1 and 4 (minutes on 2 cores)
    .venv/bin/python bench/bench_parallel.py --only layouts   # the 8-process rows only

Layouts (``coursekit train --count-step``, tiny Llama with 4 layers, seq 64, global batch 16, fp32, 4 steps): step
time (mean of steps 2..3, slowest rank; the counted last step is left out), parameter bytes per rank
(``coursekit.measure``), the peak of saved activations per rank on the counted step against ``coursekit memory`` for
the same layout and that rank's stage (``coursekit.profiling.stepcount.predicted_saved``), and the payload bytes of
the counted step's collectives per rank by kind (``coursekit.profiling.stepcount``: all-reduce, all-gather,
send/recv, ...).
Bubbles (``coursekit.pp.probe``, a wider model: hidden 256, seq 128, micro-batch 2): the first stage's idle share
of the step (1 − compute / span, the median of steps 2..4), the theory (p−1)/(v·m+p−1) (zero-bubble schedules: their
order replayed with equal stages, F = I = W, ``bubble.ideal``), the same formula fed with
each stage's measured work per micro-batch (``bubble.theory_uneven``, GPipe and 1F1B: the last stage also runs the
head and the loss), the replay of the same
chunks' CPU seconds with free communication (``coursekit.pp.bubble.replay``: what uneven chunks alone give), the shares
of the span spent in send/recv waits (p2p) and in the schedule's Python between chunks (other). On a shared 2-core
machine the measured value carries scheduling noise.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

LAYOUTS = {"dp8": ["--strategy", "ddp"],
           "dp2 x tp2 x pp2": ["--strategy", "ddp", "--tp", "2", "--pp", "2", "--grad-accum", "2"],
           "tp2 x cp2 x dp2": ["--strategy", "ddp", "--tp", "2", "--cp", "2", "--cp-impl", "ring"]}


def model_file(d: str, layers: int = 4) -> str:
    from coursekit.memory import preset, to_hf_config_dict

    cfg = to_hf_config_dict(preset("tiny-llama")) | {"num_hidden_layers": layers}
    p = Path(d) / f"llama-{layers}.json"
    p.write_text(json.dumps(cfg))
    return str(p)


def layouts(model: str, timeout: float, nproc: int = 8, seq: int = 64, global_batch: int = 16) -> list[dict]:
    from coursekit.launch import launch
    from coursekit.profiling.stepcount import predicted_saved

    rows = []
    for name, args in LAYOUTS.items():
        argv = [*args, "--model", model, "--steps", "4", "--seq", seq, "--global-batch", global_batch]
        res = launch("coursekit.train", [*argv, "--count-step", "--quiet"], nproc=nproc, timeout=timeout,
                     stream=False)
        recs = sorted(res.results, key=lambda r: r["rank"])
        step = max(sum(s["step_time_s"] for s in r["steps"][1:3]) / 2 for r in recs)
        comm = {}
        for r in recs:
            for op, v in r["final"]["comm"].items():
                comm.setdefault(op, []).append(v["bytes"])
        rows.append({"layout": name, "step_ms": 1000 * step,
                     "param_bytes_per_rank": sorted({r["final"]["params_bytes"] for r in recs}),
                     "peak_saved_bytes_per_rank": [r["final"]["peak_saved_bytes"] for r in recs],
                     "stage_per_rank": [r["final"]["coords"]["pp"] for r in recs],
                     "predicted_saved_bytes_per_stage": predicted_saved(argv, nproc),
                     "comm_bytes_per_rank": [r["final"]["comm_bytes"] for r in recs],
                     "comm_by_op": {op: sorted(set(v)) for op, v in sorted(comm.items())},
                     "loss": recs[0]["steps"][-1]["loss"]})
    return rows


def wide_model_file(d: str) -> str:
    """The bubble's model: chunks of tens of milliseconds (hidden 256, 4 heads, FFN 688, 4 layers), so that the
    send/recv and the schedule's Python between chunks are small beside them."""
    from coursekit.memory import preset, to_hf_config_dict

    cfg = to_hf_config_dict(preset("tiny-llama")) | {"hidden_size": 256, "intermediate_size": 688,
                                                      "num_attention_heads": 4, "num_key_value_heads": 4,
                                                      "num_hidden_layers": 4}
    p = Path(d) / "llama-wide.json"
    p.write_text(json.dumps(cfg))
    return str(p)


def bubbles(model: str, schedules, ms, timeout: float) -> list[dict]:
    """Per schedule and m: the median over steps 2.. of the first stage's bubble (1 − compute / span), its split into
    send/recv wait and other (schedule overhead), the replay with free communication, and the theory."""
    import statistics

    from coursekit.launch import launch
    from coursekit.pp import SPLIT_BACKWARD
    from coursekit.pp.bubble import breakdown, ideal, replay, theory, theory_uneven

    rows = []
    # every schedule and m in one launch of the probe (the 1F1B family needs m >= pp)
    sweep = ",".join(f"{kind}:{m}" for kind in schedules for m in ms
                     if kind == "gpipe" or m >= (4 if kind == "dualpipev" else 2))  # dualpipev: m >= 2·pp
    res = launch("coursekit.pp.probe", ["--sweep", sweep, "--model", model, "--pp", "2", "--micro-batch", "2",
                                        "--steps", "4", "--seq", "128"], nproc=2, timeout=timeout, stream=False)
    for i, run in enumerate(res.results[0]["runs"]):
        steps = [[r["runs"][i]["steps"][k] for r in res.results] for k in range(1, len(run["steps"]))]
        b = [breakdown([x["timeline"] for x in st], [x["events"] for x in st])[0] for st in steps]
        med = lambda key: statistics.median(x[key] / (1 if key == "bubble" else x["span"]) for x in b)  # noqa
        zb = run["schedule"] in SPLIT_BACKWARD  # theory: the order replayed with F = I = W (bubble.ideal)
        rows.append({"schedule": run["schedule"], "m": run["m"], "measured": med("bubble"),
                     "p2p_wait": med("p2p_wait"), "other": med("other"),
                     "theory": ideal(run["schedule"], 2, run["m"])[0] if zb else theory(2, run["m"], run["v"]),
                     "replay": statistics.median(replay([x["timeline"] for x in st], [x["events"] for x in st],
                                                        clock="cpu")[0] for st in steps),
                     "uneven": (statistics.median(theory_uneven([x["timeline"] for x in st], [x["events"] for x in st],
                                                                run["m"], run["schedule"])[0] for st in steps)
                                if run["schedule"] in ("gpipe", "1f1b") else None),
                     "peak_saved_bytes": [r["runs"][i]["steps"][-1]["peak_saved"] for r in res.results],
                     "predicted_saved_bytes": predicted_stage_bytes(model, run["schedule"], run["m"], 2, 128)})
    return rows


def predicted_stage_bytes(model: str, schedule: str, m: int, micro_batch: int, seq: int) -> list[int] | None:
    """``coursekit memory --pp 2 --pp-schedule K`` per stage for the probe's run (torch's runtime: what the
    probe's SavedPeak counts); None for a schedule it does not model."""
    from coursekit.memory import estimate
    from coursekit.memory.pp_order import MODELLED

    if schedule not in MODELLED:
        return None
    e = estimate(model, micro_batch=micro_batch, seq=seq, dtype="fp32", precision="fp32", strategy="ddp", pp=2,
                 grad_accum=m, pp_schedule=schedule, pp_runtime="torch", attention="sdpa", kernels="cpu",
                 position_ids="per-sequence")
    return [s["saved_activations_bytes"] for s in e.pp_stages]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", choices=("layouts", "bubbles"), help="run one of the two tables")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        model = model_file(d)
        out = {"layouts": [] if a.quick or a.only == "bubbles" else layouts(model, a.timeout)}
        scheds = (["gpipe", "1f1b"] if a.quick else
                  ["gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zbv", "interleaved-zb", "dualpipev"])
        out["bubbles"] = [] if a.only == "layouts" else bubbles(wide_model_file(d), scheds,
                                                                [1, 4] if a.quick else [1, 2, 4, 8], a.timeout)
    for r in out["layouts"]:
        acts = r["peak_saved_bytes_per_rank"]
        print(f"{r['layout']:<16} step {r['step_ms']:8.1f} ms   params/rank {r['param_bytes_per_rank']} B")
        pred = r["predicted_saved_bytes_per_stage"]
        gap = max(abs(a_ / pred[st] - 1) for a_, st in zip(acts, r["stage_per_rank"]))
        print(f"{'':<16} saved activations/rank {min(acts):,}-{max(acts):,} B (peak), coursekit memory per stage "
              f"{', '.join(f'{x:,}' for x in pred)} B: {'equal on every rank' if gap == 0 else f'off by {gap:.1%}'}")
        print(f"{'':<16} collectives/rank {min(r['comm_bytes_per_rank']):,}-{max(r['comm_bytes_per_rank']):,} B: "
              + ", ".join(f"{op} {min(v):,}-{max(v):,}" if len(v) > 1 else f"{op} {v[0]:,}"
                          for op, v in r["comm_by_op"].items()))
    if out["bubbles"]:
        print(f"{'schedule':<18} {'m':>2} {'bubble':>7} {'theory':>7} {'uneven':>7} {'replay':>7} {'p2p':>6} "
              f"{'other':>6}"
              "  peak saved per stage (B) vs coursekit memory")
    for r in out["bubbles"]:
        pred = r["predicted_saved_bytes"]
        vs = ("not modelled" if pred is None else "equal" if pred == r["peak_saved_bytes"]
              else f"predicted {pred}")
        uneven = "      -" if r["uneven"] is None else f"{r['uneven']:7.3f}"
        print(f"{r['schedule']:<18} {r['m']:>2} {r['measured']:7.3f} {r['theory']:7.3f} {uneven} {r['replay']:7.3f} "
              f"{r['p2p_wait']:6.3f} {r['other']:6.3f}  {r['peak_saved_bytes']} {vs}")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
