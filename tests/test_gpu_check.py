"""The GPU check on a CPU: its list of paths covers every CUDA branch of the kit, a failing path is one line,
its clock stops it inside the budget, two-GPU paths are listed on one GPU; and the third audit's fixes."""

import ast
import functools
import importlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import workshop_utils as wu
from workshop_utils import gpu_check
from workshop_utils.gpu_check import PATHS, Context, Failed, GpuPath, Skip, run_paths, summary_line
from workshop_utils.spine import losses, trainer
from workshop_utils.system.errors import WorkshopError
from workshop_utils.system.hardware import peak_tflops

PACKAGE = Path(wu.__file__).parent
# What makes code GPU-only: a test of the device (``device.type == "cuda"``, ``env["device_type"] == "cuda"``), CUDA's
# API, NCCL, the device of a process group's collectives (a GPU under NCCL), fp8 (a Hopper or Ada GPU's).
CUDA_BRANCH = re.compile(r'type["\']?\]?\s*[!=]=\s*["\']cuda["\']|torch\.cuda\.|is_available\(\)|"nccl"|\.is_cuda\b'
                         r'|collective_device\(\)|float8_|_scaled_mm|check_fp8\(')


def cuda_branches(package: Path = PACKAGE) -> set[str]:
    """Every ``module:function`` (a method or nested function counts as its outermost definition) whose code
    branches on CUDA, read from the source."""
    found = set()
    for path in sorted(package.rglob("*.py")):
        module = ".".join(path.relative_to(package).with_suffix("").parts)
        if module.split(".")[0] == "gpu_check":  # the check itself, a package
            continue
        source = path.read_text()
        owner = {}
        for node in ast.parse(source).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                owner.update(dict.fromkeys(range(node.lineno, node.end_lineno + 1), node.name))
        for number, line in enumerate(source.splitlines(), 1):
            if CUDA_BRANCH.search(line.split("#")[0]) and number in owner:
                found.add(f"{module}:{owner[number]}")
    return found


def test_every_cuda_branch_has_a_path_or_a_reason():
    from workshop_utils.gpu_check.notebooks import NOTEBOOK_RUNS

    covered = ({entry for path in PATHS for entry in path.covers} | {entry for run in NOTEBOOK_RUNS for entry in run.covers}
               | set(gpu_check.ELSEWHERE))
    missing = sorted(cuda_branches() - covered)
    assert not missing, f"CUDA-only code no GPU-check path runs (add it to a path's covers, or to ELSEWHERE): {missing}"


def test_every_covered_name_exists():
    for path in PATHS:
        for entry in path.covers:
            module, name = entry.split(":")
            assert hasattr(importlib.import_module(f"workshop_utils.{module}"), name), f"{path.name}: {entry}"


@pytest.mark.parametrize("line", ["if device.type == 'cuda': pass", 'if env["device_type"] == "cuda": pass',
                                  "device = collective_device()", "check_fp8(device)", "x.to(torch.float8_e4m3fn)"])
def test_the_scanner_sees_a_new_cuda_branch(tmp_path, line):
    (tmp_path / "fresh.py").write_text(f"def new_path(device):\n    {line}\n    pass\n\n\n"
                                       "def plain(device):\n    return device\n")
    assert cuda_branches(tmp_path) == {"fresh:new_path"}


# ---------------------------------------------------------------- what each path reaches


