"""Notebook 02's DDP lab and exercises: the solution passes, each common mistake gets its own line.

The mistakes are small edits of the solution script (or functions, for Exercise 2.1), written here into
tmp_path and run under torchrun by the checker as two nodes on this machine (marked slow). Each launch is the
cost, so one launch judges several: the lab's findings give each part of a run (the data, the model, the
checkpoint, the output, the end) every mistake the rest of that part does not depend on, and Exercise 2.1's
functions that return run one after another in one launch. The parsing of launch lines, the attendee's copy and the 64-GPU check are pure Python.
"""

import ast
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import torch.distributed as dist
import pytest
from torch.distributed import all_reduce

import workshop_utils as wu
from workshop_utils.exercises import ddp_lab
from workshop_utils.exercises.ddp_lab import (LAB_EXERCISE, judge_average_gradients, lab_folder, placeholders_left,
                                              read_launch_line, solution_text)
from workshop_utils.exercises import ddp_lab_bash, ddp_lab_files
from workshop_utils.exercises.ddp_lab_files import (LIMIT_FACTOR, LIMIT_FLOOR_S, note_progress, run_nodes, scaled_limit,
                                                    what_ran)
from workshop_utils.exercises.ddp_lab_gradients import function_source, gradients_failure, shipped_globals
from workshop_utils.exercises.ddp_lab_judging import findings, sampler_mistake
from workshop_utils.exercises.exercise_cells import NotYet
from workshop_utils.system.errors import WorkshopError
from workshop_utils.system.results import write_json

LAB = Path(__file__).resolve().parent.parent / "notebooks" / "labs" / "ddp_lab"
SMALL = ("--samples", "288")  # 96 samples on each of 3 ranks, 3 steps an epoch: the launch is the cost


def solution() -> str:
    return solution_text((LAB / "train_ddp.py").read_text())


def mutated(tmp_path, old: str, new: str) -> Path:
    """The solution with one change: ``old`` must occur in it exactly once."""
    source = solution()
    assert source.count(old) == 1, old
    path = tmp_path / "my_train_ddp.py"
    path.write_text(source.replace(old, new))
    return path


# ---------------------------------------------------------------- the files (no launch)


def test_the_lab_folder_is_found_and_both_scripts_share_their_helpers():
    assert lab_folder() == LAB
    single, ddp = (ast.parse((LAB / name).read_text()) for name in ("train_single.py", "train_ddp.py"))

    def helpers(tree):
        return {n.name: ast.dump(n) for n in tree.body
                if isinstance(n, ast.FunctionDef) and n.name in ("synthetic_cifar", "build_model")}

    assert helpers(single) == helpers(ddp) and len(helpers(single)) == 2
    imported = {a.name for n in ast.walk(single) if isinstance(n, ast.Import) for a in n.names} | \
               {n.module for n in ast.walk(single) if isinstance(n, ast.ImportFrom)}
    assert not any(name.startswith("workshop_utils") for name in imported), "the starting script is plain PyTorch"


def test_the_attendee_copy_has_the_gaps_and_none_of_the_answers(tmp_path):
    copy = wu.attendee_script(LAB / "train_ddp.py", tmp_path / "copy.py")
    text = copy.read_text()
    ast.parse(text)
    assert sum(line.strip() == "# YOUR CODE HERE" for line in text.splitlines()) == 9
    for answer in ("sampler.set_epoch(epoch)", "dist.destroy_process_group()", "DDP(model", "os.environ["):
        assert answer not in text, answer
    assert "###" not in text
    assert placeholders_left(text), "the gaps hold `...`"


def test_an_ellipsis_as_an_index_is_no_placeholder():
    source = "x = images[...]\ny: tuple[int, ...] = (1,)\nz = ...\ndist.init_process_group(...)\n"
    assert placeholders_left(source) == [3, 4]


def test_the_solution_without_markers_is_plain_python():
    text = solution()
    assert "###" not in text and "sampler.set_epoch(epoch)" in text and not placeholders_left(text)
    ast.parse(text)


def test_start_writes_the_copy_once_and_keeps_edits(tmp_path, capsys):
    path = wu.start_ddp_lab(tmp_path, LAB)
    assert path == tmp_path / "ddp_lab" / "my_train_ddp.py" and "9 places" in capsys.readouterr().out
    path.write_text(path.read_text() + "# edited\n")
    assert wu.start_ddp_lab(tmp_path, LAB).read_text().endswith("# edited\n")
    assert "kept as you left it" in capsys.readouterr().out


def test_the_checker_names_the_placeholders_of_the_copy_before_launching(tmp_path, capsys):
    path = wu.start_ddp_lab(tmp_path, LAB)
    assert wu.check_ddp_lab(path, tmp_path) is False  # not yet solved: one line, no exception
    assert re.search(r"not yet solved: .*still has the placeholder `\.\.\.` on line\(s\) \d+", capsys.readouterr().out)
    assert not list(tmp_path.glob("check*")), "nothing was launched"


def test_the_checker_asks_for_the_command_while_it_is_the_placeholder(tmp_path, capsys):
    script = wu.solve_ddp_lab(tmp_path / "my_train_ddp.py", LAB)
    assert wu.check_ddp_lab(script, tmp_path, command=...) is False
    assert "`lab_command` is still the placeholder" in capsys.readouterr().out


@pytest.mark.parametrize("command, message", [
    (None, "`lab_command` is None"),
    (42, "cannot be read as a command line"),
    ("", "the command has no launch line"),
    (["torchrun", ["--nproc-per-node=2"]], "`lab_command` is a list with an item that is no word"),
])
def test_a_command_that_is_no_launch_line_is_named_before_any_launch(tmp_path, command, message):
    """None is no launch line: only leaving `command` out lets the checker write the torchrun line itself."""
    script = wu.solve_ddp_lab(tmp_path / "my_train_ddp.py", LAB)
    with pytest.raises(NotYet, match=message):
        wu.check_ddp_lab(script, tmp_path, command=command)
    assert not list(tmp_path.glob("check*")), "nothing was launched"


@pytest.mark.parametrize("command, script_args", [
    ("torchrun --nproc-per-node=2 {s}", []),
    ("!torchrun --nproc_per_node 2 {s} --epochs 2", ["--epochs", "2"]),
    ("python -m torch.distributed.run --standalone --nproc-per-node=2 {s}", []),
    # torch.distributed.launch passes LOCAL_RANK in the environment only with --use-env: then it is torchrun
    ("python -m torch.distributed.launch --use-env --nproc-per-node=2 {s}", []),
    # as typed in a terminal or a Slurm script: srun, variables, a cd first
    ("srun --ntasks=1 torchrun --nproc-per-node=2 {s}", []),
    ("OMP_NUM_THREADS=1 torchrun --nproc-per-node=2 {s}", []),
    ("cd {d} && torchrun --nnodes=1 --nproc-per-node=2 my_train_ddp.py", []),
    # torchrun's own reading: the last of a repeated option, an abbreviation it accepts
    ("torchrun --nproc-per-node=1 --nproc-per-node=2 {s} --epochs 2", ["--epochs", "2"]),
    ("torchrun --nproc-per=2 {s}", []),
    ("torchrun --nproc-per-node=02 --nnodes=01 {s}", []),  # torchrun reads both as numbers: 2 and 1
    # what starts the launch in a terminal too: python's own options before -m, commands that run the next one
    ("python -u -m torch.distributed.run --nproc-per-node=2 {s}", []),
    (f"{shlex.quote(sys.executable)} -m torch.distributed.run --nproc-per-node=2 {{s}}", []),  # the kernel's Python
    ("time torchrun --nproc-per-node=2 {s}", []),
    ("nice -n 5 torchrun --nproc-per-node=2 {s}", []),
    ("stdbuf -oL torchrun --nproc-per-node=2 {s} --epochs 2", ["--epochs", "2"]),
    ("python -mtorch.distributed.run --nproc-per-node=2 {s}", []),
    ("exec torchrun --nproc-per-node=2 {s}", []),
    ("exec torchrun --nproc-per-node=2 {s}; torchrun --nproc-per-node=4 {s}", []),  # exec ends the line there
    ("exec -a name -- torchrun --nproc-per-node=2 {s}", []),
    ("nice -5 stdbuf -o L --error=0 torchrun --nproc-per-node=2 {s}", []),
    ("nice --adjustment=3 nohup torchrun --nproc-per-node=2 {s}", []),
    ("python -Im torch.distributed.run --nproc-per-node=2 {s}", []),  # python's flags joined, as it reads them
    ("python -Wignore -X dev -umtorch.distributed.run --nproc-per-node=2 {s}", []),
    ("python --check-hash-based-pycs always -m torch.distributed.run --nproc-per-node=2 {s}", []),
    # in the foreground: bash waits for it, whatever its stdin
    ("(cd {d} && torchrun --nproc-per-node=2 my_train_ddp.py < /dev/null)", []),
    ("(time torchrun --nproc-per-node=2 {s}) < /dev/null", []),
    ("(f() {{ torchrun --nproc-per-node=2 {s}; }}; f) < /dev/null", []),
    ("/usr/bin/env torchrun --nproc-per-node=2 {s} --epochs 2", ["--epochs", "2"]),
    # a rendezvous on this machine, named
    ("torchrun --master-addr=localhost --master-port=29500 --nproc-per-node=2 {s}", []),
    ("torchrun --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:29400 --nproc-per-node=2 {s}", []),
    # input from /dev/null, and output onto stderr, start the launch in the foreground: no & and no pipe
    ("torchrun --nproc-per-node=2 {s} < /dev/null", []),
    # input from the check's output, which is no /dev/null: no & (a fool-it review)
    ("torchrun --nproc-per-node=2 {s} <&1", []),
    ("torchrun --nproc-per-node=2 {s} < /dev/stdout", []),
    ("torchrun --nproc-per-node=2 {s} 1>&2", []),
    ("torchrun --nproc-per-node=2 {s} 2>&1", []),
    # what a terminal takes around a launch: a module loaded first, a time limit, srun running one task
    ("module load gcc && torchrun --nproc-per-node=2 {s}", []),
    ("timeout 600 torchrun --nproc-per-node=2 {s}", []),
    ("srun --ntasks=1 --nodes=1 torchrun --nproc-per-node=2 {s}", []),
    ("srun -n1 --ntasks-per-node=2 torchrun --nproc-per-node=2 {s}", []),  # --ntasks over --ntasks-per-node
    ("ml gcc && torchrun --nproc-per-node=2 {s}", []),
    ("conda activate ddp && torchrun --nproc-per-node=2 {s}", []),
    ("{{ time torchrun --nproc-per-node=2 {s}; }} 2>&1", []),
    # digits and < or > inside quotes are an argument's text, not a redirection
    ("torchrun --nproc-per-node=2 {s} --tag 'run 3>b'", ["--tag", "run 3>b"]),
    ("srun --gpus=2 --gres=gpu:2 torchrun --nproc-per-node=2 {s}", []),
    # a review of lines a room types: what a Slurm script sets first, pushd, the kernel's own torchrun by its path
    ("set -euo pipefail; torchrun --nproc-per-node=2 {s}", []),
    ("#!/bin/bash\nset -eux\nmodule load pytorch\nsrun --ntasks=1 torchrun --nproc-per-node=2 {s}\n", []),
    ("pushd {d} && torchrun --nproc-per-node=2 my_train_ddp.py", []),
    ("cd -P -- {d} && torchrun --nproc-per-node=2 my_train_ddp.py", []),
    ("cd '' && torchrun --nproc-per-node=2 {s}", []),  # bash stays where it is
    (f"srun -n1 {shlex.quote(str(Path(sys.executable).parent / 'torchrun'))} --nproc-per-node=2 {{s}}", []),
    (f"nohup {shlex.quote(str(Path(sys.executable).parent / 'torchrun'))} --nproc-per-node=2 {{s}}", []),
    (f"python3.{sys.version_info.minor} -m torch.distributed.run --nproc-per-node=2 {{s}}", []),
    ("mamba activate ddp && env --unset LANG OMP_NUM_THREADS=1 torchrun --nproc-per-node=2 {s}", []),
    ("srun --ntasks=1 nice torchrun --nproc-per-node=2 {s}", []),
    ("echo starting; f() {{ torchrun --nproc-per-node=2 {s}; }}; f", []),
    ("export OMP_NUM_THREADS=1; builtin echo hi; command torchrun --nproc-per-node=2 {s}", []),
    (f"{shlex.quote(str(Path(sys.executable).parent / 'torchrun'))} --nproc-per-node=2 {{s}}", []),
])
def test_launch_lines_are_read_as_torchrun_reads_them(tmp_path, command, script_args):
    script = tmp_path / "my_train_ddp.py"
    launch = read_launch_line(command.format(s=script, d=tmp_path), script, 2)
    assert launch.script_args == script_args
    stdbuf = {name for name in launch.assigned if name == "LD_PRELOAD" or name.startswith("_STDBUF_")}
    assert bool(stdbuf) == ("stdbuf" in command), "what stdbuf sets reaches the launch, as it would"
    assert {k: v for k, v in launch.assigned.items() if k not in stdbuf} == (
        {"OMP_NUM_THREADS": "1"} if "OMP" in command else {})


