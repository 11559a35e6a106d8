"""Notebook 02's DDP lab and exercises: the solution passes, each common mistake gets its own line.

The mistakes are small edits of the solution script, written here into tmp_path; each one is run
under torchrun by the checker (marked slow). The parsing of launch lines, the attendee's copy and
the 64-GPU check are pure Python.
"""

import ast
import math
import os
import re
import sys
from pathlib import Path

import psutil
import torch.distributed as dist
import pytest

import workshop_utils as wu
from workshop_utils.lessons.ddp_lab import (LAB_EXERCISE, lab_command, lab_folder, placeholders_left,
                                            solution_text)
from workshop_utils.lessons.exercises import NotYet

LAB = Path(__file__).resolve().parent.parent / "notebooks" / "labs" / "ddp_lab"
SMALL = ("--samples", "256")  # 128 samples per rank, 4 steps an epoch: the launch is the cost


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
    ("", "the command is empty"),
])
def test_a_command_that_is_no_launch_line_is_named_before_any_launch(tmp_path, command, message):
    """None is no launch line: only leaving `command` out lets the checker write the torchrun line itself."""
    script = wu.solve_ddp_lab(tmp_path / "my_train_ddp.py", LAB)
    with pytest.raises(NotYet, match=message):
        wu.check_ddp_lab(script, tmp_path, command=command)
    assert not list(tmp_path.glob("check*")), "nothing was launched"


@pytest.mark.parametrize("command, launcher", [
    ("torchrun --nproc-per-node=2 {s}", "torchrun"),
    ("!torchrun --nproc_per_node 2 {s} --epochs 2", "torchrun"),
    ("python -m torch.distributed.run --standalone --nproc-per-node=2 {s}", "torchrun"),
    # as typed in a terminal or a Slurm script: srun, variables, a cd first
    ("srun --ntasks=1 torchrun --nproc-per-node=2 {s}", "torchrun"),
    ("OMP_NUM_THREADS=1 torchrun --nproc-per-node=2 {s}", "torchrun"),
    ("cd {d} && torchrun --nnodes=1 --nproc-per-node=2 my_train_ddp.py", "torchrun"),
    ("python {s}", "python"),
    ("python3 -u {s}", "python"),
    # torchrun's own reading: the last of a repeated option, an abbreviation it accepts
    ("torchrun --nproc-per-node=1 --nproc-per-node=2 {s}", "torchrun"),
    ("torchrun --nproc-per=2 {s}", "torchrun"),
])
def test_launch_lines_become_probed_commands(tmp_path, command, launcher):
    script = tmp_path / "my_train_ddp.py"
    argv, found = lab_command(command.format(s=script, d=tmp_path), script, 2, tmp_path / "probe", ["--out-dir", "x"],
                              LAB_EXERCISE)
    # The launch runs in this Python; a VAR=value in front reaches it through env, as the shell would set it.
    assert found == launcher and argv[:argv.index(sys.executable)] in ([], ["env", "OMP_NUM_THREADS=1"])
    at = argv.index("workshop_utils.lessons.ddp_lab")
    assert argv[at - 1] == "-m" and argv[at + 1:at + 4] == ["--probe", str(tmp_path / "probe"), str(script)]
    assert argv[-2:] == ["--out-dir", "x"]
    assert ("torch.distributed.run" in argv) == (launcher == "torchrun")
    if "--standalone" in command or launcher == "python":
        assert not any(a.startswith("--master-port") for a in argv)


@pytest.mark.parametrize("command, message", [
    ("torchrun {s}", "starts one process unless told"),
    ("torchrun --nproc-per-node=4 {s}", "the lab runs on 2 processes"),
    ("torchrun --nnodes=2 --nproc-per-node=2 {s}", "--nnodes=2: torchrun would wait for 2 nodes"),
    ("srun torchrun --nnodes 2 --nproc-per-node=2 {s}", "--nnodes=2"),
    ("bash {s}", "starts with 'bash'"),
    ("torchrun --nproc-per-node=2", "names no .py script"),
    ("torchrun --nproc-per-node=2 other.py", "not your lab script"),
    ("", "the command is empty"),
    ("torchrun --nproc-per-node=2 --nproc-per-node=1 {s}", "--nproc-per-node=1: the lab runs on 2"),
    ("torchrun --nproc=2 {s}", "ambiguous option"),
    ("torchrun --nproc-per-node=2 python {s}", "'python', as the training script"),
    ("torchrun --nproc-per-node=2 --node-rank=1 {s}", "--node-rank=1 on a one-node launch"),
])
def test_wrong_launch_lines_are_named(tmp_path, command, message):
    script = tmp_path / "my_train_ddp.py"
    with pytest.raises(NotYet, match=message):
        lab_command(command.format(s=script), script, 2, tmp_path, [], LAB_EXERCISE)


