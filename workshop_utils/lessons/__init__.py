"""The lessons' analyses: numerics, sweeps and the optimization ladder, profiling, IO layouts,
device monitoring, activation recomputation, checks and plots, the exercises' checks, the DDP lab
and the Slurm lesson (what one notebook shows).

Depends on ``parallel``, ``spine`` and ``system``.
"""