def test_a_line_that_moves_the_trace_is_caught_past_the_text_check():
    """The trace's descriptor moved for a command (past the text's check of N>) sends bash's trace back to stderr:
    the run says so, and the line is refused rather than judged on what is left of its trace."""
    closes = " ".join(f"{n}>&-" for n in range(3, 256))
    def torchrun(words):  # what launches, as the check tells it
        return words[0] == "torchrun"

    ran = ddp_lab_bash.run_in_bash(f"exec {closes}; torchrun --nproc-per-node=2 /nonexistent/s.py; kill -9 0", torchrun)
    assert ran.cut and len(ran.launches) == 1
    assert not ddp_lab_bash.run_in_bash("torchrun --nproc-per-node=2 /nonexistent/s.py", torchrun).cut


def test_a_script_path_through_a_loop_of_links_is_named_in_one_line(tmp_path):
    """A sixth review: a path that no file can be (a loop of links) is refused in one line, not raised."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    script = tmp_path / "my_train_ddp.py"
    with pytest.raises(NotYet, match="which no file is"):
        read_launch_line(f"torchrun --nproc-per-node=2 {tmp_path}/a/my_train_ddp.py", script, 2)


def test_torchruns_own_variables_count_as_its_options(tmp_path):
    """torchrun reads PET_NPROC_PER_NODE as --nproc-per-node: the line launches 2 processes, and the variable
    reaches the launch."""
    script = tmp_path / "my_train_ddp.py"
    assert read_launch_line(f"PET_NPROC_PER_NODE=2 torchrun {script}", script, 2).assigned == {
        "PET_NPROC_PER_NODE": "2"}


@pytest.mark.parametrize("value, cpus, gpus, verdict", [
    ("gpu", 16, 2, None), ("gpu", 16, 8, "--nproc-per-node=gpu (8 here); the lab runs 2 processes"),
    ("gpu", 2, 0, "torchrun would stop at once: Cuda is not available. Fix:"),
    ("auto", 2, 0, None), ("auto", 16, 2, None), ("auto", 16, 0, "--nproc-per-node=auto (16 here); the lab runs 2"),
    ("cpu", 2, 8, None), ("cpu", 16, 2, "--nproc-per-node=cpu (16 here)"),
])
def test_a_process_count_by_device_is_what_torchrun_makes_of_it_on_this_machine(tmp_path, monkeypatch, value, cpus,
                                                                                gpus, verdict):
    """--nproc-per-node=gpu is the launch line on a node whose GPUs are the lab's processes: torchrun counts them
    (the CPU's cores for cpu, the accelerator's devices or else the cores for auto), and so does the check."""
    import torch

    monkeypatch.setattr(torch._utils, "cpu_count", lambda: cpus)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: torch.device("cuda"))
    script = tmp_path / "my_train_ddp.py"
    line = f"torchrun --nproc-per-node={value} {script}"
    if verdict is None:
        assert read_launch_line(line, script, 2).script_args == []
    else:
        with pytest.raises(NotYet, match=re.escape(verdict)):
            read_launch_line(line, script, 2)


@pytest.mark.parametrize("command, message", [
    ("torchrun {s}", "torchrun would run with no --nproc-per-node (so one process)"),
    ("torchrun --nproc-per-node=4 {s}", "torchrun would run with --nproc-per-node=4; the lab runs 2 processes"),
    ("torchrun --nnodes=2 --nproc-per-node=2 {s}", "torchrun would run with --nnodes=2;"),
    ("srun torchrun --nnodes 2 --nproc-per-node=2 {s}", "--nnodes=2"),
    ("bash {s}", "it started no torchrun: it runs bash, which is no torchrun. Fix: launch it with torchrun"),
    ("torchrun --nproc-per-node=2", "torchrun would stop at once: the following arguments are required: "
                                    "training_script"),
    ("torchrun --nproc-per-node=2 other.py", "'other.py' as the training script in place of your lab script"),
    # the script's own name in another folder: where it points is shown, not the name alone
    ("torchrun --nproc-per-node=2 /nonexistent/my_train_ddp.py", "'/nonexistent/my_train_ddp.py' as the training"),
    ("cd /tmp && torchrun --nproc-per-node=2 my_train_ddp.py", "'/tmp/my_train_ddp.py' as the training"),
    # torchrun would run the script as a module name, or as a program: neither runs in a terminal
    ("torchrun --nproc-per-node=2 -m {s}", "with -m, torchrun would run your script as a module name"),
    ("torchrun --nproc-per-node=2 --no-python {s}", "with --no-python, torchrun would run your script as a program"),
    ("nohup torchrun --nproc-per-node=2 {s} &", "the command ends in &, which runs the launch in the background"),
    ("torchrun -h --nproc-per-node=2 {s}", "torchrun would stop at once: it prints its help (-h) and runs nothing"),
    # a rendezvous elsewhere (an address from a cluster's script), or one that needs a server: it would never start
    ("torchrun --nproc-per-node=2 --master_addr=192.0.2.1 {s}", "torchrun would meet its ranks at '192.0.2.1', not on"),
    ("torchrun --nproc-per-node=2 --rdzv-endpoint=otherhost:29400 {s}", "meet its ranks at 'otherhost', not on"),
    ("torchrun --nproc-per-node=2 --rdzv-backend=etcd {s}", "--rdzv-backend=etcd needs a rendezvous server"),
    # what torchrun's own reading of its settings refuses, past its parser
    ("torchrun --nproc-per-node=2 --logs-specs=bogus {s}", "torchrun would stop at once: Could not find entrypoint"),
    ("torchrun --nproc-per-node=2 --max-restarts=-1 {s}", "torchrun would stop at once: max_restarts must be >= 0"),
    ("", "the command has no launch line"),
    ("torchrun --nproc-per-node=2 --nproc-per-node=1 {s}",
     "would run with --nproc-per-node=1; the lab runs 2 processes"),
    ("torchrun --nproc=2 {s}", "ambiguous option"),
    ("torchrun --nproc-per-node=2 python {s}",
     "torchrun would run 'python' as the training script in place of your lab"),
    # --no-python: torchrun runs python as a program, with the script: it would run, and is named as what it does
    ("torchrun --nproc-per-node=2 --no-python python3 {s}", "torchrun would run 'python3' as a program (--no-python)"),
    ("torchrun --nproc-per-node=2 --node-rank=1 {s}", "torchrun would run with --node-rank=1;"),
    # The launcher torchrun replaced passes --local-rank=<n> as an argument, and the lab's script stops on it.
    ("python -m torch.distributed.launch --nproc-per-node=2 {s}", "passes --local-rank=<n> to the script"),
    ("python3 -m torch.distributed.launch --nproc_per_node=2 {s} --epochs 2", "unrecognized arguments: --local-rank"),
    ("python -mtorch.distributed.launch --nproc-per-node=2 {s}", "passes --local-rank=<n> to the script"),
    ("nice python {s}", "the command starts 'python', not torchrun"),
    # from a review that tried to fool the wrappers: what coreutils and bash refuse, said as they say it (the real
    # nohup, nice and stdbuf read their options, kept to the stand-ins)
    ("exec torchrun --nproc-per-node=2 {s} &", "the command ends in &, which runs the launch in the background"),
    ("{{ torchrun --nproc-per-node=2 {s}; }} &", "the command ends in &, which runs the launch in the background"),
    ("exec nohup torchrun --nproc-per-node=2 {s} &", "the command ends in &"),
    ("stdbuf torchrun --nproc-per-node=2 {s}", "(stdbuf: you must specify a buffering mode option)"),
    ("stdbuf -oX torchrun --nproc-per-node=2 {s}", "(stdbuf: invalid mode 'X')"),
    ("nice -n x torchrun --nproc-per-node=2 {s}", "(nice: invalid adjustment 'x')"),
    ("nice 10 torchrun --nproc-per-node=2 {s}", "(nice: '10': No such file or directory)"),
    ("nice FOO=1 torchrun --nproc-per-node=2 {s}", "(nice: 'FOO=1': No such file or directory)"),
    ("nohup banana torchrun --nproc-per-node=2 {s}", "(nohup: failed to run command 'banana'"),
    ("nice exec torchrun --nproc-per-node=2 {s}", "(nice: 'exec': No such file or directory)"),
    ("nice /usr/bin/torchrun --nproc-per-node=2 {s}", "started no torchrun: it runs /usr/bin/torchrun by its path"),
    ("exec command torchrun --nproc-per-node=2 {s}", "(bash: exec: command: not found)"),
    ("python -h -m torch.distributed.run --nproc-per-node=2 {s}", "the command starts 'python', not torchrun"),
    ("python --version -mtorch.distributed.run --nproc-per-node=2 {s}", "the command starts 'python', not torchrun"),
    ("python -mtorch.distributed.run", "the following arguments are required: training_script"),
    # a second review: & whatever the launch's stdin (bash's own $! says it ran one), and what bash and python refuse
    ("(torchrun --nproc-per-node=2 {s}) &", "the command ends in &"),
    ("torchrun --nproc-per-node=2 {s} < /dev/zero &", "the command ends in &"),
    ("{{ torchrun --nproc-per-node=2 {s}; }} < /dev/zero &", "the command ends in &"),
    ("exec -x torchrun --nproc-per-node=2 {s}", "(bash: exec: -x: invalid option)"),
    ("nice -n=5 torchrun --nproc-per-node=2 {s}", "(nice: invalid adjustment '=5')"),
    ("stdbuf -o=L torchrun --nproc-per-node=2 {s}", "(stdbuf: invalid mode '=L')"),
    ("python -z -m torch.distributed.run --nproc-per-node=2 {s}", "the command starts 'python', not torchrun"),
    ("python --check-hash-based-pycs=always -m torch.distributed.run --nproc-per-node=2 {s}",
     "the command starts 'python', not torchrun"),
    # a third review: the loader's variables would load a library the line names into the check's own programs
    ("LD_PRELOAD=/nonexistent/x.so torchrun --nproc-per-node=2 {s}", "the command sets LD_PRELOAD, which makes"),
    ("export LD_LIBRARY_PATH=/nonexistent; torchrun --nproc-per-node=2 {s}", "the command sets LD_LIBRARY_PATH"),
    ("env LD_AUDIT=/nonexistent/x.so torchrun --nproc-per-node=2 {s}", "the command sets LD_AUDIT, which makes"),
    ("srun GCONV_PATH=/nonexistent torchrun --nproc-per-node=2 {s}", "the command sets GCONV_PATH, which"),
    # python starts one process, with none of torchrun's variables: said before anything starts
    ("python {s}", "the command starts 'python', not torchrun"),
    ("python3 -u {s} --epochs 2", "the command starts 'python3', not torchrun"),
    # a cd into a folder that does not exist fails, and what follows its && never runs
    ("cd /nonexistent && torchrun --nproc-per-node=2 {s}",
     "started no torchrun (cd: /nonexistent: No such file or directory)."),
    # the check's shell takes no redirection of output: said so, not "started no torchrun"
    ("torchrun --nproc-per-node=2 {s} > log.txt", "the command redirects output (log.txt), which the check's shell "
                                                  "does not take"),
    ("torchrun --nproc-per-node=2 {s} 2>/dev/null", "the command redirects output (/dev/null)"),
    ("torchrun --nproc-per-node=2 {s} >> log", "the command redirects output (log)"),
    # a loop that never ends is named by the limit it met; the check's own folders are not shown
    ("while :; do :; done; torchrun --nproc-per-node=2 {s}", "(it ran on until its trace filled the check's 1 MiB"),
    ("torchrun --nproc-per-node=2 {s} < ~+/missing", "/missing: No such file or directory)"),  # ~+: this folder
    # a fourth review: nothing the line does turns off the trace or the & it ends with (the builtins that change
    # what runs around a launch are off and named; PS4, BASH_XTRACEFD and the check's functions readonly), eval's
    # commands are traced too, and a single & typed for && is named as that
    ("set +x; torchrun --nproc-per-node=2 {s}; echo hi", "the command runs set +x, which the check's shell leaves out"),
    ("torchrun --nproc-per-node=2 {s}; shopt -uo xtrace; echo hi", "the command runs shopt"),
    ("eval 'builtin set +x'; torchrun --nproc-per-node=2 {s}; echo hi", "the command runs set"),
    ("set -e; false; torchrun --nproc-per-node=2 {s}", "bash ran the line and it started no torchrun."),  # as in bash
    ("trap 'echo hi' EXIT; torchrun --nproc-per-node=2 {s}", "the command runs trap"),
    ("kill -9 0; torchrun --nproc-per-node=2 {s}", "the command runs kill"),
    ("ulimit -t 1; torchrun --nproc-per-node=2 {s}", "the command runs ulimit"),
    ("hash -p /bin/rm torchrun; torchrun --nproc-per-node=2 {s}", "the command runs hash"),
    ("enable -f /nonexistent/x.so x; torchrun --nproc-per-node=2 {s}", "the command runs enable"),
    ("PS4=; torchrun --nproc-per-node=2 {s}; echo hi", "started no torchrun (PS4: readonly variable)"),
    ("BASH_XTRACEFD=1; torchrun --nproc-per-node=2 {s}; echo hi", "(BASH_XTRACEFD: readonly variable)"),
    ("lab_end() {{ :; }}; torchrun --nproc-per-node=2 {s} < /dev/zero &", "the command ends in &"),
    ("eval 'torchrun --nproc-per-node=2 {s}; echo hi'", "chains a second command to the launch (echo hi);"),
    ("g() {{ eval 'torchrun --nproc-per-node=2 {s} && echo hi'; }}; g", "to the launch (echo hi);"),
    ("torchrun --nproc-per-node=2 {s} && cd /", "to the launch (cd /);"),  # not the check's own cd inside
    ("module load gcc & torchrun --nproc-per-node=2 {s}", "has a single &, which runs a command beside the launch"),
    ("module load gcc & (torchrun --nproc-per-node=2 {s})", "has a single &, which runs a command beside"),
    # srun's options read as Slurm reads them: more than one task is more than one torchrun
    ("srun --ntasks=2 torchrun --nproc-per-node=2 {s}", "srun would start 2 tasks, each a torchrun of its own"),
    ("srun -N 2 torchrun --nproc-per-node=2 {s}", "srun would start 2 tasks"),
    ("SLURM_NTASKS=2 srun torchrun --nproc-per-node=2 {s}", "srun would start 2 tasks"),
    ("srun --nt=2 torchrun --nproc-per-node=2 {s}", "srun would stop at once: option '--nt=2' is ambiguous"),
    # torchrun reads its PET_ variables as options; the line's PATH and loader variables, however set, are named
    ("PET_NNODES=2 torchrun --nproc-per-node=2 {s}", "torchrun would run with --nnodes=2;"),
    ("env PET_NO_PYTHON=1 torchrun --nproc-per-node=2 {s}", "with --no-python, torchrun would run your script"),
    ("export PATH=/nonexistent; torchrun --nproc-per-node=2 {s}", "the command sets PATH: bash would look"),
    ("declare -x LD_PRELOAD=/nonexistent/x.so; torchrun --nproc-per-node=2 {s}", "the command sets LD_PRELOAD"),
    ("exec 3>/nonexistent/o; torchrun --nproc-per-node=2 {s}", "the command redirects file descriptor 3"),
    ("exec >/nonexistent/o; torchrun --nproc-per-node=2 {s}", "the command redirects output (/nonexistent/o)"),
    # a fifth review: the trace goes to a descriptor of its own, so a redirected stderr hides nothing
    ("{{ torchrun --nproc-per-node=2 {s}; echo hi; }} 2>&1", "chains a second command to the launch (echo hi);"),
    ("eval 'torchrun --nproc-per-node=2 {s}; echo hi' 2>&-", "chains a second command to the launch (echo hi);"),
    ("{{ set -o noexec; }} 2>&1; torchrun --nproc-per-node=2 {s}", "the command runs set"),
    ("{{ export LD_PRELOAD=/nonexistent/x.so; }} 2>&-; torchrun --nproc-per-node=2 {s}", "the command sets LD_PRELOAD"),
    ("{{ torchrun --nproc-per-node=2 {s}; echo hi; }} 9>&-", "the command redirects file descriptor 9, which the"),
    # the trace's own descriptor (the lowest free one: 3 here) pointed elsewhere for a group hides the group's
    # commands and moves nothing bash would tell: only the text's check of N> sees it
    ("{{ torchrun --nproc-per-node=2 {s}; echo hi; }} 3>&1", "the command redirects file descriptor 3, which the"),
    ("{{ torchrun --nproc-per-node=2 {s}; echo hi; }} 3</dev/null", "the command redirects file descriptor 3"),
    ("BASH_CMDS[torchrun]=/bin/echo; torchrun --nproc-per-node=2 {s}", "(BASH_CMDS: readonly variable)"),
    ("PATH=/nonexistent torchrun --nproc-per-node=2 {s}", "the command sets PATH: bash would look for torchrun"),
    ("SLURM_NPROCS=2 srun torchrun --nproc-per-node=2 {s}", "srun would start 2 tasks"),
    ("torchrun --local-addr=192.0.2.1 --nproc-per-node=2 {s}", "--local-addr=192.0.2.1 is no address of this"),
    # a sixth review: the text bash joins (a backslash-newline) is what the checks read; srun's other ways to start
    # several tasks; a loader variable env refuses is named as one
    ("exec 3\\\n>&-; torchrun --nproc-per-node=2 {s}; kill -9 0", "the command redirects file descriptor 3"),
    ("exec {{\\\nx}}>&-; torchrun --nproc-per-node=2 {s}", "the command holds {x} as written"),
    ("srun -n1 torchrun --nproc-per-node=2 {s} : -n1 torchrun --nproc-per-node=2 {s}", "a step of several compon"),
    ("srun --het-group=0,1 torchrun --nproc-per-node=2 {s}", "a step of several components"),
    ("srun --gpus=2 --gpus-per-task=1 torchrun --nproc-per-node=2 {s}", "srun would start 2 tasks"),
    ("srun --ntasks-per-gpu=1 --gpus=2 torchrun --nproc-per-node=2 {s}", "srun would start 2 tasks"),
    ("srun -w node[1-2] torchrun --nproc-per-node=2 {s}", "srun would start 2 tasks"),
    ("env LD_PRELOAD=/nonexistent/x.so torchrun --nproc-per-node=2 {s}", "the command sets LD_PRELOAD, which"),
    # a review of lines a room types: set's other words, and each mistake named as the attendee made it
    ("command set -o noexec; torchrun --nproc-per-node=2 {s}", "the command runs set -o noexec, which the check's"),
    ("set -a; torchrun --nproc-per-node=2 {s}", "the command runs set -a, which"),
    ("mkdir -p logs && torchrun --nproc-per-node=2 {s}", "started no torchrun: mkdir is none of what a launch line"),
    ("./bin/torchrun --nproc-per-node=2 {s}", "started no torchrun: it runs ./bin/torchrun by its path"),
    ("'torchrun --nproc-per-node=2 {s}'", "it took the whole line, in quotes, as the name of one command"),
    ("$ torchrun --nproc-per-node=2 {s}", "the command holds a prompt in front (its $, % or >), which is no part"),
    ("(venv) user@host:~$ torchrun --nproc-per-node=2 {s}", "the command holds a prompt in front"),
    ("```torchrun --nproc-per-node=2 {s}```", "the command holds Markdown's backticks around it"),
    ("torchrun \u2013\u2013nproc-per-node=2 {s}", "the command holds typographic dashes"),
    ("torchrun --nproc-per-node=2 {s}\u3000", "the command holds a non-breaking or another typographic space"),
    ("torchrun --nproc-per-node=2 {s}\x0c", "torchrun would run"),  # bash strips no form feed: a letter of the name
    ("`torchrun --nproc-per-node=2 {s}`", "the command holds Markdown's backticks around it"),
    ("torchrun --nproc-per-node=2 \u201c{s}\u201d", "the command holds typographic quotes"),
    ("torchrun\xa0--nproc-per-node=2 {s}", "the command holds a non-breaking or another typographic space"),
    ("source /nonexistent/bin/activate && torchrun --nproc-per-node=2 {s}", "(bash: /nonexistent/bin/activate: No "),
    # a fool-it review of the above: set past -- is set, a name alone is a positional parameter; cd and pushd as
    # bash's; an escaped quote hides no redirection; a background loop in a subshell, a node list srun refuses
    ("command -- set +x; torchrun --nproc-per-node=2 {s}; echo hi", "the command runs set +x, which"),
    ("builtin -- set -a; torchrun --nproc-per-node=2 {s}", "the command runs set -a, which"),
    ("set pipefail; torchrun --nproc-per-node=2 {s}", "the command runs set pipefail, which"),
    ("set -e; pushd; torchrun --nproc-per-node=2 {s}", "started no torchrun (pushd: no other directory)"),
    ("cd / extra && torchrun --nproc-per-node=2 {s}", "started no torchrun (cd: too many arguments)"),
    (": \\' ; {{ torchrun --nproc-per-node=2 {s}; echo hi; }} 3</dev/null # '", "redirects file descriptor 3"),
    ("(while :; do :; done &); torchrun --nproc-per-node=2 {s}", "has a single &, which runs a command beside"),
    ("(torchrun --nproc-per-node=2 {s} <&0 &)", "the command runs the launch with &, in the background"),
    # a bash forked in the background to start a stand-in, or waiting for one, is waited for: the same verdict on a
    # busy machine
    ("( {{ torchrun --nproc-per-node=2 {s}; torchrun --nproc-per-node=2 {s}; }} & )", "runs the launch with &, in"),
    # a fool-it review of that: the launch in a list, a group, a subshell, a function, eval, exec or a tool run with &
    # inside a subshell, which bash starts with /dev/null as its input but SIGINT at its default
    ("(cd / && torchrun --nproc-per-node=2 {s} &)", "the command runs the launch with &, in the background"),
    ("({{ torchrun --nproc-per-node=2 {s}; }} &)", "the command runs the launch with &, in the background"),
    ("( (torchrun --nproc-per-node=2 {s}) & )", "the command runs the launch with &, in the background"),
    ("(if :; then torchrun --nproc-per-node=2 {s}; fi &)", "the command runs the launch with &, in the background"),
    ("(time torchrun --nproc-per-node=2 {s} &)", "the command runs the launch with &, in the background"),
    ("(eval 'torchrun --nproc-per-node=2 {s}' &)", "the command runs the launch with &, in the background"),
    ("(exec torchrun --nproc-per-node=2 {s} &)", "the command runs the launch with &, in the background"),
    ("g() {{ torchrun --nproc-per-node=2 {s}; }}; (g &)", "the command runs the launch with &, in the background"),
    ("(timeout 10 torchrun --nproc-per-node=2 {s} &)", "the command runs the launch with &, in the background"),
    ("( (timeout 10 srun torchrun --nproc-per-node=2 {s}) & )", "the command runs the launch with &, in the"),
    # a second fool-it review: whatever input the launch then gets, the shell bash forks for a list, a group or a
    # subshell run with & ignores SIGINT
    # a room's lines: errors sent to the output before it goes to a file, which bash refuses there
    ("torchrun --nproc-per-node 2 {s} 2>&1 > out.txt", "the command redirects output (out.txt)"),
    ("torchrun --nproc-per-node=2 {s} 2>&1 >> train.log", "the command redirects output (train.log)"),
    ("(cd / && torchrun --nproc-per-node=2 {s} < /dev/null &)", "the command runs the launch with &, in the"),
    ("(cd / && nohup torchrun --nproc-per-node=2 {s} < /dev/null &)", "the command runs the launch with &, in the"),
    ("(cd / && torchrun --nproc-per-node=2 {s} &) < /dev/null", "the command runs the launch with &, in the"),
    ("(cd / && torchrun --nproc-per-node=2 {s} &) # not /dev/null", "the command runs the launch with &, in the"),
    ("( {{ torchrun --nproc-per-node=2 {s}; }} <&0 & )", "the command runs the launch with &, in the background"),
    ("srun --nodelist='n[a-b]' torchrun --nproc-per-node=2 {s}", "srun would stop at once: n[a-b] is no list of"),
    ("srun --nodelist='n[0-999999999]' torchrun --nproc-per-node=2 {s}", "srun would start 2 tasks"),
    ("env -i torchrun --nproc-per-node=2 {s}", "(env: -i: the check's env takes NAME=value and -u NAME alone)"),
    ("env PATH=/nonexistent torchrun --nproc-per-node=2 {s}", "(env: PATH=/nonexistent: leaves the launch no PATH"),
    # a second fool-it review: a program the check's shell does not run is named, however it comes before the launch
    ("touch /nonexistent/x; torchrun --nproc-per-node=2 {s}", "the command runs touch beside the launch: touch is"),
    ("srun /usr/bin/touch /nonexistent/x; torchrun --nproc-per-node=2 {s}", "which starts no torchrun: the check"),
    ("env rm -f /nonexistent/x; torchrun --nproc-per-node=2 {s}", "the command runs env rm -f /nonexistent/x, which"),
    ("no-such-tool; torchrun --nproc-per-node=2 {s}", "runs no-such-tool beside the launch: no-such-tool is none"),
    ("torchrun --nproc-per-node=2 {s}/", "the script's path ends in / ("),
    ("torchrun --nproc-per-node=2 {s} 1>&-", "the command closes the launch's output or its errors (>&-)"),
    ("python /nonexistent/other.py & torchrun --nproc-per-node=2 {s}", "has a single &, which runs a command beside"),
    ("[user@host ~]$ torchrun --nproc-per-node=2 {s}", "the command holds a prompt in front"),
    ("> torchrun --nproc-per-node=2 {s}", "the command holds a prompt in front"),
    ("torchrun --nproc-per-node=2 {s}\r", "the command holds a carriage return"),
    ("%%bash\ntorchrun --nproc-per-node=2 {s}", "the command holds a Jupyter magic in front"),
    ("# torchrun --nproc-per-node=2 {s}", "the command holds a # in front, which makes the whole line a comment"),
    ("torchrun \u2212\u2212nproc-per-node=2 {s}", "the command holds typographic dashes"),
    ("conda run -n base torchrun --nproc-per-node=2 {s}", "the command runs conda run: the check's conda only"),
    ("env -C /tmp torchrun --nproc-per-node=2 {s}", "(env: -C: the check's env takes NAME=value and -u NAME alone)"),
    ("srun --chdir=/tmp torchrun --nproc-per-node=2 {s}", "srun --chdir=/tmp changes where the launch runs"),
    # a third fool-it review: what is no part of a launch line is read from the trace, whatever the line did with
    # its errors; what a tool ran that was no launch; srun's options as Slurm reads them; PYTHON_EXEC; exec alone
    ("rm -rf /nonexistent/x 2>&-; torchrun --nproc-per-node=2 {s}", "the command runs rm beside the launch: rm is"),
    ("{{ git pull; }} 2>&1; torchrun --nproc-per-node=2 {s}", "the command runs git beside the launch"),
    ("[[ -v LAB_CD ]] && torchrun --nproc-per-node=2 {s}", "the command runs [[ beside"),
    ("command_not_found_handle() {{ torchrun --nproc-per-node=2 {s}; }}; git pull", "the command runs git beside"),
    ("timeout 5 rm -rf /nonexistent/x 2>&-; torchrun --nproc-per-node=2 {s}", "runs timeout 5 rm -rf /nonexistent/x,"),
    ("env --split='rm -rf /nonexistent/x' torchrun --nproc-per-node=2 {s}", "(env: --split=rm -rf /nonexistent/x: the"),
    ("env -vi torchrun --nproc-per-node=2 {s}", "(env: -vi: the check's env takes NAME=value and -u NAME alone)"),
    ("PET_NPROC_PER_NODE=2 srun -J torchrun {s}", "srun would run '"),
    ("srun --export=ALL,LD_PRELOAD=/nonexistent/x.so torchrun --nproc-per-node=2 {s}", "srun --export=ALL,LD_PRE"),
    ("srun --export=NONE torchrun --nproc-per-node=2 {s}", "srun --export=NONE changes where the launch runs"),
    ("srun --chd=/ torchrun --nproc-per-node=2 {s}", "srun --chdir=/ changes where the launch runs"),
    ("srun -o out.log torchrun --nproc-per-node=2 {s}", "srun --output=out.log changes where the launch"),
    ("conda install -y numpy; torchrun --nproc-per-node=2 {s}", "the command runs conda install: the check's conda"),
    ("PYTHON_EXEC=/usr/bin/true torchrun --nproc-per-node=2 {s}", "sets PYTHON_EXEC=/usr/bin/true, which torchrun"),
    ("exec >&-; torchrun --nproc-per-node=2 {s}", "the command runs exec, which changes what the line's commands"),
    ("exec -c torchrun --nproc-per-node=2 {s}", "the command runs exec -c, which changes what the line's"),
    # a fourth fool-it review: FUNCNAME readonly (the trace names a function by it); exec, builtin and command run
    # the next word, past the line's functions; source of what is no file; unset PATH; srun's prologs and dry runs
    ("unset FUNCNAME; FUNCNAME=cd; rm -rf /nonexistent/v; torchrun --nproc-per-node=2 {s}", "FUNCNAME: cannot unset"),
    ("(exec rm -rf /nonexistent/v); torchrun --nproc-per-node=2 {s}", "the command runs rm beside the launch"),
    ("builtin exec rm -rf /nonexistent/v; torchrun --nproc-per-node=2 {s}", "the command runs rm beside the launch"),
    ("rm() {{ command rm -rf /nonexistent/v; }}; rm; torchrun --nproc-per-node=2 {s}", "the command runs rm beside"),
    ("source /dev/stdin <<< 'rm -rf /nonexistent/v'; torchrun --nproc-per-node=2 {s}", "runs source /dev/stdin: the"),
    ("builtin cd /tmp; torchrun --nproc-per-node=2 {s}", "the command runs cd beside the launch"),
    ("unset PATH; torchrun --nproc-per-node=2 {s}", "the command sets PATH"),
    ("srun --prolog=/nonexistent/x.sh torchrun --nproc-per-node=2 {s}", "srun --prolog=/nonexistent/x.sh changes"),
    ("srun --test-only torchrun --nproc-per-node=2 {s}", "srun --test-only changes where the launch runs"),
    ("command -p rm -rf /nonexistent/v; torchrun --nproc-per-node=2 {s}", "the command runs rm beside the launch"),
    ("srun --ntasks=1 bash -c 'torchrun --nproc-per-node=2 {s}'", "which starts no torchrun: the check runs nothing"),
    # a fifth: what only the check's shell holds is not asked (declare -F, -p); a variable is set plainly; a failed
    # source ends the line; >&N and <&N- copy or move a descriptor too
    ("declare -F lab_end && torchrun --nproc-per-node=2 {s}", "runs declare -F lab_end, which"),
    ("printf -v LAB_CD /tmp && torchrun --nproc-per-node=2 {s}", "the command runs printf -v LAB_CD, which asks"),
    ("declare -i x=1/2 && torchrun --nproc-per-node=2 {s}", "the command runs declare -i x=1/2, which asks"),
    ("LAB_CD=/tmp torchrun --nproc-per-node=2 {s}", "the command sets LAB_CD, which the check's shell keeps"),
    ("source nosuch_zz; torchrun --nproc-per-node=2 {s}", "(bash: nosuch_zz: No such file"),
    # a sixth: || runs what follows where the command before fails, which the check's shell cannot tell; what it
    # keeps readonly is not set; a link loop is named
    ("conda activate base || touch /nonexistent/p; torchrun --nproc-per-node=2 {s}", "the command has ||, which runs"),
    ("export SHELL=/bin/bash && touch /nonexistent/p; torchrun --nproc-per-node=2 {s}", "sets SHELL, which the"),
    ("unset -f cd && touch /nonexistent/p; torchrun --nproc-per-node=2 {s}", "the command sets cd, which the check's"),
    ("source //dev/stdin && torchrun --nproc-per-node=2 {s}", "the command runs source //dev/stdin: the commands"),
    ("( {{ torchrun --nproc-per-node=2 {s}; echo hi; }} 2<&- <&3- )", "the command redirects file descriptor 3"),
    ("torchrun {s} --nproc_per_node 2", "torchrun reads its options before the script: --nproc_per_node comes after"),
    ("torchrun --nproc-per-node=2 {s} & wait", "the command runs the launch with &, in the background"),
    ("srun -n 2 python {s}", "the command starts 'python', not torchrun"),
    ("torchrun --nproc-per-node=2 \"~/my_train_ddp.py\"", "(bash puts the home folder for a ~ only unquoted"),
    ("torchrun --nnodes=1:2 --nproc-per-node=2 {s}", "torchrun would run with --nnodes=1:2; the lab runs"),
    ("python -c 'import torch' && torchrun --nproc-per-node=2 {s}", "runs python -c 'import torch' before the launch"),
])
def test_wrong_launch_lines_are_named(tmp_path, command, message):
    script = tmp_path / "my_train_ddp.py"
    with pytest.raises(NotYet, match=re.escape(message)) as caught:
        read_launch_line(command.format(s=script), script, 2, LAB_EXERCISE)
    assert "\n" not in str(caught.value) and " Fix: " in str(caught.value)


def test_a_builtin_a_subshell_leaves_beside_the_launch_gets_one_verdict_on_a_busy_machine(tmp_path):
    """`(echo hi &)` leaves a shell nothing waits for: its trace landed before or after the launch's as the machine
    scheduled it, and the line was accepted or refused (a fool-it review: 26 and 1). The launch now waits for it."""
    script = tmp_path / "my_train_ddp.py"
    burners = []  # the first tries on an idle machine, where the old race lost about one in ten; then a busy one
    try:
        for attempt in range(16):
            if attempt == 10:
                burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
            assert read_launch_line(f"(echo hi &); torchrun --nproc-per-node=2 {script}", script, 2).script_args == []
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    with pytest.raises(NotYet, match=re.escape("chains a second command to the launch (echo hi)")):
        read_launch_line(f"torchrun --nproc-per-node=2 {script}; (echo hi &)", script, 2)


@pytest.mark.slow  # the chain runs until the check's limit, twice
def test_nothing_the_line_started_outlives_the_check(tmp_path, monkeypatch):
    """A chain of background shells, each starting the next and ending before a look at the processes lists it, is
    stopped with the line's bash: nothing of the line runs on after the check."""
    monkeypatch.setattr(ddp_lab_bash, "LINE_TIMEOUT_S", 3)  # the chain's 2,000 links would run 100 s
    script = tmp_path / "my_train_ddp.py"
    chain = (f"w() {{ ((n++ < 2000)) && {{ read -t 0.05 x < /dev/zero; w & }} }}; (w &); "  # 50 ms a link
             f"torchrun --nproc-per-node=2 {script}")
    with pytest.raises(NotYet):
        read_launch_line(chain, script, 2, LAB_EXERCISE)
    time.sleep(0.5)  # a SIGKILL takes a moment to land
    assert not [p.pid for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or ())
                and p.status() != psutil.STATUS_ZOMBIE]


