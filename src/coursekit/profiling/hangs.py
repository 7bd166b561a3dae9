"""Why did the job hang? ``coursekit launch --diagnose``: flight-recorder dumps of every rank, torch's analyser, a verdict.

    coursekit launch --nproc 2 --diagnose train.py --my-args        # or: -m package.module
    coursekit launch --nproc 2 --diagnose --json -m coursekit.profiling.planted --case op

What ``--diagnose`` changes
  * every worker runs under ``coursekit.profiling.frwrap``: its process groups get a short timeout
    (``--pg-timeout``, default 10 s), the flight recorder records every collective (``TORCH_FR_BUFFER_SIZE``), and
    the rank dumps it on an error, at its end, on SIGTERM, and on SIGUSR1 (sent to every worker when the whole job
    runs past ``--timeout``, just before it is stopped);
  * ``TORCH_DISTRIBUTED_DEBUG=INFO``. Not DETAIL by default: DETAIL wraps every group in a checker that compares the
    collectives of all ranks *before* they reach gloo, so a mismatched op never enters the flight recorder (its
    error message names the two ops instead, and its own checking all-gathers fill the recorder under an empty
    group name). ``--debug-level DETAIL`` is there; its mismatch message is then read from the log.
After the job: gloo dumps key ``pg_config`` under ``''`` while their entries name the group ``('0', 'default_pg')``
(torch's analyser then stops with a KeyError), so ``repair`` rebuilds ``pg_config`` from the entries and the groups
the wrapper saw alive; then torch's own analyser (``torch.distributed.flight_recorder``, the ``torchfrtrace``
command) matches the collectives of all ranks, and ``diagnose`` turns its first failed match into a verdict:
  mismatch   ranks issued different collectives (op, sizes or dtype) at the same sequence number
  missing    a rank never issued a collective the others wait in, and had already finished (it skipped it)
  timeout    a rank never issued it but was still running (it was late), or the whole job ran past --timeout
  error      the job failed without any collective problem;  ok: nothing went wrong
"""
from __future__ import annotations

import argparse
import json
import logging
import pickle
import re
import sys
import tempfile
import time
from pathlib import Path

from coursekit.launch import request_dumps, sidecars as _sidecars  # noqa: F401 (the launcher asks for dumps)

WRAPPER = "coursekit.profiling.frwrap"
_ABORT = re.compile(r"\[rank (\d+)\]\s+what\(\):\s+(.*Received data size doesn't match expected size.*)")
_DETAIL = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(\d+), "
                     r"OpType=(\w+), TensorShape=\[([^\]]*)\]")


def worker_env(folder, pg_timeout_s: float = 10.0, debug: str = "INFO", buffer: int = 2000) -> dict:
    from coursekit.profiling.frwrap import DIR_ENV, TIMEOUT_ENV

    return {DIR_ENV: str(folder), TIMEOUT_ENV: str(pg_timeout_s), "COURSEKIT_PG_TIMEOUT": str(pg_timeout_s),
            "TORCH_FR_BUFFER_SIZE": str(buffer), "TORCH_DISTRIBUTED_DEBUG": debug}


def repair(folder) -> Path:
    """Copies of the dumps, named ``fr_<rank>``, whose ``pg_config`` names every group as the entries do."""
    folder, side = Path(folder), _sidecars(folder)
    out = folder / "repaired"
    out.mkdir(exist_ok=True)
    dumps = {int(f.stem.rsplit("_", 1)[1]): pickle.loads(f.read_bytes()) for f in folder.glob("fr_trace_*.pkl")}
    world = max([s.get("world_size", 0) for s in side.values()] + [len(dumps)])
    live = {name: g for s in side.values() for name, g in s.get("groups", {}).items()}
    users: dict[str, set] = {}
    for rank, d in dumps.items():
        for e in d["entries"]:
            users.setdefault(e["process_group"][0], set()).add(rank)
    for rank, d in dumps.items():
        cfg = {}
        for e in d["entries"]:
            name, desc = e["process_group"]
            ranks = live.get(name, {}).get("ranks") or (list(range(world)) if desc == "default_pg"
                                                        else sorted(users[name]))
            cfg[name] = {"name": name, "desc": desc, "ranks": str(sorted(ranks))}
        (out / f"fr_{rank}").write_bytes(pickle.dumps({**d, "pg_config": cfg}))
    return out


def analyse(folder, world: int) -> tuple[list, str]:
    """torch's flight-recorder analyser (``torchfrtrace``) on the repaired dumps: (its collectives, what it said).

    It matches the collectives of all ranks against those of the lowest rank, so in a mismatch the ranks it names
    are those that disagree with the lowest rank."""
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    rep = repair(folder)
    args = [str(rep), "--prefix", "fr_"]
    if len(list(rep.glob("fr_*"))) < world:
        args.append("--allow-incomplete-ranks")
    log = logging.getLogger("Flight Recorder")
    lines, saved = [], log.handlers[:]

    class Keep(logging.Handler):
        def emit(self, rec):
            lines.append(rec.getMessage())

    log.handlers = [Keep()]
    try:  # fr_trace.main's three steps, with the dumps in rank order: it compares every rank with the first one
        opts = JobConfig().parse_args(args)
        details, version = read_dir(opts)
        details = dict(sorted(details.items(), key=lambda kv: kv[1]["rank"]))
        db = build_db(details, opts, version)
    finally:
        log.handlers = saved
    return list(db.collectives), "\n".join(lines)


