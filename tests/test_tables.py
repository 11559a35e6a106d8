"""Tables people can read, and check lines people see: ``wu.show_table`` and ``wu.show_verdict``.

The helper is held to the issue's rules (numbers rounded to what they mean, units in readable headers, no
index, no empty or constant column, no text cut short), and every table notebooks 01-05 show goes through it.
Notebook 01's FLOPs-per-byte figures are held to what the layers compute.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import workshop_utils as wu
from workshop_utils.system.display import format_number, readable_header, verdict_html

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted(p for p in (ROOT / "notebooks").glob("0[1-5]_*.ipynb"))


# ---------------------------------------------------------------- the helper's rules


def test_numbers_read_as_what_they_mean():
    assert format_number(155.295310) == "155"
    assert format_number(1459.0) == "1,459"
    assert format_number(65504.0) == "65,504"
    assert format_number(12.3456) == "12.3"
    assert format_number(0.5) == "0.5"
    assert format_number(0.04123) == "0.0412"
    assert format_number(5.960464e-08) == "5.96e-08"
    assert format_number(3.402823e38) == "3.40e+38"
    assert format_number(float("nan")) == "—" and format_number(None) == "—"


def test_the_format_table_says_65504_as_the_sentence_does():
    table = wu.show_table(wu.format_table())
    text = str(table)
    assert "65,504" in text and "6.550400e+04" not in text
    assert "format" in table.columns  # the index became a column, and no index is shown
    assert "row_heading" not in table._repr_html_()


def test_headers_carry_their_units():
    assert readable_header("samples_per_s") == "samples/s"
    assert readable_header("tokens_per_s") == "tokens/s"
    assert readable_header("step_ms_median") == "step (ms, median)"
    assert readable_header("peak_memory_mib") == "peak memory (MiB)"
    assert readable_header("blocked_ms_per_save") == "blocked (ms per save)"
    assert readable_header("test loss (nats/token)") == "test loss (nats/token)"  # already written for a reader


def test_empty_and_constant_columns_are_dropped_unless_kept():
    frame = pd.DataFrame({"rung": ["a", "b", "c"], "samples_per_s": [1.0, 2.5, 3.25], "mfu": [None, None, None],
                          "device": ["cpu", "cpu", "cpu"], "note": ["", "", ""]})
    assert wu.show_table(frame).columns == ["rung", "samples/s"]
    assert "device" in wu.show_table(frame, keep=("device",)).columns
    one_row = wu.show_table(frame.iloc[:1])  # in one row every column is constant: nothing to drop for that
    assert "device" in one_row.columns


def test_long_text_is_never_cut():
    note = "not applicable: " + "a reason long enough to pass pandas' fifty characters " * 3
    table = wu.show_table(pd.DataFrame({"rung": ["x", "y"], "note": [note, "short"]}))
    assert note in str(table) and note in table._repr_html_()


def test_the_environment_leaves_gpu_libraries_out_without_a_gpu():
    env = {"device_name": "cpu", "device_type": "cpu", "torch": "2.11", "cuda": "13.0", "cudnn": 92400,
           "nccl": "2.27", "python": "3.11", "cpu_cores": 2, "gpus": [], "slurm": {}}
    text = str(wu.show_environment(env))
    assert "13.0" not in text and "92400" not in text and "2.11" in text


cells = st.one_of(st.floats(allow_nan=True, allow_infinity=False, width=64), st.integers(-10**9, 10**9),
                  st.none(), st.text(max_size=120))


@settings(max_examples=60, deadline=None)
@example(rows=[(None, 0.0625, 0)])  # three significant figures need four decimals below 0.1
@given(st.lists(st.tuples(cells, st.floats(-1e9, 1e9), st.integers(0, 10**7)), min_size=1, max_size=6))
def test_any_frame_follows_the_rules(rows):
    frame = pd.DataFrame(rows, columns=["mixed_value", "step_ms_median", "count"])
    table = wu.show_table(frame.set_index("count") if len(rows) % 2 else frame)
    html, text = table._repr_html_(), str(table)
    assert "row_heading" not in html  # no index column
    for header in table.columns:
        assert "_ms" not in header and "_per_s" not in header
    for column in table.columns:
        values = table.text[column]
        assert len(set(values)) > 1 or len(values) == 1, "a constant column was kept"
        assert not all(v == "—" for v in values) or len(values) == 1, "an empty column was kept"
        for shown in values:
            assert not re.fullmatch(r"-?[\d,]+\.0", shown), f"{shown}: a whole number with a decimal point"
            if re.fullmatch(r"-?\d+\.\d+", shown):  # three significant figures: 12.3, 0.0412 (zeros in front count not)
                assert len(shown.lstrip("-").replace(".", "").lstrip("0")) <= 3, f"{shown}: more digits than it means"
            assert not re.fullmatch(r"-?\d{4,}(\.\d+)?", shown), f"{shown}: thousands without separators"
    for value in frame["mixed_value"]:
        if isinstance(value, str) and value.strip() and "mixed value" in table.columns:
            assert value in list(table.text["mixed value"])  # never cut


# ---------------------------------------------------------------- check lines


def test_a_verdict_is_plain_text_outside_a_notebook_and_bold_colour_inside(capsys):
    wu.show_verdict("✓ Exercise 9.9: correct.")
    assert capsys.readouterr().out == "✓ Exercise 9.9: correct.\n"
    shown = verdict_html("✗ Exercise 9.9: wrong <b>.")
    assert "font-weight: bold" in shown and "#cf222e" in shown and "&lt;b&gt;" in shown


def test_the_check_lines_are_shown_in_one_place():
    """Every ✓/⚠/? line of a check goes through show_verdict (✗ lines are WorkshopErrors: the red error line)."""
    printed = []
    for path in (ROOT / "workshop_utils").rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bprint\(f?[\"'](✓|⚠|\? What)", line):
                printed.append(f"{path.relative_to(ROOT)}:{number}")
    assert not printed, printed


# ---------------------------------------------------------------- every table a notebook shows


# Last expressions that show no table; and PyTorch's own profiler table, which notebook 04's plain-PyTorch cell
# prints as the API shows it (the cell teaches that API line by line).
NOT_TABLES = {"wu.read_dist_env()", "dist.destroy_process_group()"}
PLAIN_API_TABLES = ("prof.key_averages().table(",)


def _code_cells(notebook: Path):
    return [c for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]


def _is_show_call(node) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "wu"
            and node.func.attr in ("show_table", "show_environment"))


@pytest.mark.parametrize("notebook", LESSONS, ids=lambda p: p.stem)
def test_every_table_a_notebook_shows_goes_through_show_table(notebook):
    wrong = []
    for cell in _code_cells(notebook):
        tree = ast.parse(cell.source)
        last = tree.body[-1] if tree.body else None
        shown = isinstance(last, ast.Expr) and not cell.source.rstrip().endswith(";")
        if shown and not _is_show_call(last.value):
            is_print = isinstance(last.value, ast.Call) and getattr(last.value.func, "id", "") == "print"
            if not is_print and ast.unparse(last.value) not in NOT_TABLES:
                wrong.append(f"cell {cell.id}: shows `{ast.unparse(last.value)[:70]}`")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "display":
                if not all(_is_show_call(arg) for arg in node.args):
                    wrong.append(f"cell {cell.id}: display({ast.unparse(node.args[0])[:60]})")
            if isinstance(node, ast.Attribute) and node.attr in ("to_string", "to_markdown", "to_html"):
                wrong.append(f"cell {cell.id}: .{node.attr}()")
        if "print(" in cell.source and ".table(" in cell.source and not any(p in cell.source for p in PLAIN_API_TABLES):
            wrong.append(f"cell {cell.id}: prints a table")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("notebook", LESSONS, ids=lambda p: p.stem)
def test_report_sections_are_written_in_one_cell_out_of_the_lessons_way(notebook):
    writers = [c for c in _code_cells(notebook) if "add_report_section" in c.source]
    assert len(writers) == 1, [c.id for c in writers]
    statements = ast.parse(writers[0].source).body
    # nothing but the sections (and the names they read) in that cell: no lesson code hides in it
    assert all("add_report_section" in ast.unparse(s) or isinstance(s, ast.Assign) for s in statements)


# ---------------------------------------------------------------- notebook 01's FLOPs per byte


def test_flops_per_byte_of_simplecnn_and_the_tiny_gpt_are_what_the_issue_measured():
    with torch.device("meta"):
        cnn = wu.layer_intensities(wu.build_model("simplecnn"), torch.zeros(64, 3, 32, 32))
        gpt = wu.layer_intensities(wu.build_model("gpt", size="tiny"), torch.zeros(16, 128, dtype=torch.long))
    convs = cnn[cnn.layer.str.startswith("features")]
    assert [round(v, 1) for v in convs.flop_per_byte] == [9.5, 52.0, 99.6]
    assert convs.flops_share.iloc[0] < 0.05 and convs.flops_share.iloc[1:].sum() > 0.9
    mlp = gpt[gpt.layer.str.endswith("mlp.fc")].flop_per_byte.iloc[0]
    assert round(mlp) == 49
    # at the cpu profile's sizes the CNN's matmuls do more per byte than the tiny GPT's: notebook 01 says so from
    # these numbers, not from a sentence typed for GPT-2 small
    assert cnn.attrs["weighted"] > gpt.attrs["weighted"]
    assert math.isclose(cnn.flops_share.sum(), 1.0)


def test_notebook_01_computes_the_comparison_and_the_anchor_on_the_validation_split():
    source = "\n".join(c.source for c in _code_cells(LESSONS[0]))
    assert "wu.layer_intensities(" in source and "matmul_intensity(" not in source
    assert "unigram_entropy(text.val_tokens)" in source and "unigram_entropy(text.train_tokens)" not in source
