"""Foundation benchmarks (figures printed, not asserted): launch start-up cost and tiny-model steps/s.

    .venv/bin/python bench/bench_foundation.py [--steps 30] [--repeats 3]
"""
import argparse
import os
import statistics
import time

os.environ.setdefault("COURSEKIT_DEVICE", "cpu")

from coursekit.launch import launch  # noqa: E402


def run(strategy, nproc, steps, model, seq, batch):
    t0 = time.monotonic()
    res = launch("coursekit.train", ["--strategy", strategy, "--model", model, "--steps", str(steps), "--seq",
                                     str(seq), "--global-batch", str(batch), "--quiet"], nproc=nproc, stream=False)
    wall = time.monotonic() - t0
    r0 = res.results[0]
    timed = [s["step_time_s"] for s in r0["steps"][2:]]  # skip warm-up steps
    return {"wall_s": wall, "first_step_after_s": r0["final"]["first_step_after_s"],
            "steps_per_s": 1 / statistics.median(timed), "tokens_per_s": batch * seq / statistics.median(timed)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--global-batch", type=int, default=8)
    a = p.parse_args()
    print(f"model {a.model}, seq {a.seq}, global batch {a.global_batch}, {a.steps} steps, {os.cpu_count()} CPUs, "
          f"median of {a.repeats} launches\n")
    print(f"{'strategy':<8} {'procs':>5} {'launch→1st step s':>18} {'wall s':>7} {'steps/s':>8} {'tokens/s':>9}")
    for strategy, nproc in (("single", 1), ("ddp", 2)):
        rows = [run(strategy, nproc, a.steps, a.model, a.seq, a.global_batch) for _ in range(a.repeats)]
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"{strategy:<8} {nproc:>5} {med['first_step_after_s']:>18.2f} {med['wall_s']:>7.2f} "
              f"{med['steps_per_s']:>8.1f} {med['tokens_per_s']:>9.0f}")


if __name__ == "__main__":
    main()
