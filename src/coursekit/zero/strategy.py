"""ZeRO stages 0-3 through the real DeepSpeed engine (``deepspeed.initialize``): gloo on CPU, NCCL on GPUs.

    coursekit train --strategy zero2 --steps 5                                     # configs/deepspeed/zero2.json
    coursekit train --strategy zero3 --ds-config configs/deepspeed/zero3_offload_cpu.json
    coursekit train --strategy deepspeed --ds-config my.json --dtype bf16          # any learner-written JSON

The engine replaces the plain loop's pieces one for one: ``engine(batch)`` is the forward, ``engine.backward(loss)``
scales by 1/grad-accum and reduces gradients in buckets (ZeRO-2/3: each rank keeps its partition),
``engine.step()`` steps the (partitioned) optimizer and re-gathers parameters. DeepSpeed counts micro-batches
itself, so ``step()`` runs after every micro-batch; it only updates weights on the last one.

The config: ``--ds-config`` or ``configs/deepspeed/zero<N>.json``; the trainer writes its batch and ``--dtype`` in
(``coursekit.zero.ds_config.finalize``). ``--dtype bf16`` is DeepSpeed's ``bf16.enabled`` (bf16 weights and
gradients, fp32 master partition), not autocast.

Measured step (the last): every rank records what DeepSpeed holds (``coursekit.zero.held``) when the last gradient
arrives (before DeepSpeed's end-of-backward reduction: ZeRO-1 holds every gradient whole then), at the end of
backward (parameters, gradients, buffers) and inside the optimizer step (fp32 master, optimizer states and the fp32
gradient partition, which exists only then), and counts the collectives of the whole step
(``coursekit.comm.counter``: every op then passes through Python, so that one step's time grows by ~40-70 ms on
2 CPU cores; ``coursekit.zero.sweep`` never times it). Equal to DDP step by step in fp32
(tests/test_zero.py); ``coursekit memory`` (``coursekit.memory.deepspeed``) predicts the bytes, per rank
(DeepSpeed's pinned NVMe swap buffers aside).
"""
from __future__ import annotations

import logging
import os
import warnings

import torch

from coursekit.parallel.api import Strategy, adamw
from coursekit.zero import ZeROOptions, rules


