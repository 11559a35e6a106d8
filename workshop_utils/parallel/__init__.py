"""Distributed training beyond the loop: launching torchrun, collectives and their cost model,
sharding (ZeRO/FSDP), tensor and pipeline parallelism, distributed checkpoints (sessions 02 and 05).

Depends on ``spine`` and ``system``.
"""