def _op(c, ranks) -> dict:
    where = next((f"{Path(f['filename']).name}:{f['line']} in {f['name']}" for f in c.collective_frames or []
                  if "torch/distributed" not in f["filename"]), None)  # frames: innermost first
    return {"ranks": sorted(ranks), "op": c.collective_name.split(":", 1)[-1], "input_sizes": c.input_sizes,
            "output_sizes": c.output_sizes, "where": where}


def diagnose(folder, *, world: int, timed_out: bool = False, failed: bool = False, log: str = "") -> dict:
    side = _sidecars(folder)
    stacks = {r: next((f for f in reversed(s["dumps"][-1]["stack"]) if "/torch/" not in f), None)
              if s["dumps"] else None for r, s in side.items()}  # the innermost line of the user's code
    base = {"ranks": [], "seq": None, "ops": [], "pg": None, "timed_out": timed_out, "folder": str(folder),
            "no_dump": sorted(set(range(world)) - set(side)), "last_stack": stacks}
    colls, text = [], ""
    if list(Path(folder).glob("fr_trace_*.pkl")):
        try:
            colls, text = analyse(folder, world)
        except Exception as e:  # the analyser gave up (a format it does not know): the other evidence remains
            text = f"torch's flight-recorder analyser failed: {type(e).__name__}: {e}"
    base["analyser"] = text
    bad = next((c for c in colls if not c.pass_check or c.missing_ranks), None)
    if bad is not None and bad.mismatch_collectives:
        odd = bad.mismatch_collectives
        rest = set(bad.expected_ranks) - set(odd)
        ops = [_op(bad, rest)] + [_op(c, [r]) for r, c in sorted(odd.items())]
        kinds = sorted({str(c.type_of_mismatch) for c in odd.values()})
        return {**base, "kind": "mismatch", "ranks": sorted(odd), "seq": bad.collective_seq_id, "ops": ops,
                "pg": bad.pg_desc, "why": "; ".join(kinds)}
    if bad is not None and bad.missing_ranks:
        miss = sorted(bad.missing_ranks)
        ended = all(any(d["reason"] == "exit" for d in side.get(r, {}).get("dumps", [])) for r in miss)
        return {**base, "kind": "missing" if ended else "timeout", "ranks": miss, "seq": bad.collective_seq_id,
                "ops": [_op(bad, set(bad.expected_ranks) - set(miss))], "pg": bad.pg_desc,
                "why": "finished without it" if ended else "still running, not there yet"}
    found = _DETAIL.findall(log)  # TORCH_DISTRIBUTED_DEBUG=DETAIL caught the mismatch before the recorder did
    if found:
        per = {int(r): (int(s), op, shape) for r, s, op, shape in found}
        return {**base, "kind": "mismatch", "ranks": sorted(per), "seq": min(s for s, _, _ in per.values()),
                "ops": [{"ranks": [r], "op": op.lower(), "input_sizes": [[int(x) for x in sh.split(",") if x]],
                         "output_sizes": None, "where": None} for r, (_, op, sh) in sorted(per.items())],
                "why": "TORCH_DISTRIBUTED_DEBUG=DETAIL fingerprint mismatch"}
    aborted = {int(r): msg.strip() for r, msg in _ABORT.findall(log)}
    if aborted:  # gloo ends a rank with std::terminate when more bytes arrive than it expects: no dump there
        last = {r: pickle.loads(f.read_bytes())["entries"][-1] for r in side
                if (f := Path(folder) / f"fr_trace_{r}.pkl").exists() and r not in aborted}
        ops = [{"ranks": [r], "op": e["profiling_name"].split(":")[-1], "input_sizes": e["input_sizes"],
                "output_sizes": e["output_sizes"], "where": None} for r, e in sorted(last.items()) if e]
        return {**base, "kind": "mismatch", "ranks": sorted(set(range(world)) - set(aborted)) or sorted(aborted),
                "aborted": sorted(aborted), "seq": max((e["collective_seq_id"] for e in last.values()), default=None),
                "ops": ops, "why": f"gloo aborted rank(s) {sorted(aborted)}: " + "; ".join(aborted.values())}
    errors = {r: d["error"] for r, s in side.items() for d in s["dumps"] if d["reason"] == "exception"}
    if timed_out or any("Timed out" in (e or "") for e in errors.values()):
        return {**base, "kind": "timeout", "ranks": sorted(errors) or list(range(world)), "why": errors or
                "the job ran past --timeout with every collective matched"}
    return {**base, "kind": "error" if (failed or errors) else "ok", "ranks": sorted(errors), "why": errors}


