"""The training spine: config and the one loop, models, data and loaders, precision, checkpoints,
timing, FLOPs, and the process-group set-up the loop needs (sessions 01-04).

Depends only on ``system``.
"""
