"""What judges an attendee's answer: the exercise cells, the shared judging, each notebook's checks, the DDP lab
and notebook 06's Slurm exercises. Depends on ``lessons``, ``parallel``, ``spine`` and ``system``."""