class ZeRO(rules.ZeRO, Strategy):
    """The engine's strategy; what it supports and its checks before launch (the config's stage): ``rules.ZeRO``."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.config_path, self.raw_config = self._config(self.opts.of(ZeROOptions).ds_config)
        self.autocast_dtype = None  # DeepSpeed's bf16 block casts the model itself
        self._counter = None
        self._hooks: list = []
        self._snapshots: dict = {}
        self.collectives: dict | None = None
        self._step = 0

    # -- set-up ---------------------------------------------------------------------------------------------
    def setup(self, model: torch.nn.Module) -> None:
        from coursekit.zero import ds_config as zc

        deepspeed = _import_deepspeed(self.info.device)
        a = self.opts.train
        self.ds_config, notes = zc.finalize(self.raw_config, micro_batch=a.micro_batch, grad_accum=a.grad_accum,
                                            world=self.info.world_size, dtype=a.dtype, stage=self.stage)
        if self.info.is_main:
            for n in notes:
                print(f"deepspeed config: {n}", flush=True)
        model = model.to(self.device)
        optimizer = None
        if "optimizer" not in self.ds_config:  # the trainer's AdamW, exactly as DDP uses it
            offloaded = zc.offload_devices(self.ds_config)["optimizer"] != "none"
            # offloaded: DeepSpeed steps it on the CPU, so the CPU flavour of the one factory
            optimizer = (adamw(model.parameters(), lr=a.lr, weight_decay=a.weight_decay, fused=False)
                         if offloaded else self.make_optimizer(model.parameters()))
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=self.ds_config,
            model_parameters=[p for p in model.parameters() if p.requires_grad] if optimizer is None else None)
        self.model = self.engine
        self.stage_run = zc.stage_of(self.ds_config)

    # -- one step ---------------------------------------------------------------------------------------------
    # The engine replaces the plain loop's pieces one for one: engine(batch) is the forward, engine.backward(loss)
    # scales by 1/grad-accum and reduces gradients in buckets, engine.step() steps the (partitioned) optimizer.
    def train_step(self, micro_batches: list, measure: bool = False):
        if measure:  # the measured step: count its collectives, watch the moment the last gradient arrives
            from coursekit.comm.counter import CollectiveCounter

            self._counter = CollectiveCounter().__enter__()
        self._measuring = measure
        return super().train_step(micro_batches, measure=measure)

    def backward(self, loss, micro: int, n_micro: int) -> None:
        hooks = self._watch_last_gradient() if micro == n_micro - 1 and self._measuring else []
        self.engine.backward(loss)  # scales by 1/gradient_accumulation_steps itself
        for h in hooks:
            h.remove()
        if micro < n_micro - 1:
            self.engine.step()  # not a boundary: DeepSpeed only advances its micro-step count

    def _watch_last_gradient(self) -> list:
        """Snapshot what is held when the last gradient of the step arrives, before DeepSpeed's end-of-backward
        reduction: ZeRO-1 (and stage 0) hold every gradient whole at that moment, ZeRO-2/3 only their partition
        plus the bucket being filled."""
        from coursekit.zero.held import held_bytes

        params = [p for p in self.engine.module.parameters() if p.requires_grad]
        left = [len(params)]

        def arrived(p):
            left[0] -= 1
            if left[0] == 0:
                self._snapshots["last_gradient"] = held_bytes(self.engine, **self._nvme_args())

        self._snapshots = {}
        return [p.register_post_accumulate_grad_hook(arrived) for p in params]

    def step(self, measure: bool = False) -> None:
        from coursekit.zero.held import held_bytes

        hook = None
        if measure:
            self._snapshots["after_backward"] = held_bytes(self.engine, **self._nvme_args())
            inner = getattr(self.engine.optimizer, "optimizer", self.engine.optimizer)

            def at_step(opt, args, kwargs):  # inside the step: the fp32 gradient partition exists only now
                snap = held_bytes(self.engine, **self._nvme_args())
                prev = self._snapshots.get("at_step")
                self._snapshots["at_step"] = snap if prev is None else _max_merge(prev, snap)

            hook = inner.register_step_post_hook(at_step)
        try:
            self.engine.step()
        finally:
            if hook is not None:
                hook.remove()
            if self._counter is not None:
                counter, self._counter = self._counter, None
                counter.__exit__(None, None, None)
                self.collectives = counter.step_plan()
        if measure:
            self.last_state_bytes = self.state_bytes()
        self._step += 1

    def _nvme_args(self) -> dict:
        from coursekit.zero.ds_config import offload_devices

        zero = self.ds_config.get("zero_optimization", {})
        if "nvme" not in offload_devices(self.ds_config).values():
            return {}
        path = (zero.get("offload_optimizer") or {}).get("nvme_path") or (zero.get("offload_param") or {}).get(
            "nvme_path")
        return {"nvme_dir": path, "rank": self.info.rank}

    def state_bytes(self) -> dict:
        """The measured step's bytes: parameters, gradients and buffers at the end of backward (``grads_peak_bytes``:
        the larger of that and the moment the last gradient arrived, before DeepSpeed's end-of-backward reduction);
        master, optimizer states and the fp32 gradient partition inside the optimizer step. Every category at all
        three moments is in ``zero_held``. ``params_bytes`` / ``grads_bytes`` / ``optimizer_bytes`` keep the
        trainer's meaning."""
        from coursekit.zero.ds_config import offload_devices
        from coursekit.zero.held import num_params

        ab = self._snapshots.get("after_backward", {})
        st = self._snapshots.get("at_step") or ab
        lg = self._snapshots.get("last_gradient") or ab
        tiers = {}  # the same moments per category, split by where DeepSpeed keeps them
        for snap, cats in ((ab, ("params", "grads", "buffers")), (st, ("master", "optimizer", "fp32_grads"))):
            for tier, per_cat in snap.get("tiers", {}).items():
                for c in cats:
                    if per_cat.get(c):
                        tiers.setdefault(tier, {})[c] = per_cat[c]
        return {
            "params_bytes": ab.get("params", 0), "grads_bytes": ab.get("grads", 0),
            "grads_peak_bytes": max(lg.get("grads", 0), ab.get("grads", 0)),
            "master_bytes": st.get("master", 0), "optimizer_bytes": st.get("optimizer", 0),
            "fp32_grads_bytes": st.get("fp32_grads", 0), "buffers_bytes": ab.get("buffers", 0),
            "scalars_bytes": st.get("scalars", 0), "other_bytes": max(ab.get("other", 0), st.get("other", 0)),
            "nvme_bytes": st.get("nvme", 0), "tiers": tiers,
            "accelerator_bytes": sum(tiers.get("accelerator", {}).values()),
            "cpu_bytes": sum(tiers.get("cpu", {}).values()),
            "num_params": num_params(self.engine), "zero_stage": self.stage_run,
            "offload": offload_devices(self.ds_config), "zero_held": self._snapshots,
            "collectives": self.collectives, "collectives_step": self._step,  # its time includes the counter's cost
            "ds_config": self.ds_config, "ds_config_path": self.config_path,
        }

    def param_sq_sum(self) -> float:
        """Σ w² over the full model; ZeRO-3 gathers its partitioned parameters for it (a collective)."""
        params = list(self.engine.module.parameters())
        if self.stage_run == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(params):
                return float(sum(p.detach().double().pow(2).sum() for p in params))
        return float(sum(p.detach().double().pow(2).sum() for p in params))

    def state_dict(self):
        raise NotImplementedError("DCP checkpoints of a DeepSpeed engine are not supported (see --ckpt-dir)")

    def load_state_dict(self, sd) -> None:
        raise NotImplementedError("DCP checkpoints of a DeepSpeed engine are not supported (see --ckpt-dir)")