def test_the_line_runs_in_bash_with_stand_ins_alone(tmp_path):
    """bash runs the line, restricted, with recording stand-ins alone on PATH: no kill, no command named by its
    path (an interpreter so named, other than the kernel's own Python and torchrun, is refused as such), nothing else
    the line names runs."""
    script, kept = tmp_path / "my_train_ddp.py", tmp_path / "kept.txt"
    kept.write_text("kept")
    for line, words in ((f"torchrun --nproc-per-node=2 {script} && rm -f {kept}", "to the launch (rm -f"),
                        (f"kill -0 {os.getpid()} && torchrun --nproc-per-node=2 {script}", "the command runs kill"),
                        (f"/opt/another/python3 -m torch.distributed.run --nproc-per-node=2 {script}",
                         "it runs /opt/another/python3 by its path"),
                        (f"python -c 'open(\"{kept}\", \"w\")'", "the command starts 'python', not torchrun")):
        with pytest.raises(NotYet, match=re.escape(words)):
            read_launch_line(line, script, 2, LAB_EXERCISE)
    with pytest.raises(NotYet, match="the command runs /usr/bin/rm beside the launch, by its path"):
        read_launch_line(f"/usr/bin/rm -f {kept}; torchrun --nproc-per-node=2 {script}", script, 2)
    assert kept.read_text() == "kept"
    with pytest.raises(NotYet, match="started no torchrun"):  # a loop's output stops it at bash's file limit
        read_launch_line(f"while :; do echo {'x' * 100}; done; torchrun --nproc-per-node=2 {script}", script, 2)


