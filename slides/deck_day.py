"""The workshop day: its sessions, their times and slide budgets, and the minutes each exercise needs.

``SESSIONS`` is the plan: the overview deck's agenda slide (``{{agenda}}``) and the handout's session headings
(``{{session NN}}``) are drawn from it, and the build checks every deck's slide count against its session's talk
time (slides/README.md, "The day").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Session:
    """One slot of the workshop day; its talk time sets how many slides its deck may have."""

    start: str
    end: str
    title: str
    deck: str | None = None  # None: a break
    talk: int = 0  # minutes of slides
    demo: int = 0  # minutes of live notebooks
    exercise: int = 0  # minutes attendees work on their own
    questions: int = 0
    demo_what: str = ""

    @property
    def minutes(self) -> int:
        if not self.start:
            return self.talk + self.demo + self.exercise + self.questions
        (h0, m0), (h1, m1) = (map(int, t.split(":")) for t in (self.start, self.end))
        return (h1 * 60 + m1) - (h0 * 60 + m0)

    @property
    def budget(self) -> tuple[int, int]:
        """About one slide per 2 to 3 minutes of talk: the fewest and the most slides the deck should have."""
        return math.ceil(self.talk / 3), self.talk // 2

    @property
    def when(self) -> str:
        return f"{self.start}–{self.end}" if self.start else f"optional, {self.minutes} min"


# Minutes an attendee needs for each exercise, the sum of which sizes a session's exercise slot: estimated, not yet
# timed with attendees (slides/INSTRUCTOR.md, "The day", says how).
EXERCISE_MINUTES = {"1.1": 3, "1.2": 3, "1.3": 4, "1.4": 3, "2.1": 5, "2.2": 10, "2.3": 5, "2.4": 5,
                    "3.1": 4, "3.2": 4, "3.3": 8,
                    "4.1": 5, "4.2": 4, "4.3": 5, "5.1": 5, "5.2": 5, "5.3": 5, "6.1": 7, "6.2": 4, "6.3": 4}

SESSIONS = (
    Session("10:00", "10:15", "Welcome: the day at a glance", "00_overview", talk=15),
    Session("10:15", "11:30", "Session 1 · HPC fundamentals and an introduction to DDP", "01_fundamentals",
            talk=42, demo=20, exercise=13, demo_what="notebook 01: the single-GPU baseline"),
    Session("11:30", "11:45", "Break"),
    Session("11:45", "13:00", "Session 2 · Hands-on DDP", "02_ddp", talk=30, demo=20, exercise=25,
            demo_what="notebook 02: DDP scaling, all-reduce, crash and resume"),
    Session("13:00", "14:00", "Lunch"),
    Session("14:00", "15:30", "Session 3 · Advanced optimization", "03_optimization", talk=30, demo=24, exercise=30,
            questions=6, demo_what="notebooks 03 and 04: mixed precision; profiling and the ladder"),
    Session("15:30", "15:45", "Break"),
    # The job scripts are this session's hands-on: submit one, watch it, requeue it.
    Session("15:45", "16:45", "Session 4 · Slurm and deployment", "04_slurm", talk=24, demo=15, exercise=15,
            questions=6, demo_what="notebook 06 and the job scripts in slurm/"),
    Session("", "", "Bonus · Beyond data parallelism", "05_beyond_data_parallel", talk=30, demo=15, exercise=15,
            demo_what="notebook 05: collectives, FSDP, tensor and pipeline parallelism"),
)


def session_notebooks(session: Session) -> list[str]:
    """The numbers of the notebooks a session's live demo runs ("03", "04"), as its ``demo_what`` names them."""
    return re.findall(r"\b(\d\d)\b", session.demo_what)


def session_of(deck: str) -> Session | None:
    return next((s for s in SESSIONS if s.deck == deck), None)


def handout_sessions() -> list[Session]:
    """The sessions that get a page of the handout: every one with a deck, except the overview."""
    return [s for s in SESSIONS if s.deck and not s.deck.startswith("00_")]
