"""Module 4 in ``coursekit demo``: tensor, pipeline, context and expert parallelism on one mesh, each equal to one
process's run step by step (EP also: its all-to-all bytes = the volume model of the router's counts); and the
pipeline bubble of GPipe on 2 stages at m = 1 and 4 against (p−1)/(m+p−1). Ulysses left the tour for EP (the
3-minute budget): tests/test_cp_attention.py and the slow tier keep it."""
from __future__ import annotations

from coursekit.comm import volume
from coursekit.memory import preset
from coursekit.tour import Check

MODULE, TITLE = 4, "Tensor, pipeline and context parallelism"  # found by coursekit.tour.discover()


def checks(tour) -> list[Check]:
    runs = [("TP=2 on 2 processes = 1 process", ("ddp", 2, "--tp", "2"))]
    if not tour.quick:  # --quick: TP alone (the one-minute subset)
        runs += [("GPipe, 2 stages, 2 micro-batches = 1 process", ("ddp", 2, "--pp", "2", "--grad-accum", "2")),
                 ("ring attention, CP=2 = 1 process", ("ddp", 2, "--cp", "2", "--cp-impl", "ring"))]
    out = [tour.equal_losses(4, what, tour.train(*args)) for what, args in runs]
    if not tour.quick:
        out += [ep_check(tour)] + bubble_checks(tour)
    return out


def ep_check(tour) -> Check:
    """tiny-qwen3-moe with its experts split over 2 ranks (DDP, --ep 2) against the same model on one process, and
    each rank's counted all-to-all bytes against coursekit.comm.volume.moe_all_to_all of the recorded counts."""
    moe = ("--model", "tiny-qwen3-moe", "--router-aux-loss-coef", "0")
    base = tour.losses(tour.train("single", 1, *moe)[0])
    recs = tour.train("ddp", 2, *moe, "--ep", "2", "--count-step")
    worst = max(abs(a - b) for r in recs for a, b in zip(tour.losses(r), base))
    shape, last = preset("tiny-qwen3-moe"), [r["steps"][-1]["expert_tokens"] for r in recs]
    want = [volume.payload_bytes(volume.moe_step(last, q, shape.hidden, shape.experts)[0]) for q in range(2)]
    got = [r["final"]["comm"]["all_to_all"]["bytes"] for r in recs]
    return Check(4, "EP=2 (MoE) = 1 process; all-to-all bytes", f"= single; {' / '.join(f'{w:,}' for w in want)} B",
                 f"max |Δloss| {worst:.1e}; {' / '.join(f'{g:,}' for g in got)} B", worst <= 1e-5 and got == want)


# |replay - formula| allowed, the formula fed with the stages' measured work per micro-batch (bubble.theory_uneven):
# both read the same chunks, the replay by simulating the schedule's order and dependencies (seen within 0.01 here);
# the equal-stage (p-1)/(m+p-1) is shown beside it — a heavier last stage (head and loss) moves the real bubble away
# from it, by 0.1-0.25 at m = 4 on this CPU
TOL = 0.02


def bubble_checks(tour) -> list[Check]:
    """One launch of the trainer's pipeline (coursekit.pp.probe) on a model wide enough for chunks of tens of
    milliseconds; the bubble each rank's chunk order imposes with the chunks' measured CPU seconds (bubble.replay),
    median over steps 2-3, against the bubble formula with each stage's measured work (bubble.theory_uneven; the
    equal-stage (p−1)/(m+p−1) beside it); the wall-clock bubble (send/recv, Python and other jobs count as idle)
    is shown as a note."""
    import json
    import statistics
    import tempfile
    from pathlib import Path

    from coursekit.launch import launch
    from coursekit.memory import preset, to_hf_config_dict
    from coursekit.pp.bubble import breakdown, replay, theory, theory_uneven

    cfg = to_hf_config_dict(preset("tiny-llama")) | {"hidden_size": 256, "intermediate_size": 688,
                                                     "num_attention_heads": 4, "num_key_value_heads": 4,
                                                     "num_hidden_layers": 4}
    tour.say("  running GPipe on 2 stages at m = 1 and 4 (a wider model: hidden 256, 4 layers)")
    with tempfile.TemporaryDirectory(prefix="coursekit-tour-pp-") as d:
        path = Path(d) / "llama-wide.json"
        path.write_text(json.dumps(cfg))
        res = launch("coursekit.pp.probe", ["--sweep", "gpipe:1,gpipe:4", "--model", str(path), "--pp", "2",
                                            "--micro-batch", "2", "--seq", "128", "--steps", "3"],
                     nproc=2, timeout=tour.timeout, stream=False).results
    out = []
    for i, run in enumerate(res[0]["runs"]):
        th = theory(2, run["m"], run["v"])
        steps = [([r["runs"][i]["steps"][k]["timeline"] for r in res], [r["runs"][i]["steps"][k]["events"] for r in res])
                 for k in (1, 2)]
        cpu = [statistics.median(replay(tl, ev, clock="cpu")[r] for tl, ev in steps) for r in (0, 1)]
        pred = [statistics.median(theory_uneven(tl, ev, run["m"], "gpipe")[r] for tl, ev in steps) for r in (0, 1)]
        wall = [statistics.median(breakdown(tl, ev)[r]["bubble"] for tl, ev in steps) for r in (0, 1)]
        out.append(Check(4, f"GPipe bubble, p = 2, m = {run['m']}",
                         " / ".join(f"{b:.3f}" for b in pred) + f" (equal stages {th:.3f}; ±{TOL})",
                         "replayed " + " / ".join(f"{b:.3f}" for b in cpu) + " (ranks)",
                         all(abs(b - p) <= TOL for b, p in zip(cpu, pred)),
                         note="wall clock " + " / ".join(f"{b:.3f}" for b in wall)))
    return out