@pytest.mark.parametrize("line", [
    # the stand-ins' folders are written into them: a LAB_TOOLS set by the line names no real program
    "env LAB_TOOLS=/usr/bin touch {made}",
    "LAB_TOOLS=/usr/bin nohup touch {made}",
    "LAB_TOOLS=/usr/bin srun touch {made}",
    "env LAB_TOOLS=/usr/bin rm {kept}",
    # the stand-ins' bash (-p) reads no BASH_ENV, SHELLOPTS or exported function, and env exports none of them
    "env BASH_ENV=/dev/stdin torchrun --nproc-per-node=2 {s} <<< '/usr/bin/touch {made}'",
    "nohup env BASH_ENV=/dev/stdin torchrun --nproc-per-node=2 {s} <<< '/usr/bin/touch {made}'",
    "env SHELLOPTS=xtrace BASH_ENV={evil} torchrun --nproc-per-node=2 {s}",
    "trap() {{ /usr/bin/touch {made}; }}; export -f trap; torchrun --nproc-per-node=2 {s}",
    # nor does a LAB_RECORD or a LAB_EXIT set by the line move the record or the exit code
    "LAB_RECORD={d} torchrun --nproc-per-node=2 {s}",
    "LAB_EXIT=0 torchrun --nproc-per-node=2 {s} || /usr/bin/touch {made}",
])
def test_nothing_the_line_sets_lets_it_run_a_program_or_write_a_file(tmp_path, line):
    script, made, kept, evil = (tmp_path / name for name in ("my_train_ddp.py", "made", "kept.txt", "evil.sh"))
    kept.write_text("kept")
    evil.write_text(f"/usr/bin/touch {made}\n")
    try:
        read_launch_line(line.format(s=script, made=made, kept=kept, evil=evil, d=tmp_path), script, 2)
    except NotYet as refused:
        assert "\n" not in str(refused) and "the check itself failed" not in str(refused), str(refused)
    assert not made.exists() and kept.read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.sh", "kept.txt"], "no record written here"


def _running(marker: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline", "status"]) if p.info["status"] != psutil.STATUS_ZOMBIE
            and any(marker in word for word in p.info["cmdline"] or [])]


BUSY = "[[ " + "a" * 40 + "b == *(a|aa)*(a|aa)c ]]"  # minutes of one bash on a CPU, traced once: no output


@pytest.mark.parametrize("line, verdict", [
    # the busy command in the background keeps the launch waiting until the time is up: the shell, and it, are ended
    (f"{{{{ {BUSY} & }}}}; torchrun --nproc-per-node=2 {{s}}", "line did not end within 2 s, though"),
    # set -m (a process group of its own) and trap are off in the check's shell: the same
    (f"set -m; {{{{ {BUSY} & }}}}; torchrun --nproc-per-node=2 {{s}}", "line did not end within 2 s, though"),
    (f"trap - DEBUG EXIT; {{{{ {BUSY} & }}}}; disown -a; torchrun --nproc-per-node=2 {{s}}", "did not end within 2"),
    # a wait of the line's own: the shell ends at once, what it left behind is ended with it
    (f"wait() {{{{ :; }}}}; {{{{ {BUSY} & }}}}; disown -a; torchrun --nproc-per-node=2 {{s}}", "✗ Exercise 2.2: the"),
])
def test_nothing_the_line_starts_outlives_the_check(tmp_path, monkeypatch, line, verdict):
    monkeypatch.setattr(ddp_lab_bash, "LINE_TIMEOUT_S", 2)
    script, marker = tmp_path / "my_train_ddp.py", f"# left-behind-{os.getpid()}-{len(line)}"
    try:
        read_launch_line(f"{line.format(s=script)} {marker}", script, 2)
        said = "accepted"
    except NotYet as refused:
        said = str(refused)
    assert (verdict or "accepted") in said and "\n" not in said, said
    assert not _running(marker)


