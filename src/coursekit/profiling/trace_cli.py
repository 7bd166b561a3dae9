"""``coursekit trace DIR [--json] [--plot FILE.png]``: the overlap table of ``coursekit.profiling.trace`` and the
timeline of ``coursekit.profiling.timeline``, from one Chrome trace per rank."""
from __future__ import annotations

import argparse
import json
import sys

from coursekit.profiling import trace as T
from coursekit.profiling.timeline import plot


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="coursekit trace", description=T.__doc__.split("\n\n")[0])
    p.add_argument("folder", help="folder with one Chrome trace per rank (trace-rank<R>.json)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="draw a per-rank timeline of compute vs communication")
    p.add_argument("--top", type=int, default=5, help="ops listed per step")
    a = p.parse_args(argv)
    res = T.analyse(a.folder, a.top)
    if a.plot:
        plot(a.folder, a.plot)
    print(json.dumps(res, indent=1) if a.json else T.table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
