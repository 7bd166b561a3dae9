"""What the FSDP strategies refuse before launch, torch-free (``coursekit.parallel.rules``): bad
``--reshard-after-forward`` or ``--prefetch``, ``--compile-model`` with ``--compile``, HSDP with CP, FSDP1's limits.
``strategy.py`` and ``fsdp1.py`` inherit it."""
from __future__ import annotations

from coursekit.fsdp import FSDPOptions
from coursekit.parallel.rules import Rules


def reshard_value(text: str):
    t = str(text).strip().lower()
    if t in ("true", "false"):
        return t == "true"
    try:
        n = int(t)
    except ValueError:
        raise ValueError(f"--reshard-after-forward takes true, false or a number of ranks, got {text!r}") from None
    if n < 1:
        raise ValueError(f"--reshard-after-forward {n}: need a positive number of ranks")
    return n


class FSDP2(Rules):
    name = "fsdp2"

    @classmethod
    def check(cls, opts, dims) -> None:
        super().check(opts, dims)
        r = reshard_value(opts.of(FSDPOptions).reshard_after_forward)
        shard = dims.size("fsdp")
        if not isinstance(r, bool) and (shard % r or r == 1):
            raise ValueError(f"--reshard-after-forward {r} must divide the {shard} sharding ranks and be > 1")
        if opts.of(FSDPOptions).prefetch < 0:
            raise ValueError("--prefetch must be >= 0")
        if opts.of(FSDPOptions).compile_model and opts.train.compile:
            raise ValueError("--compile compiles each block before fully_shard, --compile-model the whole model "
                             "after it: give one")


class HSDP(FSDP2):
    name = "hsdp"

    @classmethod
    def check(cls, opts, dims) -> None:
        super().check(opts, dims)
        if dims.cp > 1:
            raise ValueError("--strategy hsdp with --cp is not supported; use fsdp2 (it shards over dp_shard x cp)")


class FSDP1(Rules):
    name = "fsdp1"
    supports = {"checkpoint": True, "compile": False, "tp": False, "pp": False, "cp": False}
    why_not = {"compile": "FSDP1's FlatParameter hooks and per-block compile do not compose here; use fsdp2",
               "tp": "use fsdp2 (DTensor composes with TP)", "pp": "use fsdp2", "cp": "use fsdp2"}

    @classmethod
    def check(cls, opts, dims) -> None:
        super().check(opts, dims)
        from coursekit.dist import device_kind  # torch: which device this machine offers

        if device_kind() == "cpu":
            raise ValueError("--strategy fsdp1: torch's FullyShardedDataParallel needs a non-CPU accelerator device "
                             "(it refuses CPU-only runs); use --strategy fsdp2 here (the mapping is in "
                             "coursekit/fsdp/fsdp1.py)")
        fo = opts.of(FSDPOptions)
        if not isinstance(reshard_value(fo.reshard_after_forward), bool):
            raise ValueError("--strategy fsdp1 takes --reshard-after-forward true (FULL_SHARD) or false "
                             "(SHARD_GRAD_OP); resharding to N ranks is FSDP2's")
        if fo.compile_model:
            raise ValueError("--strategy fsdp1 does not compile (FlatParameter hooks); --compile-model is fsdp2's")
        if fo.wrap == "pair":
            raise ValueError("--strategy fsdp1 wraps with transformer_auto_wrap_policy (--wrap block) or not at all "
                             "(--wrap root); pairs of blocks are FSDP2's")