def _stage(named: type) -> type:
    """The engine for one stage: its name (and so its registry stage) from ``rules``' class of that stage."""
    return type(named.__name__, (named, ZeRO), {"__module__": __name__, "__qualname__": named.__name__})


Zero0, Zero1, Zero2, Zero3 = (_stage(c) for c in (rules.Zero0, rules.Zero1, rules.Zero2, rules.Zero3))


def _import_deepspeed(device: str):
    """Import DeepSpeed for this device, quietly, without its 60-120 s shared-memory comm op build on CPU."""
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    if device == "cpu" and get_accelerator().device_name() != "cpu":
        raise RuntimeError("DeepSpeed was imported for a GPU but this run is on the CPU (COURSEKIT_DEVICE=cpu): "
                           "set DS_ACCELERATOR=cpu before anything imports deepspeed")
    if get_accelerator().device_name() == "cpu":
        # DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce on first use; gloo needs none of it
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*deprecated", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*reduce_scatter_tensor.*deprecated", category=FutureWarning)
    return deepspeed


def _max_merge(a: dict, b: dict) -> dict:
    """Per-category maximum of two held_bytes snapshots (ZeRO-3 steps its optimizer once per sub-group), also in
    each tier's categories (the nested ``tiers``); anything else is the later snapshot's."""
    out = {**a, **b}
    for k, v in a.items():
        if isinstance(v, int) and isinstance(b.get(k), int):
            out[k] = max(v, b[k])
        elif isinstance(v, dict) and isinstance(b.get(k), dict):
            out[k] = _max_merge(v, b[k])
    return out
