"""Exercise 6.1's judge of a job script as text, before sbatch or bash reads a word of it (a byte-order mark, DOS
line ends, look-alike spaces, an escaped space at a line's end, sh for bash), and as bash reads it whole: a
loop never closed or a quote left open (``bash -n``).
"""

from __future__ import annotations

import re
import shutil
import subprocess

from .answer_values import show


# Spaces that sbatch (C's isspace) and bash do not split on, though they look like one.
_ODD_SPACES = re.compile("[\u00a0\u1680\u2000-\u200b\u202f\u205f\u3000]")
_LONGEST_WORD = 10_000
# Dashes that look like a hyphen in slides and PDFs (en, em, minus...), at the start of what would be an option.
# A soft hyphen (U+00AD) is one too, though no font shows it.
_ODD_DASHES = re.compile("(?:^|[\\s=])([\u00ad\u2010-\u2015\u2212\ufe58\ufe63\uff0d]+)[A-Za-z0-9]")


def text_problem(script: str) -> str | None:
    """What is wrong with the script's text as text, before sbatch or bash reads a word of it."""
    try:
        script.encode("utf-8")
    except UnicodeEncodeError as err:
        return (f"the script holds a character that is no text (U+{ord(script[err.start]):04X}, half of a "
                "surrogate pair), which no file can hold. Fix: type that character again, or remove it.")
    if script.startswith("\ufeff"):
        return ("the script starts with a byte-order mark (BOM, U+FEFF), so its first line is not #!: sbatch refuses "
                "it. Fix: save it as UTF-8 without BOM.")
    if "\r" in script:
        kind = "DOS line breaks (\\r\\n)" if "\r\n" in script else "old Mac line breaks (\\r alone)"
        return (f"the script has {kind}: sbatch refuses such a script before it queues anything. "
                "Fix: save it with Unix line breaks (dos2unix, or your editor's line-ending setting).")
    odd = _ODD_SPACES.search(script)
    if odd:
        line = script.count("\n", 0, odd.start()) + 1
        return (f"line {line} holds a U+{ord(odd.group()):04X} space (a non-breaking space, often pasted from a web "
                "page or PDF): sbatch and bash do not take it for a space, so it sticks to the word beside it. Fix: "
                "replace it with a plain space.")
    for number, line in enumerate(script.split("\n"), 1):
        code_part = re.sub(r"'[^']*'|\"[^\"]*\"", "", line)  # quoted text is data, not options
        code_part = re.sub(r"(^|\s)#(?!SBATCH).*", "", code_part)  # and a comment is neither
        found = _ODD_DASHES.search(code_part)
        if found is None or (line.lstrip().startswith("#") and not line.lstrip().startswith("#SBATCH")):
            continue  # none, or a comment's dash
        code = ord(found.group(1)[0])
        looks = "an invisible soft hyphen" if code == 0xAD else "a dash that looks like a hyphen"
        return (f"line {number} holds {show(found.group(1))} (U+{code:04X}, {looks}, often pasted from slides or a "
                "PDF) where an option starts: sbatch, srun, torchrun and kill take only the plain hyphen-minus, so "
                "they do not see that option. Fix: type the option's hyphens again.")
    if len(script) > 50 * _LONGEST_WORD or re.search(r"\S{%d}" % (_LONGEST_WORD + 1), script):
        return (f"the script holds a word longer than {_LONGEST_WORD} characters (or is longer than "
                f"{50 * _LONGEST_WORD}), which no job script needs. Fix: "
                "the template, its gaps filled.")
    escaped = re.search(r"(?<!\\)(?:\\\\)*\\[ \t]+\n", script)
    if escaped:
        line = script.count("\n", 0, escaped.start()) + 1
        return (f"line {line} ends in a backslash and a space: bash escapes the space, not the line break, so the "
                "command ends there and the next line runs as a command of its own. Fix: nothing after the backslash.")
    shebang = script.split("\n", 1)[0]
    shell = re.fullmatch(r"#!\s*(?:/usr)?/bin/(?:env\s+)?(\S+).*", shebang)
    if shell and shell.group(1) in ("sh", "dash") and re.search(r"pipefail|<\(|\[\[|=\(|\$\{[^}]*\[|\blet\b", script):
        return (f"{shebang} runs the script in sh, which is dash on Debian and Ubuntu: it stops at bash's own "
                "features (set -o pipefail, arrays, <(...)). Fix: #!/bin/bash as the first line.")
    interpreter = re.fullmatch(r"#!\s*(\S+)(?:\s+(\S+))?.*", shebang)
    program = interpreter and (interpreter.group(2) if interpreter.group(1).endswith("/env") else interpreter.group(1))
    if program and program.rsplit("/", 1)[-1] in ("zsh", "ksh", "mksh", "csh", "tcsh", "fish", "python", "python3"):
        return (f"{shebang} runs the script in {program.rsplit('/', 1)[-1]}, not bash: its traps, waits and arrays "
                "differ from the bash the template is written in. Fix: #!/bin/bash as the first line.")
    return None


def syntax_problem(script: str) -> str | None:
    """bash's own reading of the whole script (``bash -n``): a loop never closed or a quote left open stops bash
    before the command that holds it runs. None when bash reads it, or where there is no bash to ask."""
    bash = shutil.which("bash")
    if bash is None:
        return None
    try:
        checked = subprocess.run([bash, "-n"], input=script, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if checked.returncode == 0:
        return None
    said = next((line for line in checked.stderr.splitlines() if "syntax error" in line or "unexpected" in line),
                checked.stderr.strip().splitlines()[0] if checked.stderr.strip() else "a syntax error")
    said = re.sub(r"^.*?bash: ", "", said)
    return (f"bash would not run it: {show(said, 160)} (what `bash -n` says of the script). The commands up to "
            "there run, the rest never does. Fix: close every loop, if and quote as the template does.")
