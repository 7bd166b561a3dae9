"""The description of a run, in pure Python: the floor every other layer stands on (it imports nothing of coursekit's
above it, and no torch).

    dims.py       ParallelDims: how many ranks along each mesh axis, where each rank sits (trainer, calculator, planner)
    registry.py   every strategy and parallelism by name: its class ("module:Class", loaded only when a run uses it),
                  data-parallel flavour, option group
    schedules.py  the pipeline schedules: torch class, stages per rank, the stage layout (loop or V)

``coursekit.parallel`` (the torch core), the parallelisms, the calculator (``coursekit.memory``) and the planner
read these tables; none restates them.
"""
