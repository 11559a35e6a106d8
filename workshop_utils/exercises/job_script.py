"""Exercise 6.1's job script: the template, its specification (``JOB_SPEC``), the answers filled in, torchrun's
options as data for the simulated torchrun."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re

from .answer_values import Problem, number_of, show, whole_digits
from .exercise_cells import NotYet, Unsolved
from .slurm_rules import sbatch_arguments

EXERCISE = "Exercise 6.1"
GAPS = ("nodes", "ntasks_per_node", "cpus_per_task", "time", "signal", "nproc_per_node", "rdzv_endpoint")
DIRECTIVE_GAPS = GAPS[:5]  # the gaps of the #SBATCH lines; the others are in the launch line

JOB_SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=ex61-train
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={ntasks_per_node}
#SBATCH --cpus-per-task={cpus_per_task}
#SBATCH --time={time}
#SBATCH --signal={signal}
#SBATCH --output=%x-%j.out
set -uo pipefail
export OMP_NUM_THREADS=1  # each of the processes torchrun starts computes in one thread
# The warning signal reaches this script (B:); pass it on to the training processes on every node, not to
# torchrun itself (its command line names the module too, but only the processes it starts run python -u).
forward() { srun --overlap --ntasks-per-node=1 pkill -USR1 -f "python[0-9.]* -u -m workshop_utils.train" || true; }
trap forward USR1
# srun starts one task per node (torchrun); torchrun starts --nproc-per-node training processes.
srun --cpus-per-task="$SLURM_CPUS_PER_TASK" torchrun --nnodes="$SLURM_JOB_NUM_NODES" \\
    --nproc-per-node={nproc_per_node} --rdzv-backend=c10d --rdzv-endpoint={rdzv_endpoint} --rdzv-id="$SLURM_JOB_ID" \\
    -m workshop_utils.train "$@" &
# bash runs the trap only between commands: wait (which a signal interrupts) until training has ended.
while ! wait $!; do kill -0 $! 2>/dev/null || break; done
"""


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """What Exercise 6.1 asks of the job, whatever the attendee's script says."""

    nodes: int = 1  # "2 training processes on one node" (the notebook's section 8)
    tasks_per_node: int = 1  # srun starts one task per node: torchrun, the node's agent
    procs_per_node: int = 2  # the training processes torchrun starts on each node
    cores_per_proc: int = 1  # one core each (OMP_NUM_THREADS=1)
    warning: str = "USR1"  # what the script's trap and the training loop listen for
    min_lead_s: int = 30  # the least warning in which a checkpoint reliably gets written
    needed_s: int = 120  # start-up and a few CPU steps take well under this; the warning's lead comes on top
    early_s: int = 60  # sbatch's manual: "the signal may be sent up to 60 seconds earlier than specified"
    max_time_s: int = 3_600  # an hour: far more than a two-minute job needs; a longer request waits longer in the queue
    # the check also runs the script on two nodes: "only #SBATCH --nodes changes" (the notebook)

    @property
    def ranks(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def cores_per_task(self) -> int:
        return self.procs_per_node * self.cores_per_proc


JOB_SPEC = JobSpec()
NEEDED_S = JOB_SPEC.needed_s
# What the training in the job does: a few CPU steps of the small CNN, a checkpoint every few, one line a step.
TRAINING = ("--device", "cpu", "--batch-size", "16", "--train-size", "256", "--test-size", "64", "--steps", "12",
            "--epochs", "100", "--lr", "0.01", "--warmup-steps", "0", "--checkpoint-every", "4", "--log-every", "4",
            "--no-progress")
# A comment as bash reads a word list: a # that begins a word, outside quotes (an unclosed quote runs to the end).
_COMMENT = re.compile(r"""(?:[^'"]|'[^']*'|"[^"]*")*?[ \t]#""")
# In words, not as code: the endpoint is the exercise's hardest gap, and a fix that spelled it out would hand it over.
RDZV_FIX = ("--rdzv-endpoint=HOST:PORT, HOST the job's first node (the first name scontrol lists from the job's node "
            "list, read when the job runs) and PORT a free port of the job's own")


# ---------------------------------------------------------------------------------------------- the answers


def _gap_text(gap: str, value, exercise: str) -> str:
    """A gap's answer as the script's text: text as it is, a whole number as its exact digits."""
    flag = "--" + gap.replace("_", "-")
    if isinstance(value, str):
        if "\n" in value or "\r" in value:
            raise NotYet(f"✗ {exercise}: `{gap}` ({show(value)}) holds a line break, which would start a line of "
                         "its own.", f"only what goes after {flag}=, on one line.")
        curly = re.search("[\u2018\u2019\u201a\u201c\u201d\u201e\u00ab\u00bb]", value)
        if curly:  # pasted from slides, a chat or a word processor
            raise NotYet(f"✗ {exercise}: `{gap}` ({show(value)}) holds {curly.group()} (U+{ord(curly.group()):04X}), "
                         "a typographic quote: bash and sbatch take it for a letter, not a quote.",
                         "type the quotes again as straight ones, \" or '.")
        if value[:1].isspace():
            splits, reader = ("sbatch", "the #SBATCH line") if gap in DIRECTIVE_GAPS else ("the shell", "torchrun")
            what = "endpoint" if gap == "rdzv_endpoint" else "value"
            raise NotYet(f"✗ {exercise}: `{gap}` starts with a space: {splits} splits the word there, so {reader} "
                         f"would get an empty {what} after {flag}=.", "no space after the =.")
        if gap not in DIRECTIVE_GAPS and _COMMENT.match(value):
            raise NotYet(f"✗ {exercise}: `{gap}` ({show(value)}) holds a # after a space, which starts a comment in "
                         "bash: the rest of the launch line, its backslash too, would be lost.",
                         f"only the value after {flag}=; a comment goes on a line of its own above the command.")
        try:
            words = sbatch_arguments(value) if gap in DIRECTIVE_GAPS else []
        except Problem:
            raise NotYet(f"✗ {exercise}: `{gap}` ({show(value)}) has a quote that does not close: sbatch stops "
                         "at it.", f"one value for {flag}, without quotes.") from None
        if len(words) > 1:
            raise NotYet(f"✗ {exercise}: `{gap}` ({show(value)}) is {len(words)} words to sbatch: its #SBATCH line "
                         f"would take only {show(words[0])} as the value.", f"one value for {flag}, without spaces.")
        return str(value)
    try:
        digits = whole_digits(value)
    except Problem as problem:
        raise NotYet(f"✗ {exercise}: `{gap}` {problem}.", "each gap takes text or a whole number: what goes after "
                     f"its flag in the script, {flag}=...") from None
    if digits is None:
        try:
            shown = f"{number_of(value):g}"
        except Problem:
            shown = show(value)
        raise NotYet(f"✗ {exercise}: `{gap}` = {shown} is not a whole number.",
                     f"what goes after {flag}= is text or a whole number.")
    return digits


def fill_job_script(answers: dict, exercise: str = EXERCISE) -> str:
    """``JOB_SCRIPT`` with the gaps filled from ``answers``; any gap still ``...`` leaves it unsolved."""
    unknown = [key for key in answers if key not in GAPS]
    missing = [gap for gap in GAPS if answers.get(gap, ...) is ...]
    if missing:
        also = f" (answers also has {', '.join(show(k) for k in unknown)}, which is no gap)" if unknown else ""
        raise Unsolved(f"… {exercise}: not yet solved: fill {', '.join(missing)}{also}.",
                       "each is what goes after its flag in the script above.")
    if unknown:
        raise NotYet(f"✗ {exercise}: answers has {', '.join(show(k) for k in unknown)}, which the script has no gap "
                     "for.", f"keep to the gaps: {', '.join(GAPS)}.")
    filled = {gap: _gap_text(gap, answers[gap], exercise) for gap in GAPS}
    # the gaps alone: the script's own braces (forward() { ...; }) print and stay as bash reads them
    return re.sub(r"\{(" + "|".join(GAPS) + r")\}", lambda gap: filled[gap.group(1)], JOB_SCRIPT)


# ---------------------------------------------------------------------------------------------- torchrun


@functools.cache
def torchrun_options() -> tuple[dict, ...]:
    """torchrun's options as data, for the simulated torchrun to rebuild its parser without PyTorch."""
    from torch.distributed.run import get_args_parser

    options = []
    for action in get_args_parser()._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        kind = "store_true" if action.nargs == 0 else "remainder" if action.nargs == argparse.REMAINDER else "store"
        type_name = getattr(action.type, "__name__", "str")
        default = action.default if isinstance(action.default, (str, int, float, bool, type(None))) else None
        if type(action).__name__ in ("env", "check_env"):  # torch's own, which read PET_<NAME> too
            kind = type(action).__name__
        options.append(dict(flags=list(action.option_strings), dest=action.dest, kind=kind, default=default,
                            type=type_name if type_name in ("int", "float") else "str",
                            choices=list(action.choices) if action.choices else None))
    return tuple(options)


def torch_modules() -> dict[str, str]:
    """The files of PyTorch's standard-library-only modules that the simulated torchrun loads by path."""
    from torch.distributed import argparse_util
    from torch.distributed.elastic.rendezvous import utils

    return dict(argparse_util=argparse_util.__file__, rendezvous_utils=utils.__file__)
