"""The planner (``coursekit plan``): the fastest parallel layout that fits, with a predicted step time.

    from coursekit.plan import plan, evaluate, Layout
    best = plan("llama3-8b", gpus=8, gpus_per_node=8, gpu="H100-80GB", seq=4096, global_batch=64)[0]
    best.layout, best.prediction.step_time_s, best.estimate.peak_bytes

Pure Python (no torch). Modules: ``hardware`` (GPU / network presets with sources, overrides, bench fits),
``layout`` (one candidate), ``steptime`` (the time model), ``search`` (enumerate, prune, rank, Pareto), ``cli``.
``measure`` (torch) measures this machine's matmul rate and gloo bandwidth into a Hardware.
"""
from coursekit.plan.hardware import HARDWARE, NETWORKS, Hardware, Network, hardware, load_overrides, network
from coursekit.plan.layout import Layout, parse_layout
from coursekit.plan.search import Candidate, NoFit, evaluate, pareto, plan
from coursekit.plan.steptime import Cluster, Prediction, predict

__all__ = ["HARDWARE", "NETWORKS", "Candidate", "Cluster", "Hardware", "Layout", "Network", "NoFit", "Prediction",
           "evaluate", "hardware", "load_overrides", "network", "pareto", "parse_layout", "plan", "predict"]
