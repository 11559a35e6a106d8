"""The lessons' analyses, what one notebook teaches: numerics, sweeps and the optimization ladder, profiling,
IO layouts, device monitoring, activation recomputation, "what you should see" checks and plots, and the
Slurm lesson. What judges an attendee's answer is in ``exercises``.

Depends on ``parallel``, ``spine`` and ``system``.
"""
