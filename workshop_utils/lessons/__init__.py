"""The lessons' analyses: numerics, sweeps and the optimization ladder, profiling, IO layouts,
device monitoring, activation recomputation, checks and plots (what one notebook shows).

Depends on ``parallel``, ``spine`` and ``system``.
"""