def run(target: str, args=(), *, nproc: int = 2, timeout: float = 120, pg_timeout_s: float = 10.0,
        debug: str = "INFO", folder=None, stream: bool = True) -> dict:
    """Launch ``target`` under the wrapper; diagnose whatever happened. Adds ``elapsed_s`` and ``returncode``."""
    from coursekit.launch import LaunchError, launch

    folder = Path(folder or tempfile.mkdtemp(prefix="coursekit-fr-"))
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        res = launch(target, args, nproc=nproc, timeout=timeout, stream=stream, diagnose=folder,
                     env=worker_env(folder, pg_timeout_s, debug))
        timed_out, rc, log = False, res.returncode, res.log
    except LaunchError as e:
        timed_out, rc, log = e.timed_out, e.returncode, e.log
    d = diagnose(folder, world=nproc, timed_out=timed_out, failed=rc != 0, log=log)
    return {**d, "returncode": rc, "elapsed_s": time.monotonic() - t0}


def summary(d: dict) -> str:
    ops = "; ".join(f"rank {','.join(map(str, o['ranks']))}: {o['op']} in {o['input_sizes']} -> {o['output_sizes']}"
                    + (f" at {o['where']}" if o.get("where") else "") for o in d["ops"])
    r = ", ".join(map(str, d["ranks"])) or "-"
    head = {"mismatch": f"MISMATCH at collective #{d['seq']} of {d['pg']}: rank(s) {r} issued a different collective",
            "missing": f"MISSING: rank(s) {r} never arrived at collective #{d['seq']} of {d['pg']} ({d.get('why')})",
            "timeout": (f"TIMEOUT: rank(s) {r} had not reached collective #{d['seq']} of {d['pg']} when the others "
                        "gave up" if d["seq"] else f"TIMEOUT on rank(s) {r}"),
            "error": f"ERROR on rank(s) {r}, no collective problem found", "ok": "OK: the job ended normally"}
    lines = [head[d["kind"]]] + ([f"  ops: {ops}"] if ops else [])
    lines += [f"  rank {k} was at: {v}" for k, v in sorted(d["last_stack"].items()) if v and d["kind"] != "ok"]
    if d["kind"] in ("timeout", "error") and isinstance(d.get("why"), dict):
        lines += [f"  rank {k}: {str(v)[:300]}" for k, v in sorted(d["why"].items())]
    if d["no_dump"]:
        lines.append(f"  no flight-recorder dump from rank(s) {d['no_dump']}")
    lines.append(f"  dumps: {d['folder']}  (torch's analyser: torchfrtrace {d['folder']}/repaired -p fr_)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False,
                                prog="coursekit launch", description="run a script on N processes under torchrun "
                                "(the launcher the trainer uses); --diagnose explains a hang")
    p.add_argument("--nproc", type=int, default=None, help="processes (default: GPUs present, else 2)")
    p.add_argument("--timeout", type=float, default=600, help="seconds before the whole job is stopped")
    p.add_argument("--diagnose", action="store_true", help="short group timeout, flight recorder, a diagnosis")
    p.add_argument("--pg-timeout", type=float, default=10.0, help="with --diagnose: process-group timeout (s)")
    p.add_argument("--debug-level", default="INFO", choices=("OFF", "INFO", "DETAIL"),
                   help="with --diagnose: TORCH_DISTRIBUTED_DEBUG")
    p.add_argument("--dump-dir", default=None, help="with --diagnose: where the dumps go (default: a temp folder)")
    p.add_argument("--json", action="store_true", help="with --diagnose: print the diagnosis as one JSON object")
    p.add_argument("target", nargs="?", help="SCRIPT.py [ARGS] or -m MODULE [ARGS]")
    argv = list(sys.argv[1:] if argv is None else argv)
    i, valued = 0, {"--nproc", "--timeout", "--pg-timeout", "--debug-level", "--dump-dir"}
    while i < len(argv) and argv[i] != "-m" and argv[i].startswith("-"):  # our options end at the target
        i += 2 if argv[i] in valued else 1
    a, rest = p.parse_args(argv[:i]), argv[i:]
    if not rest or (rest[0] == "-m" and len(rest) < 2):
        p.error("give a script (SCRIPT.py ARGS) or a module (-m MODULE ARGS)")
    target, args = (rest[1], rest[2:]) if rest[0] == "-m" else (rest[0], rest[1:])
    from coursekit.launch import default_nproc, launch

    nproc = a.nproc or default_nproc()
    if not a.diagnose:
        return launch(target, args, nproc=nproc, timeout=a.timeout).returncode
    d = run(target, args, nproc=nproc, timeout=a.timeout, pg_timeout_s=a.pg_timeout, debug=a.debug_level,
            folder=a.dump_dir, stream=not a.json)
    print(json.dumps(d, default=str) if a.json else summary(d))
    return 0 if d["kind"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