# ---------------------------------------------------------------- Exercise 2.3 (no launch)


def by_hand(step_s, grad_bytes, p, latency_us, bandwidth_gbps, steps=None):
    """The no-overlap efficiency written out: one ring all-reduce per DDP bucket (1 MiB, then 25 MiB)."""
    buckets, left, cap = [], grad_bytes, 2**20
    while left > 0:
        buckets.append(min(cap, left))
        left -= buckets[-1]
        cap = 25 * 2**20
    steps = 2 * (p - 1) if steps is None else steps
    comm = sum(steps * latency_us * 1e-6 + steps / p * b / (bandwidth_gbps * 1e9) for b in buckets)
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


def placeholder_gradients(model):
    ...


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


def with_a_notebook_variable(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= WORLD


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
    (with_a_notebook_variable, r"`average_gradients` uses `WORLD`, a variable of your notebook.*inside "
                               r"average_gradients"),
], ids=["helper-function", "notebook-variable"])
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


@pytest.mark.slow  # three ranks under torchrun each: about 10 s on a busy 2-core machine
@pytest.mark.parametrize("function, message", [
    (average_gradients, None),
    (averaged_in_a_lambda, None),
    (divided_by_two, "the sum divided by 2, but 3 ranks ran"),
    (divided_by_three, "the sum divided by 3, but 4 ranks ran"),
    (summed_gradients, "sum over the 3 ranks"),
    (with_a_typo, r"your function raised NameError: name 'world_size' is not defined on rank \d on line \d+ "
                  r"\(`p.grad /= world_size"),
    (only_rank_0_reduces, r"different collective calls \(rank 0: 1 all_reduce; ranks 1, 2: none\)"),
    (world_size_from_the_environment, None),
    (exits_on_the_ranks, r"your function raised SystemExit: 3 on rank \d on line \d+ \(`sys.exit\(3\)`\).*"
                         r"ends the rank's process"),
], ids=["solution", "lambda-avg", "divided-by-2", "divided-by-3", "sum", "name-error", "rank-0-only",
        "os-imported-by-the-cell", "system-exit"])
def test_gradients_averaged_by_hand_are_compared_with_ddp_on_three_ranks(tmp_path, capsys, function, message):
    if message is None and function is not average_gradients:
        # What these vary is how the function is read, which one world size shows: one launch, not the two.
        result = wu.check_average_gradients(function, tmp_path, nproc=3)
        assert result["max_difference"] <= 1e-6 and result["calls"] == 4 and result["world_sizes"] == [3]
        assert "✓ Exercise 2.1: correct (equal to DDP's on all ranks, on 3 ranks" in capsys.readouterr().out
    elif message is None:
        result = wu.check_average_gradients(function, tmp_path)
        assert result["max_difference"] <= 1e-6 and result["calls"] == 4
        assert "✓ Exercise 2.1: correct (equal to DDP's on all ranks, on 3 and 4 ranks" in capsys.readouterr().out
    else:
        with pytest.raises(NotYet, match=message) as caught:
            wu.check_average_gradients(function, tmp_path)
        assert "\n" not in str(caught.value) and "ReduceOp.AVG" not in str(caught.value)


# ---------------------------------------------------------------- the scripts under torchrun


@pytest.mark.slow
def test_the_single_device_script_runs_with_python(tmp_path):
    throughput = wu.run_single(LAB / "train_single.py", tmp_path / "out", args=[*SMALL, "--epochs", "1"], echo=False)
    assert throughput > 0 and (tmp_path / "out" / "checkpoint.pt").exists()


@pytest.mark.slow
def test_the_solution_passes(tmp_path, capsys):
    script = wu.solve_ddp_lab(tmp_path / "my_train_ddp.py", LAB)
    run = wu.check_ddp_lab(script, tmp_path, args=SMALL, echo=False)
    assert "✓ Exercise 2.2: correct" in capsys.readouterr().out
    assert (run.ranks, run.samples_per_rank) == (2, 128) and run.checkpoint.name == "checkpoint.pt"
    assert run.throughput_reported > 0 and run.throughput_measured > 0
    # Both ranks left their record: the output of each, and its parameters.
    assert {p.name for p in run.folder.iterdir()} >= {"rank0.json", "rank1.json", "rank0-params.pt", "out"}


