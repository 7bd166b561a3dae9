"""Parameters a parallelism splits by hand over its own ranks (expert parallelism's experts), and how each
data-parallel strategy reduces their gradients.

Every other parameter is the same on all data-parallel ranks, so DDP averages it and FSDP2 shards it over them. A
split parameter is not: EP rank r holds experts r·E/n ..., different from its neighbours'. Its gradient already
sums, through the all-to-all's backward, the losses of every rank of its group (``group``: EP's ``ep``, n ranks);
the parallelism scales that sum by 1/n in its module, so that averaging it over the ranks holding the same slice
(``replicas``: ``ep_rest``) divides by every loss rank, as DDP does for the rest. DDP leaves these parameters out of
its buckets and averages them in a gradient hook (``reduce_in_hooks``); FSDP2 shards each module holding them over
``replicas`` (``coursekit.fsdp.strategy``), whose reduce-scatter averages them.

Checkpoints (DCP): every rank names its parameters by the same FQN, so slice r of n would collide with its
neighbours' under one key. ``slice_keys`` renames a split parameter's entries (model and optimizer states) to
``<fqn>@slice<r>of<n>`` before a save or load, ``unslice_keys`` back after a load: replicas of one slice share a
key (DCP writes it once; FSDP2's shards of it are that key's chunks), so the data-parallel size may change on
resume; the number of slices may not (``check_slices`` says so before anything is loaded).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Split:
    group: object  # process group whose ranks hold different slices (EP's ``ep``)
    replicas: object  # DeviceMesh of the ranks holding this rank's slice (``ep_rest``)


def mark(module: torch.nn.Module, split: Split) -> None:
    """Declare every parameter of ``module`` split (the module is the unit FSDP2 shards over ``split.replicas``)."""
    module._coursekit_split = split


def mark_partial(module: torch.nn.Module, group) -> None:
    """Declare every parameter of ``module`` (also those a later parallelism puts inside it) *partial* over
    ``group``: each rank's gradient covers only its own tokens (TP's token split of a mixture-of-experts block),
    so ``sum_partial_grads`` sums them over ``group`` before the optimizer step."""
    module._coursekit_partial = group


def sum_partial_grads(model: torch.nn.Module) -> None:
    """All-reduce (sum), over its group, the gradient of every parameter of a ``mark_partial`` module: after the
    data-parallel reduction (DDP's buckets, FSDP2's reduce-scatter: linear, so the order does not matter), before
    the step. Under FSDP2 each rank sums its local shard: the ranks of the group hold the same shard."""
    from torch.distributed.tensor import DTensor

    marked = model.__dict__.get("_coursekit_partial_modules")
    if marked is None:  # found once: the marks are set while the model is built and never change afterwards
        marked = [(m, m._coursekit_partial) for m in model.modules()
                  if getattr(m, "_coursekit_partial", None) is not None]
        model.__dict__["_coursekit_partial_modules"] = marked
    for m, group in marked:
        for p in m.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad, group=group)


def split_modules(model: torch.nn.Module) -> list:
    return [m for m in model.modules() if getattr(m, "_coursekit_split", None) is not None]


def split_params(model: torch.nn.Module) -> dict[str, tuple[torch.nn.Parameter, Split]]:
    """name -> (parameter, its split), for every split parameter of ``model`` (found through their modules, which
    keep the mark when a wrapper such as FSDP2 replaces the parameters)."""
    out = {}
    for prefix, m in model.named_modules():
        s = getattr(m, "_coursekit_split", None)
        if s is not None:
            for n, p in m.named_parameters():
                out[f"{prefix}.{n}" if prefix else n] = (p, s)
    return out


def reduce_in_hooks(model: torch.nn.Module) -> None:
    """Average each split parameter's gradient over its replicas as it is produced (every micro-batch: the sum
    of the averaged pieces is the average of the sum)."""
    for p, s in split_params(model).values():
        if s.replicas.size() == 1:
            continue
        group, n = s.replicas.get_group(), s.replicas.size()

        def hook(grad, group=group, n=n):
            grad = grad.clone()
            dist.all_reduce(grad, group=group)
            return grad.div_(n)

        p.register_hook(hook)


def sq_sum(model: torch.nn.Module) -> torch.Tensor:
    """Σ w² over the split parameters, every slice once (float64)."""
    from torch.distributed.tensor import DTensor

    total = torch.zeros((), dtype=torch.float64)
    by_group: dict = {}
    for p, s in split_params(model).values():
        t = p.detach().full_tensor() if isinstance(p, DTensor) else p.detach()
        by_group.setdefault(s.group, []).append(t.double().pow(2).sum().cpu())
    for group, parts in by_group.items():
        s = torch.stack(parts).sum()
        dev = next(iter(model.parameters())).device
        s = s.to(dev if dev.type != "meta" else "cpu")
        dist.all_reduce(s, group=group)
        total += s.cpu()
    return total


_SLICE = re.compile(r"@slice(\d+)of(\d+)$")
_ANY_SLICE = re.compile(r"@slice\d+of(\d+)(?=\.|$)")  # also inside DCP's flattened keys (``optim.state.<key>.exp_avg``)


def _slice_names(model: torch.nn.Module) -> dict[str, str]:
    """State-dict FQN (wrapper prefixes dropped, as ``get_state_dict`` names it) -> its key with this rank's slice."""
    from torch.distributed.checkpoint.state_dict import _get_fqns  # the FQNs get_state_dict itself uses

    out = {}
    for name, (_, s) in split_params(model).items():
        suffix = f"@slice{dist.get_rank(s.group)}of{dist.get_world_size(s.group)}"
        out.update({fqn: fqn + suffix for fqn in _get_fqns(model, name)})
    return out


def slice_keys(model: torch.nn.Module, model_sd: dict, optim_sd: dict) -> None:
    """Rename, in place, the split parameters' entries of ``get_state_dict``'s two dicts to this rank's slice."""
    names = _slice_names(model)
    for d in (model_sd, optim_sd.get("state", {})):
        for fqn in [k for k in d if k in names]:
            d[names[fqn]] = d.pop(fqn)


def unslice_keys(model_sd: dict, optim_sd: dict) -> None:
    """Undo ``slice_keys`` (in place) after a load."""
    for d in (model_sd, optim_sd.get("state", {})):
        for key in [k for k in d if _SLICE.search(k)]:
            d[_SLICE.sub("", key)] = d.pop(key)


def check_slices(saved_keys, wanted_keys) -> None:
    """Refuse, before loading, a checkpoint whose split parameters were cut into another number of slices."""
    def counts(keys):
        return {int(m.group(1)) for k in keys if (m := _ANY_SLICE.search(k))}

    saved, wanted = counts(saved_keys), counts(wanted_keys)
    if saved != wanted:
        say = lambda c: f"{next(iter(c))} slices" if c else "not split"
        raise ValueError(f"this checkpoint's experts are {say(saved)} (saved with --ep {max(saved, default=1)}); "
                         f"this run's are {say(wanted)}: resume with the same --ep (re-splitting experts on "
                         "resume is not supported)")
