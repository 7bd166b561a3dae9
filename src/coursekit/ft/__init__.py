"""Fault tolerance without restarting the world (Module 5): torchft replica groups over gloo.

``coursekit.ft.replica`` is one replica group's training loop (torchft ``Manager`` + its DDP and optimizer wrappers);
``coursekit.ft.run`` starts a lighthouse and N replica groups, SIGKILLs one mid-run and restarts it, and reports
what the survivors lost (time stalled, steps not committed) next to the restart-from-checkpoint path.
"""