@functools.lru_cache(maxsize=None)
def _definitions(package: Path = PACKAGE) -> dict[str, list]:
    """Every function, class and method of the package by its own name: [(``module:Outer``, its AST node)]."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        module = ".".join(path.relative_to(package).with_suffix("").parts)
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.setdefault(node.name, []).append((f"{module}:{node.name}", node))
                for item in getattr(node, "body", []) if isinstance(node, ast.ClassDef) else []:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        found.setdefault(item.name, []).append((f"{module}:{node.name}", item))
            elif isinstance(node, ast.Assign):  # a module's constant: a table of functions, a module to launch
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found.setdefault(target.id, []).append((f"{module}:{target.id}", node))
    return found


# Names that would reach everything: commands are run as processes (their main, followed below), never called.
_NOT_FOLLOWED = {"main", "run", "__init__", "__call__", "__enter__", "__exit__"}
_LAUNCHED = re.compile(r"^workshop_utils\.([\w.]+)$")


def _names(tree) -> set[str]:
    """The names a piece of code uses (called, passed on or looked up as an attribute), and ``module:main`` for every
    module of the package it starts as a process (``python -m workshop_utils.train``, torchrun's module)."""
    launched = {f"{m.group(1)}:main" for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                for m in [_LAUNCHED.match(n.value)] if m}
    return ({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            | {n.name.split(".")[-1] for n in ast.walk(tree) if isinstance(n, ast.alias)}) - _NOT_FOLLOWED | launched


_USES: dict[int, set[str]] = {}  # a definition's names, read once per node: the package is walked for every path


def reached(roots: set[str], definitions: dict) -> set[str]:
    """``module:Outer`` of every definition the names ``roots`` lead to, following the names each one uses."""
    seen, nodes, frontier = set(), set(), set(roots)
    while frontier:
        name = frontier.pop()
        found = definitions.get(name, []) if ":" not in name else [
            (qualified, node) for qualified, node in definitions.get(name.split(":")[1], []) if qualified == name]
        for qualified, node in found:
            if id(node) not in nodes:
                nodes.add(id(node))
                seen.add(qualified)
                if id(node) not in _USES:
                    _USES[id(node)] = _names(node)
                frontier |= _USES[id(node)]
    return seen


def path_roots(run) -> set[str]:
    """The names a path's function starts from: its source, and what its closure holds (a demo's part, a part's
    function)."""
    import inspect
    import textwrap

    from workshop_utils.parallel_demos import PARTS

    roots = _names(ast.parse(textwrap.dedent(inspect.getsource(run))))
    for benchmark in re.findall(r'_load_benchmark\("(\w+)"\)', inspect.getsource(run)):  # a script of benchmarks/
        roots |= _names(ast.parse((PACKAGE.parent / "benchmarks" / f"{benchmark}.py").read_text()))
    for cell in run.__closure__ or ():
        value = cell.cell_contents
        if isinstance(value, str) and value in PARTS:
            roots.add(PARTS[value].__name__)
        for held in (value, getattr(value, "run", None)):
            if callable(held) and getattr(held, "__name__", "<")[0] != "<":
                roots |= _names(ast.parse(textwrap.dedent(inspect.getsource(held))))
    return roots


def test_every_path_covers_only_what_it_reaches():
    """A path that names a branch it never runs hides that branch from the test above (the collectives path named
    measure_all_reduce, which runs only under notebook 02's all-reduce sweep)."""
    from workshop_utils.gpu_check.notebooks import NOTEBOOK_RUNS, find_notebook

    definitions = _definitions()
    unreached = {path.name: sorted(set(path.covers) - reached(path_roots(path.run), definitions)) for path in PATHS}
    notebooks = PACKAGE.parent / "notebooks"
    for run in NOTEBOOK_RUNS:
        cells = json.loads(find_notebook(notebooks, run.prefix).read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        roots = _names(ast.parse("\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))))
        unreached[f"notebook {run.prefix}"] = sorted(set(run.covers) - reached(roots, definitions))
    assert not {name: gaps for name, gaps in unreached.items() if gaps}


def test_a_path_the_gpu_run_leaves_to_a_notebook_is_one_that_notebook_reaches_whole():
    """The GPU run leaves out a check's path when a notebook's full run covers it: every branch that path covers must
    then be reached from the notebook's own cells."""
    from workshop_utils.gpu_check.notebooks import NOTEBOOK_RUNS, find_notebook

    definitions, by_name = _definitions(), {path.name: path for path in PATHS}
    for run in NOTEBOOK_RUNS:
        cells = json.loads(find_notebook(PACKAGE.parent / "notebooks", run.prefix).read_text())["cells"]
        reach = reached(_names(ast.parse("\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code"))),
                        definitions)
        gaps = {name: sorted(set(by_name[name].covers) - reach) for name in run.replaces}
        assert not {name: gap for name, gap in gaps.items() if gap}, f"notebook {run.prefix}"


def test_the_reach_of_a_path_tells_a_wrong_cover():
    from workshop_utils.gpu_check.workloads import two_gpu_demo

    definitions = _definitions()
    timed = reached(path_roots(two_gpu_demo("collectives-time", max_mib=16)), definitions)
    assert "parallel.collectives:time_collectives" in timed and "parallel.collectives:measure_all_reduce" not in timed


def test_path_names_are_unique_and_every_path_says_what_it_checks():
    names = [path.name for path in PATHS]
    assert len(names) == len(set(names))
    assert all(path.what and path.covers for path in PATHS)
    assert {path.name for path in PATHS if path.gpus > 1} >= {"ddp-nccl", "fsdp2", "tensor-parallel", "ddp-overlap"}


def _ctx(tmp_path) -> Context:
    return Context(torch.device("cpu"), tmp_path)


def _boom(ctx):
    raise ValueError("boom\nsecond line")


def test_a_failing_path_is_one_line_naming_it_and_the_others_still_run(tmp_path):
    lines = []
    paths = [GpuPath("first", "x", ("a:b",), _boom), GpuPath("second", "y", ("a:b",), lambda ctx: "fine"),
             GpuPath("third", "z", ("a:b",), lambda ctx: (_ for _ in ()).throw(Failed("wrong answer")))]
    verdicts = run_paths(paths, _ctx(tmp_path), budget_s=60, gpus=0, say=lines.append)
    assert [v.status for v in verdicts] == ["failed", "ok", "failed"]
    assert len(lines) == 3 and all("\n" not in line for line in lines)
    assert lines[0].startswith("✗ first") and "ValueError: boom" in lines[0] and "second line" not in lines[0]
    assert "test_gpu_check.py" not in lines[0]  # only the kit's own frames are named
    assert lines[2].endswith("failed: wrong answer")


def test_the_budget_stops_a_running_path_and_says_what_was_not_reached(tmp_path):
    def slow(ctx):
        time.sleep(30)
        return "never"

    paths = [GpuPath("slow", "x", ("a:b",), slow, least_s=0.1), GpuPath("after", "y", ("a:b",), lambda c: "ok", least_s=1)]
    began = time.monotonic()
    verdicts = run_paths(paths, _ctx(tmp_path), budget_s=1, gpus=0, say=lambda line: None)
    assert time.monotonic() - began < 20  # stopped by the check's own alarm, long before the sleep ends
    assert [v.status for v in verdicts] == ["not reached", "not reached"]
    assert "budget ran out" in verdicts[0].detail and "budget left" in verdicts[1].detail
    assert "2 not reached (slow, after)" in summary_line(verdicts, 1.0, 1)


def test_a_path_is_not_started_without_the_time_it_needs(tmp_path):
    ticks = iter(range(0, 1000, 50))
    ran = []
    paths = [GpuPath("long", "x", ("a:b",), lambda c: ran.append(1) or "ran", least_s=100)]
    verdicts = run_paths(paths, _ctx(tmp_path), budget_s=120, gpus=0, say=lambda line: None,
                         clock=lambda: next(ticks))
    assert verdicts[0].status == "not reached" and not ran


def test_two_gpu_paths_are_listed_as_not_checked_on_one_gpu(tmp_path):
    ran = []
    paths = [GpuPath("pair", "x", ("a:b",), lambda c: ran.append(1) or "ran", gpus=2)]
    gpu_ctx = Context(torch.device("cuda", 0), tmp_path)
    verdicts = run_paths(paths, gpu_ctx, budget_s=60, gpus=1, say=lambda line: None)
    assert verdicts[0].status == "not checked" and "needs 2 GPUs, this node has 1" in verdicts[0].detail and not ran
    assert "1 not checked here (pair: need 2 GPUs)" in summary_line(verdicts, 1, 60)


def test_gpu_only_paths_say_so_in_a_cpu_rehearsal(tmp_path):
    verdicts = run_paths([p for p in PATHS if p.name in ("nvml-monitor", "cuda-graphs", "grad-scaler")],
                         _ctx(tmp_path), budget_s=60, gpus=0, say=lambda line: None)
    assert [v.status for v in verdicts] == ["skipped"] * 3
    assert all("needs a GPU" in v.detail for v in verdicts)


def test_without_a_gpu_the_command_is_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stop:
        gpu_check.main([])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and "--device cpu" in err[0]


@pytest.mark.parametrize("argv", [["--budget", "0"], ["--only", "no-such-path"], ["--device", "tpu"], ["--budget", "x"]])
def test_bad_arguments_are_one_line(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        gpu_check.main(argv)
    assert stop.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_rehearsal_writes_the_record_with_its_environment(tmp_path, capsys):
    code = gpu_check.main(["--device", "cpu", "--only", "cuda-events", "peak-memory", "nvml-monitor",
                           "--run-dir", str(tmp_path / "run")])
    out = capsys.readouterr().out
    record = json.loads((tmp_path / "run" / "gpu_check.json").read_text())
    assert code == 0 and record["kind"] == "gpu_check"
    assert [p["status"] for p in record["paths"]] == ["ok", "ok", "skipped"]
    assert {"device_name", "driver", "cuda", "torch", "date"} <= set(record["environment"])
    assert record["summary"] in out and "2 of 3 paths passed" in record["summary"]


# ---------------------------------------------------------------- the third audit's fixes


# Both trainings in a fresh process: on a CPU the peak is the process's resident memory, and a long test session's
# heap (what hundreds of earlier tests freed, or not) once moved the second run's training peak by 65 MiB.
TWO_EVALUATION_SIZES = """
import json, torch, workshop_utils as wu
torch.set_num_threads(1)
corpus = wu.load_text(quiet=True)
def run(test_size):
    config = wu.TrainConfig(model="gpt", batch_size=4, max_steps=3, warmup_steps=1, optimizer="adamw", lr=1e-3,
                            test_size=test_size, eval_batch_size=1024, progress=False, device="cpu")
    return wu.train(config, corpus).metrics
print(json.dumps([run(8), run(1024)]))
"""


@pytest.mark.slow
def test_training_peak_memory_leaves_the_evaluation_out():
    """Audit item 1: the same training with 8 or 1,024 evaluation sequences reported 37 against 447 MiB."""
    done = subprocess.run([sys.executable, "-c", TWO_EVALUATION_SIZES], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    small, large = json.loads(done.stdout.strip().splitlines()[-1])
    assert large["eval_peak_memory_mib"] > large["peak_memory_mib"]  # the logits of 1,024 sequences are counted there
    assert large["peak_memory_mib"] < small["peak_memory_mib"] + 64


def test_a_token_model_evaluates_within_the_logits_budget():
    """Audit item 2: GPT-2 small's 512-sequence evaluation batch took about 174 GiB in one forward pass."""
    big = wu.build_gpt("tiny")
    big.size = wu.GPT_SIZES["gpt2-small"]  # only the vocabulary is read
    rows = losses.evaluation_chunks(big, torch.zeros(512, 1024, dtype=torch.long))
    assert rows * 1024 * 50304 <= losses.EVAL_LOGITS_BUDGET and rows >= 1
    assert losses.evaluation_chunks(wu.build_model("simplecnn"), torch.zeros(512, 3, 32, 32)) == 512


def test_chunked_evaluation_gives_the_unchunked_result(monkeypatch, corpus, one_thread):
    model = wu.build_gpt("tiny").eval()
    loader = wu.make_token_loader("device", corpus.val_tokens, 64, 16, torch.device("cpu"), train=False,
                                  limit=16)
    whole = losses.evaluate(model, loader, torch.device("cpu"), "fp32")
    monkeypatch.setattr(losses, "EVAL_LOGITS_BUDGET", 64 * 256 * 3)  # three sequences a forward pass
    chunked = losses.evaluate(model, loader, torch.device("cpu"), "fp32")
    assert chunked[0] == pytest.approx(whole[0], rel=1e-6) and chunked[1] == whole[1]


def test_the_gpt_computes_its_loss_inside_its_forward_pass(monkeypatch, corpus, one_thread):
    """Audit item 3: the loss and the argmax outside the compiled model cost a step 23 GB of traffic on a GPU."""
    model = wu.build_gpt("tiny")
    tokens = torch.randint(0, 256, (2, 32))
    targets = torch.randint(0, 256, (2, 32))
    loss, correct = model(tokens, targets)
    logits = model(tokens)
    assert loss.item() == pytest.approx(losses.predictions_loss(logits, targets).item(), rel=1e-6)
    assert correct.item() == (logits.argmax(-1) == targets).sum().item()
    calls = []
    original = wu.GPT.forward
    monkeypatch.setattr(wu.GPT, "forward", lambda self, *args: calls.append(len(args)) or original(self, *args))
    config = wu.TrainConfig(model="gpt", batch_size=4, max_steps=2, warmup_steps=0, optimizer="adamw", lr=1e-3,
                            test_size=4, progress=False, device="cpu")
    wu.train(config, corpus)
    assert 2 in calls  # training passes (tokens, targets); evaluation passes tokens alone


def test_the_overlap_measurement_runs_in_bf16_on_gpus():
    """Audit item 4: an fp32 backward pass (about 100 ms for GPT-2 small) hides any 2-3 ms all-reduce."""
    import inspect

    from workshop_utils.parallel import overlap

    source = inspect.getsource(overlap.measure_overlap)
    assert '"bf16" if device.type == "cuda"' in source and "autocast(precision, device)" in source


def test_data_wait_leaves_the_copy_to_the_device_out(monkeypatch, tiny_data):
    """Audit item 6: from unpinned memory the copy waits for earlier GPU work, which is not the loader's time."""
    original = torch.Tensor.to

    def slow_copy(self, *args, **kwargs):
        if "non_blocking" in kwargs:  # the loader's copy of a batch to its device
            time.sleep(0.3)
        return original(self, *args, **kwargs)

    loader = wu.make_loader("torch", tiny_data.train_images[:64], tiny_data.train_labels[:64], 16,
                            torch.device("cpu"), train=True)
    monkeypatch.setattr(torch.Tensor, "to", slow_copy)
    waits = []
    for _ in loader.epoch(0):
        waits.append(loader.last_wait_s)
    assert len(waits) == 4 and max(waits) < 0.3


def test_data_wait_counts_the_start_of_non_persistent_workers(monkeypatch, tiny_data):
    """Workers that are not persistent start again every epoch (200-250 ms an epoch, unseen by the data wait)."""
    from torch.utils.data import DataLoader

    original = DataLoader.__iter__

    def slow_start(self):
        time.sleep(0.3)  # the workers' fork and imports
        return original(self)

    loader = wu.make_loader("torch", tiny_data.train_images[:64], tiny_data.train_labels[:64], 16,
                            torch.device("cpu"), train=True)
    monkeypatch.setattr(DataLoader, "__iter__", slow_start)
    for epoch in range(2):
        waits = []
        for _ in loader.epoch(epoch):
            waits.append(loader.last_wait_s)
        assert len(waits) == 4 and waits[0] >= 0.3 and max(waits[1:]) < 0.3  # the start is the first batch's wait


@pytest.mark.parametrize("name, precision, peak", [
    ("NVIDIA H200 NVL", "bf16", 835.5), ("NVIDIA H200", "bf16", 989.4), ("Tesla V100-PCIE-32GB", "fp32", 14.0),
    ("Tesla V100S-PCIE-32GB", "fp32", 16.4), ("Tesla V100-SXM2-32GB", "fp32", 15.7),
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4), ("NVIDIA H100 NVL", "bf16", 835.5)])
def test_peak_table_tells_the_pcie_parts_from_the_sxm_ones(name, precision, peak):
    """Audit item 7: "H200" also matched the H200 NVL, "V100" gave the SXM2's fp32 peak to a V100 PCIe."""
    assert peak_tflops(name, precision) == peak