MISTAKES = {
    "no set_epoch": ("        sampler.set_epoch(epoch)\n", "", "same order in epochs 0 and 1"),
    "no DistributedSampler": ("loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)",
                              "loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True)",
                              "trained on the same samples"),
    "no DDP wrap": ('ddp_model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)',
                    "ddp_model = model", "not wrapped in DistributedDataParallel; the ranks' parameters differ"),
    "every rank saves": ("    if rank == 0:\n        out.mkdir", "    if True:\n        out.mkdir",
                         "every rank saved a checkpoint"),
    "every rank logs": ("    if rank == 0:\n        print(f\"throughput", "    if True:\n        print(f\"throughput",
                        "rank 1 logged too"),
    "a made-up throughput": ("{seen * world_size / elapsed:.0f} samples/s", "{1e9:.0f} samples/s",
                             "far from what the ranks drew"),
    "one rank's throughput": ("{seen * world_size / elapsed:.0f} samples/s", "{seen / elapsed:.0f} samples/s",
                              "is one rank's: the 2 ranks together drew"),
    "a throughput 4x too high": ("{seen * world_size / elapsed:.0f} samples/s",
                                 "{4 * seen * world_size / elapsed:.0f} samples/s", "far from what the ranks drew"),
    "no destroy_process_group": ("    dist.destroy_process_group()\n", "", "process group still open"),
    "a crash on rank 1": ("    dataset = synthetic_cifar(args.samples)\n",
                          "    dataset = synthetic_cifar(args.samples)\n"
                          "    if rank == 1:\n        raise RuntimeError('rank 1 fell over')\n",
                          r"the run failed \(exit status 1\); rank 1 failed first: RuntimeError: rank 1 fell over"),
    # Rank 0 is in the step's all-reduce when rank 1 fails: its "Connection closed by peer", or torchrun's SIGTERM
    # if that comes first, is a consequence.
    "a crash in rank 1's training loop": (
        "            seen += len(images)\n",
        "            seen += len(images)\n            if rank == 1 and epoch == 1:\n"
        "                raise RuntimeError('rank 1 fell over in epoch 1')\n",
        r"the run failed \(exit status 1\); rank 1 failed first: RuntimeError: rank 1 fell over in epoch 1 "
        # What happens to rank 0 next is a race: its next all-reduce finds the peer gone, or torchrun stops it first.
        r"\(then rank 0 (lost its connection to it|was stopped by torchrun with SIGTERM)\)\. "
        r"Fix: read rank 1's own traceback"),
    "a barrier on rank 0 only": ("        print(f\"saved {out / 'checkpoint.pt'}\", flush=True)\n",
                                 "        print(f\"saved {out / 'checkpoint.pt'}\", flush=True)\n        dist.barrier()\n",
                                 r"rank 0 waited in barrier\(\) while rank 1 had already finished and left: a "
                                 r"collective that only some ranks run .*Fix: run every collective"),
}


@pytest.mark.slow
@pytest.mark.parametrize("mistake", MISTAKES)
def test_each_mistake_gets_its_own_message(tmp_path, capsys, mistake):
    old, new, message = MISTAKES[mistake]
    script = mutated(tmp_path, old, new)
    with pytest.raises(NotYet, match=message) as caught:
        wu.check_ddp_lab(script, tmp_path, args=SMALL, echo=False)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("✗ Exercise 2.2: ")
    if "crash" in mistake:  # below the interleaved output, the failing rank's own traceback, ending in its error
        shown = capsys.readouterr().out
        assert "--- the last lines of rank 1, the first to fail:\n" in shown
        assert shown.rstrip().endswith("RuntimeError: " + re.search(r"raise RuntimeError\('(.*)'\)", new).group(1))


@pytest.mark.slow
def test_python_in_place_of_torchrun_is_named(tmp_path):
    script = wu.solve_ddp_lab(tmp_path / "my_train_ddp.py", LAB)
    with pytest.raises(NotYet, match="started with `python`"):
        wu.check_ddp_lab(script, tmp_path, command=f"python {script}", args=SMALL, echo=False)


def _processes_running(folder: Path) -> list[int]:
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        if any(str(folder) in part for part in process.info["cmdline"] or []):
            found.append(process.info["pid"])
    return found


@pytest.mark.slow
def test_a_hang_is_stopped_at_the_time_limit_and_no_rank_outlives_it(tmp_path):
    script = mutated(tmp_path, "    dist.destroy_process_group()\n",
                     "    if rank == 1:\n        time.sleep(600)\n    dist.destroy_process_group()\n")
    # 15 s: the limit alone decides (a rank still training or already hung is stopped alike), and its wait is the test's cost.
    with pytest.raises(NotYet, match="did not finish within 15 s"):
        wu.check_ddp_lab(script, tmp_path, args=SMALL, echo=False, timeout_s=15)
    assert _processes_running(tmp_path) == [], f"still running: {_processes_running(tmp_path)} (pid {os.getpid()})"
