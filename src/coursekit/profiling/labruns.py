"""The runs Lab 5 measures, each launched once per process and kept (the notebook's demo cells and its test cells
share them), and their traces, records and flight-recorder dumps turned into plain data for the exercises.

    small = ddp_traced(MODEL, bucket_mb=0.1)       # {"dir", "records", "trace": coursekit trace's analysis}
    ahead = fsdp_traced(MODEL, prefetch=2)         # the same for FSDP2 gathering 2 blocks ahead
    rows = trace_intervals(small["dir"])          # per rank and step: window, compute and comm intervals (µs)
    hang = planted_hang("op")                     # {"diagnosis": coursekit launch --diagnose, "dumps": per rank}
    pair = elastic_pair(MODEL, ...)               # {"whole": records, "resumed": records, "killed": {...}}
    on_ranks(pool)                                # the traced runs on a notebook's live ranks (coursekit.pool)

Every launch goes through ``coursekit.launch`` (a timeout, no process left behind) with the backend and device of
the environment. Folders live in one temporary directory removed when the process ends. ``model`` is a preset
name or an HF config dict (written to a config.json for the trainer). Importing this module imports no torch.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import io
import json
import pickle
import shutil
import tempfile
from pathlib import Path

TIMEOUT_S = 240.0
_POOL = None  # on_ranks(pool): the runs that can (traced ones) go on a notebook's live ranks


def on_ranks(pool) -> None:
    """Run the traced trainer runs on ``pool`` (a ``coursekit.pool.Pool`` of 2 live ranks) instead of a launch each;
    ``None``: launch again. The planted hang and the killed run stay launches: they take a process group down."""
    global _POOL
    _POOL = pool


@functools.cache
def _root() -> Path:
    d = Path(tempfile.mkdtemp(prefix="coursekit-lab5-"))
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    return d


def _folder(name: str) -> Path:
    d = _root() / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def _model_arg(model) -> str:
    if isinstance(model, str):
        return model
    f = _root() / "model.json"
    f.write_text(json.dumps(model, sort_keys=True))
    return str(f)


def train(model, args, *, nproc: int = 2, max_restarts: int = 0, timeout: float = TIMEOUT_S,
          pool=None) -> list[dict]:
    """Every rank's record ({"rank", "steps", "final"}) of one ``coursekit.train`` run (on ``pool``'s ranks if
    given)."""
    from coursekit.launch import launch

    if pool is not None:
        if pool.n != nproc:
            pool.resize(nproc)
        return pool.train("--model", _model_arg(model), "--quiet", *args, timeout=timeout)
    res = launch("coursekit.train", ["--model", _model_arg(model), "--quiet", *map(str, args)], nproc=nproc,
                 timeout=timeout, stream=False, max_restarts=max_restarts)
    return sorted(res.results, key=lambda r: r["rank"])


def _cached(fn):
    """``functools.cache`` on the JSON of the arguments (a model config is a dict)."""
    memo: dict = {}

    @functools.wraps(fn)
    def inner(*args, **kwargs):
        key = json.dumps([args, kwargs], sort_keys=True, default=str)
        if key not in memo:
            memo[key] = fn(*args, **kwargs)
        return memo[key]

    inner.cache_clear = memo.clear
    return inner


def _traced(name: str, model, args: list, steps: int, profile_steps: str, seq: int, global_batch: int) -> dict:
    """A 2-rank trainer run with ``args``, profiled for ``profile_steps``: {"dir", "records", "trace"}."""
    from coursekit.profiling.trace import analyse

    d = _folder(name)
    recs = train(model, [*args, "--steps", steps, "--seq", seq, "--global-batch", global_batch, "--profile-dir", d,
                         "--profile-steps", profile_steps], pool=_POOL)
    return {"dir": str(d), "records": recs, "trace": analyse(d)}


@_cached
def ddp_traced(model, bucket_mb: float, *, steps: int = 5, profile_steps: str = "1:5", seq: int = 32,
               global_batch: int = 8) -> dict:
    """A 2-rank DDP run with ``bucket_mb`` MiB gradient buckets, profiled for ``profile_steps``."""
    return _traced(f"ddp-{bucket_mb}", model, ["--strategy", "ddp", "--bucket-mb", bucket_mb], steps, profile_steps,
                   seq, global_batch)


@_cached
def fsdp_traced(model, prefetch: int, *, steps: int = 4, profile_steps: str = "1:3", seq: int = 32,
                global_batch: int = 8) -> dict:
    """A 2-rank FSDP2 run (one unit per block) with ``--prefetch prefetch``, profiled for ``profile_steps``."""
    return _traced(f"fsdp2-prefetch{prefetch}", model, ["--strategy", "fsdp2", "--prefetch", prefetch], steps,
                   profile_steps, seq, global_batch)


@functools.cache
def _intervals(folder: str) -> tuple:
    from coursekit.profiling import trace as T

    rows = []
    for f in sorted(Path(folder).glob("*.json")):
        tr = T.load(f)
        for step, (win, comp, comm) in T._by_step(tr).items():
            rows.append({"rank": tr["rank"], "step": step, "window": [float(win[0]), float(win[1])],
                         "compute": [list(T._span(e)) for e in sorted(comp, key=lambda e: float(e["ts"]))],
                         "comm": [list(T._span(e)) for e in sorted(comm, key=lambda e: float(e["ts"]))]})
    return tuple(sorted(rows, key=lambda r: (r["rank"], r["step"])))


def trace_intervals(folder) -> list[dict]:
    """Per rank and recorded step of the traces in ``folder``: {"rank", "step", "window": [start, end],
    "compute": [[start, end], ...], "comm": [[start, end], ...]} in µs, classified as ``coursekit trace`` does
    (compute: ``aten::*`` on the main thread, nested ones included; comm: ``gloo:*`` on gloo's threads; every event
    that overlaps the step's window, sorted by start)."""
    return json.loads(json.dumps(_intervals(str(folder))))  # a fresh copy for every caller


def read_dumps(folder) -> list[dict]:
    """Each rank's flight-recorder dump in ``folder`` (``fr_trace_<rank>.pkl``, as written by ``--diagnose``):
    [{"rank", "entries": [{"seq", "op", "input_sizes", "output_sizes", "dtypes", "pg", "state"}, ...]}] in the
    order the rank issued them (``seq`` is the collective sequence number of the process group)."""
    out = []
    for f in Path(folder).glob("fr_trace_*.pkl"):
        d = pickle.loads(f.read_bytes())
        entries = [{"seq": int(e["collective_seq_id"]), "op": str(e["profiling_name"]).split(":")[-1],
                    "input_sizes": [list(s) for s in e.get("input_sizes") or []],
                    "output_sizes": [list(s) for s in e.get("output_sizes") or []],
                    "dtypes": list(e.get("input_dtypes") or []), "pg": str(e["process_group"][1]),
                    "state": str(e.get("state"))}
                   for e in sorted(d.get("entries") or [], key=lambda e: e["record_id"])
                   if not e.get("is_p2p") and int(e.get("collective_seq_id") or 0) > 0]
        out.append({"rank": int(f.stem.rsplit("_", 1)[1]), "entries": entries})
    return sorted(out, key=lambda r: r["rank"])


@_cached
def planted_hang(case: str, *, rank: int = 1, at: int = 3, pg_timeout_s: float = 3.0) -> dict:
    """``coursekit launch --nproc 2 --diagnose -m coursekit.profiling.planted --case CASE`` (the dumps kept):
    {"diagnosis": its JSON, "dumps": ``read_dumps``, "dir"}."""
    from coursekit.profiling import hangs

    with contextlib.redirect_stderr(io.StringIO()):  # torch's analyser warns on import that tabulate is missing
        import torch.distributed.flight_recorder.components.builder  # noqa: F401
    d = _folder(f"hang-{case}")
    diag = hangs.run("coursekit.profiling.planted", ["--case", case, "--rank", rank, "--at", at], nproc=2,
                     timeout=TIMEOUT_S, pg_timeout_s=pg_timeout_s, folder=d, stream=False)
    return {"diagnosis": json.loads(json.dumps(diag, default=str)), "dumps": read_dumps(d), "dir": str(d)}


@_cached
def elastic_pair(model, *, steps: int = 6, save_every: int = 2, kill_at_step: int = 3, kill_rank: int = 1,
                 extra: tuple = (), seq: int = 32, global_batch: int = 8) -> dict:
    """The same 2-rank DDP run twice: uninterrupted, and with ``kill_rank`` SIGKILLed at ``kill_at_step``
    (``--max-restarts 1``: torchrun restarts the group, which resumes from the last complete checkpoint).
    {"whole": records, "resumed": records of the restarted attempt, "killed": {"step", "rank", "time"}}."""
    from coursekit.profiling.faults import killed_at

    base = ["--strategy", "ddp", "--steps", steps, "--save-every", save_every, "--seq", seq, "--global-batch",
            global_batch, *extra]
    a, b = _folder("whole"), _folder("killed")
    whole = train(model, [*base, "--ckpt-dir", a])
    resumed = train(model, [*base, "--ckpt-dir", b, "--kill-at-step", kill_at_step, "--kill-rank", kill_rank],
                    max_restarts=1)
    return {"whole": whole, "resumed": resumed, "killed": killed_at(str(b))}