def test_a_line_that_takes_more_memory_than_any_launch_line_stops_at_once(tmp_path, monkeypatch):
    """256 MiB at most: the brace expansion fails in bash's words, long before the time is up."""
    monkeypatch.setattr(ddp_lab_bash, "LINE_TIMEOUT_S", 120)
    script = tmp_path / "my_train_ddp.py"
    with pytest.raises(NotYet, match=r"started no torchrun \(.*cannot allocate") as caught:
        read_launch_line(f"x=( {{1..5000000}} ); torchrun --nproc-per-node=2 {script}", script, 2)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("line, words", [
    ("torchrun --nproc-per-node=2 \0{s}", "the command holds a NUL byte"),
    ("torchrun --nproc-per-node=2 {s} " + "x" * 2_100_000, "the command is 2,100,"),
    ("torchrun --nproc-per-node=2 {s} '\ud800'", "the command holds the character '\\ud800'"),
], ids=["NUL", "over 2 MB", "lone surrogate"])
def test_a_line_no_shell_takes_gets_one_line(tmp_path, line, words):
    script = tmp_path / "my_train_ddp.py"
    with pytest.raises(NotYet, match=re.escape(words)) as caught:
        read_launch_line(line.format(s=script), script, 2)
    assert "\n" not in str(caught.value) and "the check itself failed" not in str(caught.value)


@pytest.mark.parametrize("sigint", [signal.SIG_IGN, signal.default_int_handler], ids=["ignored", "handled"])
def test_a_background_launch_is_told_apart_however_the_kit_was_started(tmp_path, sigint):
    """A kernel or a test run started with & in a script inherits SIGINT ignored: still `< /dev/null` is a launch in
    the foreground and `&` one in the background."""
    script, was = tmp_path / "my_train_ddp.py", signal.signal(signal.SIGINT, sigint)
    try:
        assert read_launch_line(f"torchrun --nproc-per-node=2 {script} < /dev/null", script, 2).script_args == []
        with pytest.raises(NotYet, match="ends in &"):
            read_launch_line(f"torchrun --nproc-per-node=2 {script} &", script, 2)
    finally:
        signal.signal(signal.SIGINT, was)


def test_odd_bytes_from_the_line_or_the_lab_folder_are_read_back_as_they_went(tmp_path):
    """A folder name that is not UTF-8 reaches Python as surrogates and is launched as it is; a record cut off by
    the line's own ulimit is no launch, not a crash."""
    script = tmp_path / "lab\udcff" / "my_train_ddp.py"
    assert read_launch_line(f"torchrun --nproc-per-node=2 {shlex.quote(str(script))}", script, 2).script_args == []
    with pytest.raises(NotYet) as caught:
        read_launch_line(f"set +x; ulimit -f 0; torchrun --nproc-per-node=2 {script}", script, 2)
    assert "\n" not in str(caught.value) and "the check itself failed" not in str(caught.value)


def test_a_run_that_ended_and_is_refused_leaves_no_check_folder(tmp_path, monkeypatch):
    """Its findings point into no file there; a crash's folder (the ranks' output) is kept."""
    script = wu.solve_ddp_lab(tmp_path / "my_train_ddp.py", LAB)

    def ran(script, workdir, *args, **kwargs):
        folder = workdir / "check"
        (folder / "out").mkdir(parents=True)
        return [{}], [[]], folder / "out", folder, [], 1.0, (2, 1)

    monkeypatch.setattr(ddp_lab, "_lab_records", ran)
    monkeypatch.setattr(ddp_lab, "findings", lambda *args: [NotYet("✗ Exercise 2.2: a mistake.", "fix it.")])
    with pytest.raises(NotYet, match="a mistake"):
        wu.check_ddp_lab(script, tmp_path, echo=False)
    assert not (tmp_path / "check").exists()


def test_a_list_whose_item_holds_the_whole_line_says_so(tmp_path):
    script = tmp_path / "my_train_ddp.py"
    with pytest.raises(NotYet, match=r"a list whose item 'torchrun --nproc-per-node=2 .* holds several words \(its "
                                     r"only item\).*Fix: give each word its own item") as caught:
        read_launch_line([f"torchrun --nproc-per-node=2 {script}"], script, 2, LAB_EXERCISE)
    assert "\n" not in str(caught.value)
    assert read_launch_line(["torchrun", "--nproc-per-node=2", script], script, 2).script_args == []


@pytest.mark.slow  # one Python process that imports torch
def test_the_lab_script_stops_on_the_argument_torch_distributed_launch_passes(tmp_path):
    """What the refusal says of the script, shown by the script itself (its own argparse, before any rank starts)."""
    import subprocess

    script = wu.solve_ddp_lab(tmp_path / "my_train_ddp.py", LAB)
    done = subprocess.run([sys.executable, str(script), "--local-rank=0"], capture_output=True, text=True)
    assert done.returncode == 2 and "unrecognized arguments: --local-rank=0" in done.stderr


# ---------------------------------------------------------------- Exercise 2.3 (no launch)


def by_hand(step_s, grad_bytes, p, latency_us, bandwidth_gbps, steps=None, latency_steps=None):
    """The no-overlap efficiency written out: one ring all-reduce per DDP bucket (1 MiB, then 25 MiB)."""
    buckets, left, cap = [], grad_bytes, 2**20
    while left > 0:
        buckets.append(min(cap, left))
        left -= buckets[-1]
        cap = 25 * 2**20
    steps = 2 * (p - 1) if steps is None else steps
    latency_steps = steps if latency_steps is None else latency_steps
    comm = sum(latency_steps * latency_us * 1e-6 + steps / p * b / (bandwidth_gbps * 1e9) for b in buckets)
    return step_s / (step_s + comm)


@pytest.mark.parametrize("step_s, grad_bytes", [(0.05, 4 * 11.2e6), (0.3, 4 * 120_000), (0.01, 4 * 25e6)])
def test_the_64_gpu_efficiency_passes_when_right_and_names_each_mistake(step_s, grad_bytes, capsys):
    ib, nvlink = wu.LINKS["ib_ndr"], wu.LINKS["nvlink4"]
    right = by_hand(step_s, grad_bytes, 64, ib.latency_us, ib.bandwidth_gbps)
    assert math.isclose(wu.check_ddp_efficiency(right, step_s, grad_bytes), right, rel_tol=1e-9)
    assert "✓ Exercise 2.3: correct" in capsys.readouterr().out
    mistakes = {
        "NVLink": by_hand(step_s, grad_bytes, 64, nvlink.latency_us, nvlink.bandwidth_gbps),
        "percentage": 100 * right,
        "2\\(p-1\\) steps": by_hand(step_s, grad_bytes, 64, ib.latency_us, ib.bandwidth_gbps, steps=63),
        # near the latency paid once per bucket, with a ResNet-18's gradients: named for what it is
        "a ring over one node's 8 GPUs": by_hand(step_s, grad_bytes, 8, ib.latency_us, ib.bandwidth_gbps),
        "latency once per bucket": by_hand(step_s, grad_bytes, 64, ib.latency_us, ib.bandwidth_gbps, latency_steps=1),
        "microseconds": by_hand(step_s, grad_bytes, 64, ib.latency_us * 1e6, ib.bandwidth_gbps),
        # Both leave an efficiency near 0, equal to many digits; the communication times they imply are not.
        "latency went in as seconds": by_hand(step_s, grad_bytes, 64, ib.latency_us * 1e6, ib.bandwidth_gbps),
        "bandwidth went in as bytes per second": by_hand(step_s, grad_bytes, 64, ib.latency_us,
                                                         ib.bandwidth_gbps / 1e9),
        "is not right": right * 0.5,
        "between 0 and 1": 1.5,
    }
    for name, value in mistakes.items():
        with pytest.raises(NotYet, match=name):
            wu.check_ddp_efficiency(value, step_s, grad_bytes)
    if grad_bytes > 2**20:  # more than one bucket: one message is a different answer
        one = step_s / (step_s + 2 * 63 * ib.latency_us * 1e-6 + 2 * 63 / 64 * grad_bytes / (ib.bandwidth_gbps * 1e9))
        with pytest.raises(NotYet, match="one message"):
            wu.check_ddp_efficiency(one, step_s, grad_bytes)
    assert wu.check_ddp_efficiency(..., step_s, grad_bytes) is False  # not yet solved: said, not raised


def test_a_number_two_mistakes_give_names_both_not_one_as_certain():
    """Two buckets, each paying the latency (p-1) times, pay what one message pays: either mistake may be it."""
    step_s, grad_bytes, ib = 0.005, 4 * 2_474_506, wu.LINKS["ib_ndr"]
    assert len(wu.ddp_buckets(grad_bytes)) == 2
    value = by_hand(step_s, grad_bytes, 64, ib.latency_us, ib.bandwidth_gbps, latency_steps=63)
    with pytest.raises(NotYet, match=r"which 2 mistakes give here: .*one message\. Or: .*latency \(p-1\) times"):
        wu.check_ddp_efficiency(value, step_s, grad_bytes)


def test_2_3_two_digits_off_by_a_rounding_slip_ask_for_more_not_a_mistake_and_bf16_holds_the_answer(capsys):
    """Right 0.9043: 0.91 is also the GiB/s mistake's two digits; a bf16 tensor of the right value reads 0.9062."""
    import torch

    step_s, grad_bytes = 0.0345, 4 * 11_173_962
    with pytest.raises(NotYet, match=r"= 0\.91 is off by less than one step of its last digit") as caught:
        wu.check_ddp_efficiency(0.91, step_s, grad_bytes)
    assert "GiB/s" not in str(caught.value)
    with pytest.raises(NotYet, match="latency \\(p-1\\) times"):  # a mistake two digits away is still named
        wu.check_ddp_efficiency(0.93, step_s, grad_bytes)
    right = wu.check_ddp_efficiency(0.9043, step_s, grad_bytes)
    for dtype in (torch.bfloat16, torch.float16):
        assert wu.check_ddp_efficiency(torch.tensor(right, dtype=dtype), step_s, grad_bytes) == right
    with pytest.raises(NotYet, match="0.9102 is not right"):  # another value in bf16 is still refused
        wu.check_ddp_efficiency(torch.tensor(0.91, dtype=torch.bfloat16), step_s, grad_bytes)


@pytest.mark.parametrize("step_s, grad_bytes", [(0.002, 2.4e6), (0.03, 2.4e6), (0.1, 2.4e6), (0.03, 44.8e6)])
def test_2_3_the_right_value_from_a_bf16_or_fp16_tensors_item_passes(step_s, grad_bytes):
    """The refusal of a tensor asks for its .item(): that of the right value held in bf16 or fp16 is the answer as
    those formats hold it (0.957 at a 30 ms step lands on the GiB/s mistake's value too, as 0.957 rounded does)."""
    import torch

    ib = wu.LINKS["ib_ndr"]
    right = by_hand(step_s, grad_bytes, 64, ib.latency_us, ib.bandwidth_gbps)
    for dtype in (torch.bfloat16, torch.float16):
        assert wu.check_ddp_efficiency(torch.tensor(right, dtype=dtype).item(), step_s, grad_bytes) == right


@pytest.mark.parametrize("step_s, grad_bytes, cut", [(0.05, 25e6, 0.95), (0.001, 2.4e6, 0.424), (0.1, 44.8e6, 0.964),
                                                     (0.1, 2.4e6, 0.986), (0.1, 4 * 120_000, 0.9935)])
def test_2_3_a_value_cut_off_within_its_last_digit_is_asked_for_rounded_not_called_wrong(step_s, grad_bytes, cut):
    """Right 0.42472: 0.42 passes, so 0.424 (a digit cut off) is no wrong answer either: it is asked for rounded."""
    ib = wu.LINKS["ib_ndr"]
    right = by_hand(step_s, grad_bytes, 64, ib.latency_us, ib.bandwidth_gbps)
    digits = len(str(cut)) - 2
    assert math.floor(right * 10**digits) / 10**digits == cut != round(right, digits)
    with pytest.raises(NotYet, match=rf"= {cut} is off by less than one step of its last digit: it is not the "
                                     rf"answer rounded to {digits} digits.*round\(efficiency_64, {digits}\)") as caught:
        wu.check_ddp_efficiency(cut, step_s, grad_bytes)
    assert "not right" not in str(caught.value) and "\n" not in str(caught.value)
    assert wu.check_ddp_efficiency(round(right, digits), step_s, grad_bytes) == right


def test_2_3_names_the_link_of_a_ring_inside_one_node_in_balanced_words(capsys):
    nvlink = wu.LINKS["nvlink4"]
    right = by_hand(0.05, 25e6, 8, nvlink.latency_us, nvlink.bandwidth_gbps)
    assert wu.check_ddp_efficiency(right, 0.05, 25e6, world_size=8) == right
    assert capsys.readouterr().out.rstrip().endswith("at 8 GPUs without overlap, over NVLink 4).")


