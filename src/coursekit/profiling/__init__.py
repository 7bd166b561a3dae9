"""Module 5 tools: profiler traces, compute/communication overlap, hang diagnosis.

  * ``profiler``  ``maybe_profile`` (a ``with`` block that writes one Chrome trace per rank) and ``top_ops``.
  * ``trace``     the course's overlap computation: compute, communication, hidden and exposed communication,
                  idle time and time waiting for slower ranks, per rank and step (``coursekit trace DIR``).
  * ``prefetch``  how many FSDP2 units were gathered ahead of the compute, per unit and pass (``--prefetch N``).
  * ``hangs``     ``coursekit launch --diagnose``: flight-recorder dumps from every rank, torch's analyser, a
                  diagnosis (which ranks disagree, at which collective, which rank never arrived).
  * ``frwrap``    the per-worker wrapper that makes gloo ranks dump their flight recorder on demand.

Importing this package imports no torch.
"""
from coursekit.profiling.profiler import maybe_profile, schedule_for, top_ops

__all__ = ["maybe_profile", "schedule_for", "top_ops"]
