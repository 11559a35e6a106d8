"""The exercises' checks and the DDP lab: what judges an attendee's answer.

The exercise cells and the attendees' copies (``exercise_cells``), what every check shares
(``exercise_judging``, ``answer_values``), each notebook's checks (``exercise_checks`` gathers them), the DDP
lab and its exercises (``ddp_lab``), and notebook 06's (``slurm_exercises``, with Exercise 6.1's simulated job).

Depends on ``lessons``, ``parallel``, ``spine`` and ``system``.
"""