@pytest.mark.parametrize("step_s", [2.0, 20.0])  # right 0.9965 and 0.99965: two digits, and bf16, hold them as 1
def test_2_3_an_efficiency_of_1_is_never_accepted_however_near_1_the_answer_is(step_s):
    """1 is the mistake of no all-reduce at all: near 1, the answer rounded to two digits (or held in bf16) is 1
    too, and is asked for with its decimals instead of passing; four decimals, below 1, pass."""
    import torch

    ib = wu.LINKS["ib_ndr"]
    right = by_hand(step_s, 1e8, 64, ib.latency_us, ib.bandwidth_gbps)
    held = torch.tensor(right, dtype=torch.bfloat16).item()
    assert held == (1 if step_s == 20 else 0.99609375)  # bf16's steps below 1 are 1/256
    for one in (1, 1.0, round(right, 2), *[held] * (held == 1)):
        with pytest.raises(NotYet, match=r"= 1 is a step with no all-reduce at all: the answer, 0\.99\d+, keeps its "
                                         r"communication only in digits.*as many decimals as keep it below 1"):
            wu.check_ddp_efficiency(one, step_s, 1e8)
    long_step = 1e6  # the answer is 0.9999999933: shown with the digits that keep it below 1, not as 1.000000
    with pytest.raises(NotYet, match=r"the answer, 0\.99999999, keeps"):
        wu.check_ddp_efficiency(1, long_step, 1e8)
    assert wu.check_ddp_efficiency(round(right, 4), step_s, 1e8) == right
    assert wu.check_ddp_efficiency(1, 1e18, 1e3) == 1  # communication below float64's resolution: 1 is the answer


@pytest.mark.parametrize("inputs, named", [
    ({"world_size": 64.5}, "world_size = 64.5 should be a whole number, 2 or more"),
    ({"gpus_per_node": 7.5}, "gpus_per_node = 7.5 should be a whole number, 1 or more"),
    ({"world_size": 1}, "world_size = 1 should be a whole number, 2 or more"),
    ({"world_size": "64"}, "world_size = '64' should be"),  # text is no count, as it is no answer
    ({"gpus_per_node": True}, "gpus_per_node = True should be"),
    ({"step_s": "0.05"}, "step_s = '0.05' should be a number above 0"),
    ({"grad_bytes": -1.0}, "grad_bytes = -1.0 should be a number above 0"),
    ({"grad_bytes": 1e300}, "grad_bytes = 1e+300 should be a number above 0, at most"),  # it ran bucket by bucket
    ({"step_s": math.nan}, "step_s = nan should be a number above 0"),  # named before the answer, itself nan below
])
def test_2_3_an_input_of_the_cell_that_is_no_count_or_size_is_named_in_one_line(inputs, named):
    """64.5 GPUs was judged as 64, True read as one GPU a node, text taken as a number: each is named, not read."""
    given = {"step_s": 0.05, "grad_bytes": 25e6, "world_size": 64, "gpus_per_node": 8, **inputs}
    with pytest.raises(WorkshopError, match=re.escape(f"the cell's {named}")) as caught:
        wu.check_ddp_efficiency(math.nan if "step_s" in inputs else 0.9, **given)
    assert "\n" not in str(caught.value)


def test_2_3_an_efficiency_of_0_is_refused_where_float16_holds_the_answer_as_0():
    """An answer of 1.6e-14 underflows to 0 in float16: 0 passed as "the answer held in float16"."""
    with pytest.raises(NotYet, match="`efficiency_64` = 0"):
        wu.check_ddp_efficiency(0, 1e-12, 1e12)


def test_2_3_within_one_node_no_ring_over_a_whole_node_is_named():
    """With 4 GPUs of a node of 8, a ring over 8 is no mistake of "one node instead of all": it was named, and its fix
    sent the ring over InfiniBand."""
    nvlink = wu.LINKS["nvlink4"]
    over_eight = by_hand(0.05, 25e6, 8, nvlink.latency_us, nvlink.bandwidth_gbps)
    for gpus_per_node, answer in ((8, over_eight), (1, 1.0)):  # and no ring over one node's one GPU
        with pytest.raises(NotYet) as caught:
            wu.check_ddp_efficiency(answer, 0.05, 25e6, world_size=4, gpus_per_node=gpus_per_node)
        assert "InfiniBand between" not in str(caught.value) and "one node's" not in str(caught.value), caught.value


# ---------------------------------------------------------------- Exercise 2.1


def average_gradients(model):
    import torch.distributed as dist

    world_size = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world_size


def summed_gradients(model):
    import torch.distributed as dist

    for p in model.parameters():
        dist.all_reduce(p.grad)


def untouched_gradients(model):
    return model


def divided_by_two(model):
    import torch.distributed as dist

    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= 2  # the lab's world size, typed in


def divided_by_three(model):
    import torch.distributed as dist

    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= 3  # the world size the check used to run on, typed in


def with_a_typo(model):
    import torch.distributed as dist

    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world_size  # noqa: F821 - the mistake under test


def only_rank_0_reduces(model):
    import torch.distributed as dist

    if dist.get_rank() == 0:
        for p in model.parameters():
            dist.all_reduce(p.grad)


# A lambda that averages with ReduceOp.AVG, which gloo runs too: a right answer in another form.
averaged_in_a_lambda = lambda model: [dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)  # noqa: E731
                                      for p in model.parameters()]


def dropped_gradients(model):
    for p in model.parameters():  # reduced, then thrown away: no gradient left to compare
        dist.all_reduce(p.grad)
        p.grad = None


def placeholder_gradients(model):
    ...


def async_without_wait(model):
    for p in model.parameters():  # the division may come before the sum: a race, whatever this run shows
        dist.all_reduce(p.grad, async_op=True)
        p.grad /= dist.get_world_size()


def async_then_wait(model):
    works = [dist.all_reduce(p.grad, async_op=True) for p in model.parameters()]
    for work, p in zip(works, model.parameters()):
        work.wait()
        p.grad /= dist.get_world_size()


def exits_on_the_ranks(model):
    # The mistake under test: a SystemExit raised inside the attendee's function (`sys` is this module's import).
    sys.exit(3)


def world_size_from_the_environment(model):
    for p in model.parameters():  # `os` and `dist` are this module's imports, as a notebook cell's would be
        dist.all_reduce(p.grad)
        p.grad /= int(os.environ["WORLD_SIZE"])


def _world_size():
    return dist.get_world_size()


def with_a_helper(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= _world_size()


WORLD = 2  # a variable of the notebook, not of the ranks
RUN_DIR = Path("runs")  # another, which is no world size


def with_a_notebook_variable(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= WORLD


def with_a_notebook_path(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    print(RUN_DIR)


def test_the_placeholder_function_is_named_before_any_launch(tmp_path, capsys):
    assert wu.check_average_gradients(placeholder_gradients, tmp_path) is False
    assert "not yet solved: `average_gradients` still has only `...` in its body" in capsys.readouterr().out
    assert wu.check_average_gradients(..., tmp_path) is False
    assert "still the placeholder" in capsys.readouterr().out
    assert wu.check_average_gradients(lambda model: ..., tmp_path) is False
    assert "only `...`" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("function, message", [
    (with_a_helper, r"`average_gradients` calls `_world_size`, a function of your notebook.*inside "
                    r"average_gradients"),
    (with_a_notebook_variable, r"`average_gradients` uses `WORLD`, a variable of your notebook.*Fix: compute `WORLD` "
                               r"inside average_gradients \(the world size: dist.get_world_size\(\)\)"),
    (with_a_notebook_path, r"`average_gradients` uses `RUN_DIR`, a variable of your notebook.*Fix: compute `RUN_DIR` "
                           r"inside average_gradients\.$"),
], ids=["helper-function", "notebook-variable", "notebook-path"])
def test_what_the_ranks_do_not_have_is_named_before_any_launch(tmp_path, function, message):
    """The ranks run the function's own source, with the modules it uses: a helper or a variable of the cell is
    not there, and the line says so, and how to fix it."""
    with pytest.raises(NotYet, match=message) as caught:
        wu.check_average_gradients(function, tmp_path)
    assert "\n" not in str(caught.value)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("function", [print, 42], ids=["builtin", "number"])
def test_what_has_no_source_is_named_before_any_launch(tmp_path, function):
    with pytest.raises(NotYet, match="not a function|cannot be read"):
        wu.check_average_gradients(function, tmp_path)
    assert not list(tmp_path.iterdir())


def local_world_size(model):
    for p in model.parameters():  # right on one node, where LOCAL_WORLD_SIZE is WORLD_SIZE
        dist.all_reduce(p.grad)
        p.grad /= int(os.environ["LOCAL_WORLD_SIZE"])


def role_world_size(model):
    for p in model.parameters():  # the role's world size: every rank of the job, as WORLD_SIZE
        dist.all_reduce(p.grad)
        p.grad /= int(os.environ["ROLE_WORLD_SIZE"])


def group_world_size(model):
    for p in model.parameters():  # the number of nodes (agents), not of ranks
        dist.all_reduce(p.grad)
        p.grad /= int(os.environ["GROUP_WORLD_SIZE"])


def imported_by_name(model):
    for p in model.parameters():  # from torch.distributed import all_reduce, at the cell's top
        all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def summed_by_name(model):
    for p in model.parameters():
        all_reduce(p.grad)


def shipped(function):
    """What check_average_gradients sends the ranks: the function's source and the modules it reads."""
    source, name = function_source(function, "Exercise 2.1")
    return source + shipped_globals(function, "Exercise 2.1"), name


# Functions that return: one launch judges them all, one after another (3 ranks as two nodes, then 2).
RETURNING = {
    "solution": (average_gradients, None),
    "lambda-avg": (averaged_in_a_lambda, None),
    "os-imported-by-the-cell": (world_size_from_the_environment, None),
    "divided-by-2": (divided_by_two, "the sum over the 3 ranks divided by 2, where DDP divides by 3"),
    "divided-by-3": (divided_by_three, "the sum over the 2 ranks divided by 3, where DDP divides by 2"),
    "sum": (summed_gradients, "sum over the 3 ranks"),
    "untouched": (untouched_gradients, "made no collective call"),
    "local-world-size": (local_world_size, "the sum over the 3 ranks divided by 2 on node 0, 1 on node 1, where DDP "
                                           "divides by 3"),
    # torchrun's other counts: the role's world size is the world's; the nodes' count is not
    "role-world-size": (role_world_size, None),
    "group-world-size": (group_world_size, "the sum over the 3 ranks divided by 2, where DDP divides by 3"),
    "dropped": (dropped_gradients, "your gradients differ from DDP's by up to inf on 3 ranks"),
    "async-then-wait": (async_then_wait, None),
    "async-without-wait": (async_without_wait, "4 of your collective calls ran with async_op=True, and nothing waited "
                                               "for the work it returns"),
    # a collective imported by name is counted as dist.all_reduce is: not "no collective call" for a sum
    "imported-by-name": (imported_by_name, None),
    "summed-by-name": (summed_by_name, "sum over the 3 ranks"),
}


def hangs_on_rank_1_of_2(model):
    for p in model.parameters():
        if dist.get_world_size() == 2 and dist.get_rank() == 1:  # the second world size: the others' are judged
            while True:
                time.sleep(0.1)
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


# Functions that fail on the ranks, in the same launch, after those that return: one that raises on every rank alike
# leaves no rank in a collective, so the next one runs; one that does not return ends the launch at the limit.
FAILING = {
    "name-error": (with_a_typo, r"your function raised NameError: name 'world_size' is not defined on rank \d on line "
                                r"\d+ \(`p.grad /= world_size"),
    "system-exit": (exits_on_the_ranks, r"your function raised SystemExit: 3 on rank \d on line \d+ \(`sys.exit\(3\)`\)"
                                        r".*sys.exit ends the rank's process"),
    "hangs-on-rank-1": (hangs_on_rank_1_of_2, r"stopped at the time limit of 10 s \(the limit the check was given\): "
                                              r"rank 1 had not returned from your function \(rank 0: 1 all_reduce; "
                                              r"rank 1: none\)"),
}


@pytest.mark.slow  # one launch: 3 ranks as two nodes
def test_gradients_averaged_by_hand_are_compared_with_ddp_on_two_nodes_then_one(tmp_path):
    functions = {**RETURNING, **FAILING}
    verdicts = dict(zip(functions, judge_average_gradients([shipped(f) for f, _ in functions.values()], tmp_path,
                                                           idle_limit_s=10)))
    for kind, (_, message) in FAILING.items():
        assert isinstance(verdicts[kind], NotYet) and re.search(message, str(verdicts[kind])), verdicts[kind]
        assert "\n" not in str(verdicts[kind])
    for kind, (_, message) in RETURNING.items():
        verdict = verdicts[kind]
        if message is None:
            assert isinstance(verdict, dict), f"{kind}: {verdict}"
            assert set(verdict) == {3, 2} and all(v["max_difference"] <= 1e-6 for v in verdict.values()), kind
            assert len(verdict[3]["calls_made"]) == 4, kind
        else:
            assert isinstance(verdict, NotYet) and message in str(verdict), f"{kind}: {verdict}"
            assert "\n" not in str(verdict) and "ReduceOp.AVG" not in str(verdict)


def test_a_peer_that_ended_with_the_same_error_is_not_taken_for_one_that_stopped(tmp_path, monkeypatch):
    """The peer writes .done, then its error, between this rank's look for .done files and its read of the error:
    it finished as this rank did (an error on every rank alike), so the launch goes on to the next function."""
    from workshop_utils.exercises import ddp_lab_gradients

    (tmp_path / "rank1.done").write_text('{"calls": []}')
    real, ended = ddp_lab_gradients._record, []

    def peer_ends_meanwhile(folder, rank, ending="json"):
        if rank == 0 and ending == "json" and not ended:
            ended.append((folder / "rank0.done").write_text('{"calls": []}'))
            (folder / "rank0.json").write_text('{"rank": 0, "error": "SystemExit: 3", "calls": []}')
        return real(folder, rank, ending)

    monkeypatch.setattr(ddp_lab_gradients, "_record", peer_ends_meanwhile)
    assert ddp_lab_gradients.wait_for_ranks(tmp_path, 1, 2, [], limit_s=30) is None
    (tmp_path / "rank0.done").unlink()  # one that wrote its error without .done stopped in its function
    assert ddp_lab_gradients.wait_for_ranks(tmp_path, 1, 2, [], limit_s=30) == "peer failed"


@pytest.mark.slow  # one launch: a function whose ranks diverge ends it
def test_a_function_whose_ranks_make_different_calls_is_named_in_one_line(tmp_path):
    calls = r"different collective calls \(rank 0: 1 all_reduce; ranks 1, 2: none\)"
    with pytest.raises(NotYet, match=calls) as caught:
        wu.check_average_gradients(only_rank_0_reduces, tmp_path)
    assert "\n" not in str(caught.value)


def test_a_limit_reached_says_where_each_rank_was(tmp_path, monkeypatch):
    """Past the check's outer limit the line says so, with each rank's last progress: not "a hang"."""
    note_progress(tmp_path, 0, "finished")
    note_progress(tmp_path, 1, "drawing batch 3 of epoch 1")

    def too_long(*args, **kwargs):
        raise WorkshopError("The job ran longer than 7 s and was stopped.", "give it more time")

    monkeypatch.setattr(ddp_lab_files, "stream", too_long)
    with pytest.raises(NotYet) as caught:
        run_nodes([], (2, 1), tmp_path, "cpu", 7, False, LAB_EXERCISE)
    said = str(caught.value)
    assert "reached the check's limit of 7 s" in said and "rank 0: finished" in said
    assert re.search(r"rank 1: drawing batch 3 of epoch 1, \d+ s before", said) and "rank 2: not started" in said
    assert "collective" not in said and "\n" not in said
    assert "run fewer steps" in caught.value.fix
    assert what_ran(tmp_path, 1) == "rank 0: finished"


def test_a_limit_reached_before_any_rank_got_past_its_start_names_the_rendezvous(tmp_path, monkeypatch):
    """The PyTorch tutorial's MASTER_ADDR = 'localhost' and a port of its own in the script: no rank ever drew a
    batch, so no idle limit started; "it was still going, pass a larger timeout_s" would send the attendee waiting."""
    for rank in range(3):
        note_progress(tmp_path, rank, "starting (before its first batch)")
    monkeypatch.setattr(ddp_lab_files, "stream", lambda *a, **k: (_ for _ in ()).throw(
        WorkshopError("The job ran longer than 7 s and was stopped.", "give it more time")))
    with pytest.raises(NotYet) as caught:
        run_nodes([], (2, 1), tmp_path, "cpu", 7, False, LAB_EXERCISE)
    assert "with no rank past its start" in str(caught.value) and "MASTER_ADDR" in caught.value.fix
    assert "larger timeout_s" not in caught.value.fix


def test_a_limit_reached_in_exercise_2_1_asks_for_no_fewer_steps(tmp_path, monkeypatch):
    """2.1 runs the attendee's function once per world: it has no steps to cut."""
    for rank in range(3):
        note_progress(tmp_path, rank, "in your function (world of 3)")
    monkeypatch.setattr(ddp_lab_files, "stream", lambda *a, **k: (_ for _ in ()).throw(
        WorkshopError("The job ran longer than 7 s and was stopped.", "give it more time")))
    with pytest.raises(NotYet) as caught:
        run_nodes([], (2, 1), tmp_path, "cpu", 7, False, "Exercise 2.1")
    assert "larger timeout_s" in caught.value.fix and "steps" not in caught.value.fix


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_launch_lines_gpus_never_replace_the_checks_own(tmp_path, monkeypatch, device):
    """A line's CUDA_VISIBLE_DEVICES=0 would show CPU ranks on a node with too few GPUs a GPU to share: the check's
    choice of each node's GPUs (none for CPU ranks) stands, as the line's other assignments reach the ranks."""
    seen = {}

    def record(commands, cwd, timeout_s, echo, envs, **kwargs):
        seen.update(envs)
        return [0] * len(commands), []

    monkeypatch.setattr(ddp_lab_files, "stream", record)
    monkeypatch.setattr(ddp_lab_files, "visible_gpu_ids", lambda: ["4", "5", "6"])
    run_nodes([], (2, 1), tmp_path, device, 7, False, LAB_EXERCISE,
              assigned={"CUDA_VISIBLE_DEVICES": "0", "LAB_NOTE": "kept"})
    gpus = [env["CUDA_VISIBLE_DEVICES"] for env in seen.values()]
    assert gpus == (["", ""] if device == "cpu" else ["4,5", "6"])
    assert all(env["LAB_NOTE"] == "kept" for env in seen.values())


# ---------------------------------------------------------------- the scripts under torchrun


@pytest.mark.slow
def test_the_single_device_script_runs_with_python(tmp_path):
    throughput = wu.run_single(LAB / "train_single.py", tmp_path / "out", args=[*SMALL, "--epochs", "1"], echo=False)
    assert throughput > 0 and (tmp_path / "out" / "checkpoint.pt").exists()


# The solution passing, with each rank's record and one checkpoint, is read from notebook 02's run of its lab check
# in the main job (tests/test_notebooks.py), which launches it anyway.


# The lab's mistakes, a few to a launch: each part of a run (the data, the model, the checkpoint, the output, the end)
# shows every mistake it finds that the rest of it does not depend on, so one run with several mistakes shows all.
THROUGHPUT_LINE = "{seen * world_size / elapsed:.0f} samples/s"
SEEDED = "sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)"
MISTAKES = {
    "one in every part, shards from different seeds": (
        [("        sampler.set_epoch(epoch)\n", ""),
         (SEEDED, SEEDED.replace("seed=0", "seed=rank")),
         ('ddp_model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)', "ddp_model = model"),
         ("    if rank == 0:\n        out.mkdir", "    if True:\n        out.mkdir"),
         (THROUGHPUT_LINE, "{1e9:.0f} samples/s"),
         ("    dist.destroy_process_group()\n", "")],
        ["ranks 0 and 1 share", "same order in epochs 0 and 1",
         "not wrapped in DistributedDataParallel; the ranks' parameters differ",
         "every rank saved a checkpoint (ranks 0, 1, 2 called torch.save).",
         "the reported throughput, 1000000000 samples/s, is far from the about",
         "process group still open"]),
    "no DistributedSampler, the wrapper's state dict, a throughput 4x too high": (
        [("loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)",
          "loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True)"),
         ('torch.save(model.state_dict(), out / "checkpoint.pt")',
          'torch.save(ddp_model.state_dict(), out / "checkpoint.pt")'),
         (THROUGHPUT_LINE, "{4 * seen * world_size / elapsed:.0f} samples/s")],
        ["every rank read the whole data set", "its keys carry DDP's `module.` prefix (module.",
         "samples/s, is far from the about"]),
    # set_epoch moved into rank 0's logging block: rank 0 reshuffles, the others read the same order each epoch
    # and overlap rank 0's shard from epoch 1 on (it passed: only rank 0's order was looked at)
    "set_epoch on rank 0 only": (
        [("        sampler.set_epoch(epoch)\n", ""),
         ("            print(f\"epoch {epoch}: loss {loss.item():.4f}\", flush=True)  # rank 0's last batch\n",
          "            print(f\"epoch {epoch}: loss {loss.item():.4f}\", flush=True)  # rank 0's last batch\n"
          "            sampler.set_epoch(epoch + 1)\n"),
         ("    if rank == 0:\n        out.mkdir", "    if rank == 1:\n        out.mkdir")],
        ["rank 1 read its shard in the same order in epochs 0 and 1: its sampler never reshuffled",
         "only rank 1 saved a checkpoint."]),
    # On two nodes (2 + 1 processes), rank 2 is LOCAL_RANK 0 on node 1: one node cannot show these.
    "rank from LOCAL_RANK, one rank's throughput": (
        [('rank = int(os.environ["RANK"])', 'rank = int(os.environ["LOCAL_RANK"])'),
         (THROUGHPUT_LINE, "{seen / elapsed:.0f} samples/s")],
        ["rank 2's DistributedSampler was given rank=0, its LOCAL_RANK",
         "2 ranks saved a checkpoint (ranks 0, 2 called torch.save).",
         "rank 2 logged too ('epoch 0: loss", "x): it is one rank's."]),
}


def mutated_with(tmp_path, changes) -> Path:
    source = solution()
    for old, new in changes:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    path = tmp_path / "my_train_ddp.py"
    path.write_text(source)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("mistakes", MISTAKES)
def test_each_part_of_a_run_names_its_mistake(tmp_path, mistakes):
    changes, messages = MISTAKES[mistakes]
    script = mutated_with(tmp_path, changes)
    records, params, out_dir, *_, per_node = ddp_lab._lab_records(script, tmp_path, 2, ddp_lab.LAUNCH_HERE, 300,
                                                                  False, SMALL, LAB_EXERCISE)
    assert per_node == (2, 1)
    found = [str(mistake) for mistake in findings(records, params, out_dir, per_node, LAB_EXERCISE)]
    assert len(found) == len(messages), found
    for said, message in zip(found, messages):
        assert message in said and "\n" not in said and said.startswith("✗ Exercise 2.2: "), (message, said)
    with pytest.raises(NotYet) as caught:  # the check itself says the first, the one to fix first
        raise findings(records, params, out_dir, per_node, LAB_EXERCISE)[0]
    assert messages[0] in str(caught.value)


CRASHES = {
    "a crash on rank 1": ("    dataset = synthetic_cifar(args.samples)\n",
                          "    dataset = synthetic_cifar(args.samples)\n"
                          "    if rank == 1:\n        raise RuntimeError('rank 1 fell over')\n",
                          r"the run failed \(exit status 1\); rank 1 failed first: RuntimeError: rank 1 fell over"),
    # Ranks 0 and 2 are in the step's all-reduce when rank 1 fails: their "Connection closed by peer", or torchrun's
    # SIGTERM if that comes first, is a consequence.
    "a crash in rank 1's training loop": (
        "            seen += len(images)\n",
        "            seen += len(images)\n            if rank == 1 and epoch == 1:\n"
        "                raise RuntimeError('rank 1 fell over in epoch 1')\n",
        r"the run failed \(exit status 1\); rank 1 failed first: RuntimeError: rank 1 fell over in epoch 1 "
        # What happens to the others next is a race: their next all-reduce finds the peer gone, or torchrun stops them.
        r"\(then .*(lost|stopped by torchrun).*\)\. Fix: read rank 1's own traceback"),
    # A world size typed in for the line's 2 processes: the sampler refuses rank 2, named by what it was given (on
    # two nodes of one process each, as the check ran before, 2 was right).
    "world size typed in": ('world_size = int(os.environ["WORLD_SIZE"])', "world_size = 2",
                            r"rank \d's DistributedSampler was given num_replicas=2, which is not its global world "
                            r"size \(the check runs your script as two nodes\)"),
    "a barrier on rank 0 only": ("        print(f\"saved {out / 'checkpoint.pt'}\", flush=True)\n",
                                 "        print(f\"saved {out / 'checkpoint.pt'}\", flush=True)\n"
                                 "        dist.barrier()\n",
                                 r"rank 0 waited in barrier\(\) while ranks? [\d, ]+ had already finished and left: a "
                                 r"collective that only some ranks run .*Fix: run every collective"),
}


@pytest.mark.slow
@pytest.mark.parametrize("mistake", CRASHES)
def test_a_run_that_fails_names_the_rank_that_failed_first(tmp_path, capsys, mistake):
    """The output above the verdict stays readable: the failing rank's own traceback, torchrun's report folded to
    one line per node, none of the checker's frames; a path with a space shown quoted."""
    old, new, message = CRASHES[mistake]
    script = mutated(tmp_path, old, new)
    with pytest.raises(NotYet, match=message) as caught:
        wu.check_ddp_lab(script, tmp_path / "run dir", args=SMALL)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("✗ Exercise 2.2: ")
    shown = capsys.readouterr().out
    assert f"--out-dir '{tmp_path / 'run dir'}/check/out'" in shown.splitlines()[0]
    for noise in ("ChildFailedError", "ddp_lab.py", "runpy", "torch/distributed/run.py", "TCPStore", "Root Cause"):
        assert noise not in shown, (noise, shown)
    assert len(shown.splitlines()) <= 30, shown
    if "crash" in mistake:  # below the interleaved output, the failing rank's own traceback, ending in its error
        assert "--- the last lines of rank 1, the first to fail:\n" in shown
        assert shown.rstrip().endswith("RuntimeError: " + re.search(r"raise RuntimeError\('(.*)'\)", new).group(1))
        # Node 0's agent reports the rank whose exit it saw: rank 0 can end, its peer gone, before rank 1's own exit
        # is seen (the verdict above names rank 1 from the exact times either way).
        assert re.search(r"\[node 0\] torchrun: rank (1 ended \(exit status 1\): RuntimeError: rank 1 fell over|"
                         r"0 ended \(exit status 1\), having lost its connection to a rank that failed)", shown)


def _processes_running(folder: Path) -> list[int]:
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        if any(str(folder) in part for part in process.info["cmdline"] or []):
            found.append(process.info["pid"])
    return found


@pytest.mark.slow
def test_a_rank_that_stops_progressing_is_stopped_at_its_limit(tmp_path):
    """The line says the limit was reached, which rank stopped progressing and where each rank was, not that a
    collective hangs. The limit is given here (10 s) so that the test waits no longer than it must; the limit
    scaled to the machine is held below, without a launch."""
    script = mutated(tmp_path, "    dist.destroy_process_group()\n",
                     "    if rank == 1:\n        time.sleep(600)\n    dist.destroy_process_group()\n")
    with pytest.raises(NotYet) as caught:
        wu.check_ddp_lab(script, tmp_path, args=SMALL, echo=False, idle_limit_s=10)
    said = str(caught.value)
    assert re.search(r"stopped at the time limit: rank 1 was the first to make no progress, for \d+ s, past the limit "
                     r"of 10 s \(the limit the check was given\)", said), said
    assert re.search(r"rank 0: finished; rank 1: (drew batch \d+ of epoch 2|called torch.save), \d+ s before",
                     said), said
    assert _processes_running(tmp_path) == [], f"still running: {_processes_running(tmp_path)} (pid {os.getpid()})"


def test_a_pause_for_an_evaluation_is_no_hang():
    """A rank 0 that evaluates for 25 s after an epoch, on a machine that took 7.5 s to start a rank, was stopped at
    15 s (2x); the limit scales with the start-up and has a floor that such a pause stays under."""
    assert scaled_limit(7.5) >= 25 + 5 and scaled_limit(0.5) == LIMIT_FLOOR_S >= 30
    assert scaled_limit(20.0) == LIMIT_FACTOR * 20.0
    assert ddp_lab_files.limit_words(37.5, 7.5) == ("38 s (5x the 7.5 s this machine took to start the rank, and at "
                                                    "least 30 s)")


def test_the_rank_that_stopped_progressing_first_is_named_not_the_one_whose_limit_came_first(tmp_path):
    """Rank 0 pauses after epoch 0; rank 1 draws epoch 1's first batch and waits in its all-reduce. Rank 1's limit
    (from its own, shorter start-up) came first: the line still names rank 0, the one that stopped first."""
    now = 1_000_000.0
    write_json({"what": "drew batch 16 of epoch 0", "time": now}, tmp_path / "rank0.progress")
    write_json({"what": "drew batch 1 of epoch 1", "time": now + 0.13}, tmp_path / "rank1.progress")
    write_json({"rank": 1, "what": "drew batch 1 of epoch 1", "idle_s": 37.6, "startup_s": 7.49, "limit_s": 37.45,
                "time": now + 37.73}, tmp_path / "rank1.stalled")
    write_json({"rank": 0, "what": "drew batch 16 of epoch 0", "idle_s": 38.0, "startup_s": 7.5, "limit_s": 37.5,
                "time": now + 38.0}, tmp_path / "rank0.stalled")
    said = str(ddp_lab._crash(1, [], tmp_path, (1, 1), LAB_EXERCISE))
    assert "rank 0 was the first to make no progress, for 38 s, past the limit of 38 s (5x the 7.5 s" in said, said
    assert "rank 0: drew batch 16 of epoch 0, 38 s before; rank 1: drew batch 1 of epoch 1, 38 s before" in said


def test_a_rank_that_failed_after_the_limit_came_is_shown_where_it_was(tmp_path):
    """Rank 0 waits in a barrier the others never join; it fails once they have gone, after the limit came: it is
    shown where it was (its last progress), not as "failed, -0 s before"."""
    now = 1_000_000.0
    write_json({"what": "failed", "time": now + 1, "was": {"what": "called torch.save", "time": now - 38}},
               tmp_path / "rank0.progress")
    write_json({"what": "finished", "time": now - 40}, tmp_path / "rank1.progress")
    assert what_ran(tmp_path, 2, now) == "rank 0: called torch.save, 38 s before; rank 1: finished"
    assert ddp_lab_files.first_to_stall(tmp_path, 2, now) == (0, now - 38)


def sampler_records(world: int, per_node, given) -> list[dict]:
    """The probe's records of ranks whose DistributedSampler was given ``given(rank, local world size, nodes)``."""
    records, rank = [], 0
    for node, count in enumerate(per_node):
        for local in range(count):
            records.append({"rank": rank, "env": {"RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(world),
                                                  "LOCAL_WORLD_SIZE": str(count), "GROUP_RANK": str(node),
                                                  "GROUP_WORLD_SIZE": str(len(per_node))},
                            "samplers": [{"rank": rank, "num_replicas": given(rank, count, len(per_node))}]})
            rank += 1
    return records


@pytest.mark.parametrize("given, words", [
    (lambda rank, local, nodes: local, "rank 0's DistributedSampler was given num_replicas=2, its LOCAL_WORLD_SIZE"),
    (lambda rank, local, nodes: nodes, "rank 0's DistributedSampler was given num_replicas=2, which is not its global "
                                       "world size"),
    (lambda rank, local, nodes: 4, "rank 0's DistributedSampler was given num_replicas=4, which is not its global "
                                   "world size"),
    (lambda rank, local, nodes: 3, None),
], ids=["local-world-size", "group-world-size", "typed-in", "right"])
def test_a_sampler_given_another_count_is_named_by_what_it_was_given(given, words):
    """Read from what the probe recorded before the sampler ran: a sampler that refused its rank (rank 2 of
    num_replicas=2) is named as well as one that took it."""
    found = sampler_mistake(sampler_records(3, (2, 1), given), LAB_EXERCISE)
    if words is None:
        assert found is None
    else:
        said = str(found)
        assert words in said and "(the check runs your script as two nodes)" in said and " 3" not in said, said


def gradient_records(folder: Path, calls: dict[int, list[str]], done=()) -> None:
    """The files the ranks of Exercise 2.1 leave when the limit stops them: each rank's calls, and its record."""
    for rank, made in calls.items():
        (folder / f"rank{rank}.calls").write_text("".join(f"{op}\n" for op in made))
        if rank in done:
            write_json({"calls": made}, folder / f"rank{rank}.done")
        write_json({"rank": rank, "stopped": "timeout", "calls": made, "limit_s": 30.0,
                    "startup_s": 2.0, "time": 1.0}, folder / f"rank{rank}.json")


@pytest.mark.parametrize("calls, done, words", [
    ({0: ["all_reduce"], 1: [], 2: ["all_reduce"]}, (),
     "rank 1 had not returned from your function (ranks 0, 2: 1 all_reduce; rank 1: none)"),
    ({0: [], 1: [], 2: []}, (), "ranks 0, 1, 2 had not returned from your function (ranks 0, 1, 2: none). Fix: find "
                                "what ranks 0, 1, 2 waited for: a loop that never ends"),
    ({0: [], 1: [], 2: []}, (0, 2), "rank 1 had not returned from your function (ranks 0, 1, 2: none)."),
], ids=["one-rank-behind-the-others-in-a-collective", "every-rank-in-a-loop", "one-rank-late"])
def test_a_function_stopped_at_the_limit_is_named_by_where_each_rank_was(tmp_path, calls, done, words):
    gradient_records(tmp_path, calls, done)
    said = str(gradients_failure(tmp_path, 3, "Exercise 2.1"))
    assert said.startswith("✗ Exercise 2.1: stopped at the time limit of 30 s (5x the 2.0 s this machine took to "
                           "start the rank, and at least 30 s): ") and words in said, said
    assert "busy machine" not in said


def test_an_agent_left_waiting_is_stopped_soon_after_the_other_ended():
    """An agent whose ranks succeeded waits minutes at torchrun's exit barrier for one that failed: the launch stops
    it a few seconds after the other's end, as a cluster ends a job whose task failed, and keeps both statuses."""
    from workshop_utils.parallel.launch import stream

    started = time.monotonic()
    codes, lines = stream({"[node 0] ": [sys.executable, "-c", "print('failed'); raise SystemExit(1)"],
                           "[node 1] ": [sys.executable, "-c", "import time; print('waiting', flush=True); "
                                                               "time.sleep(120)"]},
                          None, 60, False, linger_s=1)
    assert time.monotonic() - started < 30 and codes[0] == 1 and codes[1] != 0
    assert sorted(lines) == ["[node 0] failed", "[node 1] waiting"]


def test_the_outer_limit_with_every_rank_started_gives_no_busy_machine_advice(tmp_path, monkeypatch):
    for rank in range(3):
        note_progress(tmp_path, rank, "in your function (world of 3)")

    def too_long(*args, **kwargs):
        raise WorkshopError("The job ran longer than 7 s and was stopped.", "give it more time")

    monkeypatch.setattr(ddp_lab_files, "stream", too_long)
    with pytest.raises(NotYet) as caught:
        run_nodes([], (2, 1), tmp_path, "cpu", 7, False, "Exercise 2.1")
    assert "never got going" not in str(caught.value) and "larger timeout_s" in str(caught.value)


# ---------------------------------------------------------------- a path with a space, the launch line's f


def test_an_unquoted_path_with_a_space_is_named_with_the_quoting_fix(tmp_path):
    script = tmp_path / "run dir" / "my_train_ddp.py"
    with pytest.raises(NotYet) as caught:
        read_launch_line(f"torchrun --nproc-per-node=2 {script}", script, 2, LAB_EXERCISE)
    said = str(caught.value)
    assert "holds a space or another character the shell splits at" in said
    assert 'Fix: quote it for the shell: f"torchrun --nproc-per-node=2 {shlex.quote(str(lab_file))}"' in said
    assert read_launch_line(f"torchrun --nproc-per-node=2 {shlex.quote(str(script))}", script, 2).script_args == []


def test_the_notebooks_own_launch_line_reads_a_path_with_a_space(tmp_path):
    import nbformat

    notebook = nbformat.read(LAB.parent.parent / "02_multi_gpu_ddp.ipynb", as_version=4)
    line = next(line for cell in notebook.cells if "exercise" in cell.metadata.get("tags", [])
                for line in cell.source.splitlines() if line.startswith("lab_command = "))
    lab_file = tmp_path / "run dir" / "my_train_ddp.py"
    command = eval(line.removeprefix("lab_command = "), {"lab_file": lab_file, "shlex": shlex})  # noqa: S307
    assert read_launch_line(command, lab_file, 2).script_args == []


def test_a_launch_line_without_its_f_says_the_f_is_missing(tmp_path):
    script = tmp_path / "my_train_ddp.py"
    with pytest.raises(NotYet, match=r"holds \{lab_file\} as written: the f in front of the quotes.*is missing"):
        read_launch_line("torchrun --nproc-per-node=2 {lab_file}", script, 2, LAB_EXERCISE)


@pytest.mark.parametrize("gpus, device", [(0, "cpu"), (1, "cpu"), (2, "cpu"), (3, "cuda"), (8, "cuda")])
def test_every_machine_runs_the_lab_as_two_plus_one_so_a_typed_world_size_fails(monkeypatch, gpus, device):
    """With exactly two GPUs, splitting the ranks 1 + 1 let a world size typed in as 2 pass: the ranks go to the CPU
    instead, three of them, unless a GPU is there for each of the three."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    per_node = ddp_lab.lab_nodes(2)
    assert per_node == (2, 1) and sum(per_node) != 2
    assert ddp_lab.lab_device(sum(per_node)) == device


def test_shards_that_overlap_only_after_epoch_0_are_named():
    """Every rank reshuffles, but with its own epoch (set_epoch(epoch * (rank + 1))): apart in epoch 0 only."""
    from workshop_utils.exercises.ddp_lab_judging import _data

    def record(*epochs):
        return {"epochs": [{"dataset": 0, "indices": list(indices)} for indices in epochs]}

    records = [record(range(0, 10), range(9, -1, -1)), record(range(10, 20), [*range(0, 5), *range(25, 30)]),
               record(range(20, 30), range(29, 19, -1))]
    said = list(_data(records, [], None, 3, {}))
    assert len(said) == 1 and said[0][0].startswith("ranks 0 and 1 share 50% of their samples in epoch 1"), said
    assert "with the same epoch on every rank" in said[0][1]


@pytest.mark.slow
@pytest.mark.parametrize("old, new, verdict", [
    ("    dist.destroy_process_group()\n", "    dist.destroy_process_group()\n    os._exit(0)\n", None),
    ('        print(f"saved {out / \'checkpoint.pt\'}", flush=True)\n',
     '        print(f"saved {out / \'checkpoint.pt\'}", flush=True)\n        os._exit(0)\n', "process group still open"),
], ids=["after-closing-the-group", "rank-0-after-its-save"])
def test_a_script_that_ends_with_os_exit_is_judged_when_it_ends_not_at_the_limit(tmp_path, old, new, verdict):
    """A rank forked from its agent that ended by os._exit(0) returned no value to torchrun, which waited for it
    until the check's limit ("it was still going"); torchrun running the script as a process sees exit status 0."""
    script = mutated(tmp_path, old, new)
    check = lambda: wu.check_ddp_lab(script, tmp_path, args=SMALL, echo=False, timeout_s=240)  # noqa: E731
    if verdict is None:
        assert check().ranks == 3
    else:
        with pytest.raises(NotYet, match=verdict):
            check()
    assert _processes_running(tmp_path) == []
