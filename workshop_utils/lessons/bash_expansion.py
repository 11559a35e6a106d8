"""bash's expansion of a job script's words: the script's own variables and arrays (assigned before the word
is read), the values of Slurm's variables that the #SBATCH lines fix, and the pieces known only when the job runs.

A word expands into parts: literal text, or a piece known only when the job runs: ("var", NAME) set by
Slurm or the system, ("unset", NAME) set by nothing, ("subst", COMMAND) a command substitution,
("procsub", COMMAND) a process substitution, ("arith", EXPRESSION) arithmetic the check cannot finish
before the job runs, ("param", TEXT) any other ${...}. ``${NAME:-WORD}`` and its kin, ``${NAME[0]}``,
``"${NAME[@]}"``, ``$[...]``, ``let``, ``read NAME < <(COMMAND)`` and ``mapfile -t NAME < <(COMMAND)`` are
followed as bash follows them.
"""

from __future__ import annotations

import re

from .bash_arithmetic import BashArithmeticError, Unreadable, arithmetic
from .bash_reader import (ASSIGNMENT, LEADING, NAME, Command, shell_commands, skip_backtick, skip_double, skip_group,
                          skip_quote, substitution)

# Set in every job's environment, their values known only on the node (SLURM_CPUS_PER_TASK and
# SLURM_NTASKS_PER_NODE only with their options: those come from the #SBATCH lines). The node counts stay
# unknown too: the script must serve any --nodes unchanged (see the judge's --nnodes).
RUNTIME = frozenset({
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_NTASKS",
    "SLURM_NPROCS", "SLURM_CPUS_ON_NODE", "SLURM_JOB_CPUS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_SUBMIT_DIR",
    "SLURM_SUBMIT_HOST", "SLURM_CLUSTER_NAME", "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT", "SLURM_NODEID",
    "SLURM_PROCID", "SLURM_LOCALID", "SLURMD_NODENAME", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
    "SLURM_RESTART_COUNT", "SLURM_JOB_UID", "SLURM_JOB_USER", "SLURM_TASK_PID", "SLURM_CONF", "SLURM_JOB_QOS",
    "SLURM_MEM_PER_NODE", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_TOPOLOGY_ADDR", "SLURM_JOB_NUM_NODES",
    "SLURM_NNODES", "HOME", "USER", "LOGNAME", "PATH", "PWD", "SHELL", "HOSTNAME", "TMPDIR", "LANG", "RANDOM",
    "BASHPID", "PPID",
})
SPECIAL = "@*#?$!-0123456789"
SPLIT = ("split",)  # where an unquoted expansion's value splits into two words
_OPERATOR = re.compile(r"([A-Za-z_][A-Za-z0-9_]*|[@*#?$!0-9-])(\[(?:[@*]|[0-9]+)\])?(:?[-=+?])(.*)", re.S)
_READ_OPTIONS = {"-r", "-s", "-e", "-t", "-rs", "-sr"}


def _first_line(command: str) -> str:
    return f'"$({command} | head -n 1)"'


# $(which torchrun), $(command -v torchrun), $(type -P torchrun): the program's path, which runs that program.
_PATH_LOOKUP = re.compile(r"\s*(?:which|command\s+-v|type\s+-P)\s+([\w.+-]+)\s*")


def _substituted(command: str):
    """A command substitution's part: the program's name where it only looks a program up on PATH."""
    found = _PATH_LOOKUP.fullmatch(command)
    return found.group(1) if found else ("subst", command)


class Shell:
    """A word's expansion in the batch shell: the script's own variables (assigned before the word is read),
    the values of Slurm's variables that the #SBATCH lines fix, and the pieces known only when the job runs."""

    def __init__(self, known: dict[str, str]):
        self.known = known  # SLURM_JOB_NUM_NODES and the like, from the #SBATCH lines
        self.assigned: dict[str, str] = {}  # NAME -> the word assigned, as written
        self.exported: set[str] = set()
        self.elsewhere: dict[str, str] = {}  # NAME -> where an assignment ran apart from the batch shell
        self.pieces: list = []  # the non-literal parts of encoded words, by index
        self.budget = 2_000  # expansions left: a script of variables made of variables stays quick
        self._evaluating: set[str] = set()
        self.arrays: dict[str, list[str] | tuple[str, str]] = {}  # NAME -> its element words, or ("lines", COMMAND)
        self._vanished = False  # an "${A[@]}" of no elements: the word gives no argument at all
        self.allexport = False  # set -a: every assignment is exported

    def _read(self, command: Command, words: list[str]) -> bool:
        """``read NAME`` / ``mapfile -t NAME`` from a process substitution or here-string of one command:
        the first line of its output, or its lines."""
        source = None
        from_ = self.parts(command.stdin) if command.stdin else self.parts(command.herestring or "")
        if len(from_) == 1 and not isinstance(from_[0], str) and from_[0][0] in ("procsub", "subst"):
            source = from_[0][1]
        names = [w for w in words[1:] if NAME.fullmatch(w)]
        if command.where or not names:
            return True
        if words[0] == "read" and all(w in _READ_OPTIONS or NAME.fullmatch(w) for w in words[1:]):
            self.assigned[names[0]] = _first_line(source) if source else "${" + names[0] + "@read}"
            for name in names[1:]:
                self.assigned[name] = "${" + name + "@read}"
        elif words[0] in ("mapfile", "readarray") and source:
            self.arrays[names[-1]] = ("lines", source)
        return True

    def _let(self, words: list[str]) -> bool:
        for word in words[1:]:
            text = "".join(p if isinstance(p, str) else "\x00" for p in self.parts(word))
            found = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=([^=].*)", text, re.S)
            if found and "\x00" not in text:
                self.assigned[found.group(1)] = f"$(({found.group(2)}))"
        return True

    def assign(self, command: Command, take: bool = True) -> bool:
        """Take a command that only assigns (``A=1 B=2``, ``export A=1``, ``declare -x A=1``); False otherwise.
        An assignment that runs apart from the batch shell is noted (``elsewhere``), never taken; with ``take``
        False (after the launch, which cannot see it) it is only recognised."""
        words, start = command.words, 0
        while start < len(words) and words[start] in LEADING:
            start += 1
        if start < len(words) and words[start] in ("read", "mapfile", "readarray") and take:
            return self._read(command, words[start:])
        if start < len(words) and words[start] == "let" and take and not command.where:
            return self._let(words[start:])
        builtin = words[start] if start < len(words) and words[start] in (
            "export", "declare", "typeset", "readonly", "local") else None
        rest = words[start + bool(builtin):]
        options = [w for w in rest if builtin and w.startswith(("-", "+"))]
        rest = [w for w in rest if not (builtin and w.startswith(("-", "+")))]
        matches = [ASSIGNMENT.fullmatch(w) for w in rest]
        if builtin is None and (not rest or not all(matches)):
            return False
        # export -n and declare +x take the export back; set -a exports every assignment after it
        unexported = (builtin == "export" and "-n" in options) or (
            builtin in ("declare", "typeset") and any(o.startswith("+") and "x" in o for o in options))
        exported = not unexported and (builtin == "export" or self.allexport or (
            builtin in ("declare", "typeset") and any(o.startswith("-") and "x" in o for o in options)))
        for text, found in zip(rest, matches if take else []):
            name = found.group(1) if found else (text if NAME.fullmatch(text) else None)
            if name is None:
                continue
            if command.where:
                self.elsewhere.setdefault(name, command.where)
                continue
            value = found.group(2) if found else None
            if value is not None and value.startswith("(") and value.endswith(")") and "[" not in text.split("=")[0]:
                elements = [w for c in shell_commands(value[1:-1]) if not c.nested for w in c.words]
                single = re.fullmatch(r"\$\((.*)\)", elements[0], re.S) if len(elements) == 1 else None
                self.arrays[name] = ("lines", single.group(1)) if single else elements
                self.assigned.pop(name, None)
            elif found:
                self.assigned[name] = value
                self.arrays.pop(name, None)
            if exported:
                self.exported.add(name)
            elif unexported:
                self.exported.discard(name)
        return True

    def unset(self, command: Command) -> bool:
        """Take ``unset NAME...`` (not ``-f``, which removes functions); False for any other command."""
        words = [w for w in command.words if w not in LEADING]
        if words[:1] != ["unset"] or "-f" in words:
            return False
        for name in words[1:] if not command.where else []:
            self.assigned.pop(name, None)
            self.exported.discard(name)
        return True

    def variable(self, name: str, quoted: bool, depth: int, hidden: frozenset) -> list:
        self.budget -= 1
        if name in self.assigned and name not in hidden and depth < 8 and self.budget > 0:
            parts = self.parts(self.assigned[name], depth + 1, hidden | {name})
            if quoted:
                return parts
            split = []  # an unquoted variable's value splits at white space into words
            for part in parts:
                if isinstance(part, str):
                    pieces = re.split(r"[ \t\n]+", part)
                    for k, piece in enumerate(pieces):
                        if k:
                            split.append(SPLIT)
                        if piece:
                            split.append(piece)
                else:
                    split.append(part)
            return split
        if name in self.known:
            return [self.known[name]]
        return [("var", name)] if name in RUNTIME or name in SPECIAL else [("unset", name)]

    def _element(self, name: str, index: str, quoted: bool, depth: int, hidden: frozenset) -> list | None:
        """``${NAME[INDEX]}`` of an array the script set; None where the check does not know it."""
        array = self.arrays.get(name)
        if array is None or depth >= 8:
            return None
        if isinstance(array, tuple):
            if index == "0":
                return self.parts(_first_line(array[1]), depth + 1, hidden)
            return [("subst", array[1])] if index in "@*" else None
        if index in ("@", "*"):
            out = []
            for k, element in enumerate(array):
                out += ([SPLIT] if k and (index == "@" or not quoted) else [" "] if k else [])
                out += self.parts(element, depth + 1, hidden)
            self._vanished = self._vanished or not array
            return out
        return self.parts(array[int(index)], depth + 1, hidden) if int(index) < len(array) else []

    def _is_set(self, name: str, index: str | None, colon: bool) -> bool | None:
        if index is not None:
            array = self.arrays.get(name)
            return bool(array) if array is not None else (None if name in self.assigned else False)
        if name in self.assigned:
            value = self.assigned[name]
            return (value != "" and value not in ('""', "''")) if colon else True
        if name in self.known or name in RUNTIME or name in SPECIAL:
            return True
        return False

    def _parameter(self, inner: str, quoted: bool, depth: int, hidden: frozenset) -> list:
        """``${NAME[INDEX]}``, ``${NAME-WORD}``, ``${NAME:-WORD}``, ``${NAME+WORD}``, ``${NAME:+WORD}`` (and
        ``=``), as bash expands them; ("param", inner) for anything else."""
        element = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[([@*]|[0-9]+)\]", inner)
        if element:
            found = self._element(element.group(1), element.group(2), quoted, depth, hidden)
            return [("param", inner)] if found is None else found
        found = _OPERATOR.fullmatch(inner)
        if not found or found.group(3).endswith("?") or depth >= 8:
            return [("param", inner)]
        name, index, operator, default = found.group(1), found.group(2), found.group(3), found.group(4)
        index = index[1:-1] if index else None
        state = self._is_set(name, index, operator.startswith(":"))
        if state is None:
            return [("param", inner)]
        if operator.endswith("+"):
            if not state:
                self._vanished = self._vanished or not quoted
            return self.parts(default, depth + 1, hidden) if state else []
        if state:
            value = (self._element(name, index, quoted, depth, hidden) if index is not None
                     else self.variable(name, quoted, depth, hidden))
            return [("param", inner)] if value is None else value
        return self.parts(default, depth + 1, hidden)

    def text_of(self, name: str) -> str:
        """A variable's value as text, for arithmetic; ``Unreadable`` when it is known only when the job runs
        or set by nothing."""
        if name in self._evaluating or self.budget <= 0:
            raise Unreadable(f"${name}")
        self.budget -= 1
        if name in self.assigned:
            self._evaluating.add(name)
            try:
                value = literal(self.parts(self.assigned[name]))
            finally:
                self._evaluating.discard(name)
        else:
            value = self.known.get(name)
        if value is None:
            raise Unreadable(f"${name}")
        return value

    def parts(self, word: str, depth: int = 0, hidden: frozenset = frozenset()) -> list:
        """The word's value: literal strings and the pieces the job will know (see above), in order."""
        parts: list = []

        def add(items):
            for item in items:
                if isinstance(item, str) and parts and isinstance(parts[-1], str):
                    parts[-1] += item
                elif item != "":
                    parts.append(item)

        def dollar(i: int, quoted: bool) -> int:
            after = word[i + 1:i + 2]
            if word.startswith("$((", i):
                j = skip_group(word, i + 1)
                expression = word[i + 3:j - 2] if word[j - 2:j] == "))" else word[i + 3:j]
                try:  # known before the job runs: bash's digits
                    add([str(arithmetic(expression, self.text_of))])
                except (BashArithmeticError, Unreadable, RecursionError):
                    add([("arith", expression)])
                return j
            if after == "(":
                j = substitution(word, i + 1, [], "")
                add([_substituted(word[i + 2:j - 1] if word[j - 1:j] == ")" else word[i + 2:j])])
                return j
            if after == "{":
                j = skip_group(word, i + 1)
                inner = word[i + 2:j - 1] if word[j - 1:j] == "}" else word[i + 2:j]
                if NAME.fullmatch(inner) or (len(inner) == 1 and inner in SPECIAL):
                    add(self.variable(inner, quoted, depth, hidden))
                else:
                    add(self._parameter(inner, quoted, depth, hidden))
                return j
            if after == "[":  # $[...], bash's old arithmetic
                j = skip_group(word, i + 1)
                expression = word[i + 2:j - 1] if word[j - 1:j] == "]" else word[i + 2:j]
                try:
                    add([str(arithmetic(expression, self.text_of))])
                except (BashArithmeticError, Unreadable, RecursionError):
                    add([("arith", expression)])
                return j
            found = NAME.match(word, i + 1)
            if found:
                add(self.variable(found.group(), quoted, depth, hidden))
                return found.end()
            if after and after in SPECIAL:
                add([("var", after)])
                return i + 2
            add(["$"])
            return i + 1

        i = 0
        while i < len(word):
            ch = word[i]
            if ch == "\\":
                add([word[i + 1:i + 2]])
                i += 2
            elif ch == "'":
                j = skip_quote(word, i)
                add([word[i + 1:j - 1] if word[j - 1:j] == "'" and j - 1 > i else word[i + 1:j]])
                i = j
            elif ch in "<>" and word[i + 1:i + 2] == "(":
                j = substitution(word, i + 1, [], "")
                add([("procsub", word[i + 2:j - 1] if word[j - 1:j] == ")" else word[i + 2:j])])
                i = j
            elif ch == '"':
                j = skip_double(word, i, [])
                end = j - 1 if j - 1 > i and word[j - 1] == '"' else j
                k = i + 1
                while k < end:
                    if word[k] == "\\" and k + 1 < end and word[k + 1] in '$`"\\\n':
                        add([word[k + 1]] if word[k + 1] != "\n" else [])
                        k += 2
                    elif word[k] == "$":
                        k = dollar(k, True)
                    elif word[k] == "`":
                        j2 = skip_backtick(word, k)
                        add([_substituted(word[k + 1:j2 - 1])])
                        k = j2
                    else:
                        add([word[k]])
                        k += 1
                i = j
            elif ch == "$":
                i = dollar(i, False)
            elif ch == "`":
                j = skip_backtick(word, i)
                add([_substituted(word[i + 1:j - 1])])
                i = j
            else:
                add([ch])
                i += 1
        return parts

    def fields(self, word: str) -> list[str]:
        """The word's expansion as the words a command receives, each encoded: literal text with every
        non-literal part as \\x00INDEX\\x01 (see ``decode``), so that argument parsers can read them."""
        out, current = [], ""
        self._vanished = False
        parts = self.parts(word)
        if not parts and (self._vanished or not re.search(r"[\"']", word)):
            return []  # an unquoted expansion to nothing, or "${A[@]}" of no elements: no argument
        for part in parts:
            if part is SPLIT:
                if current:
                    out.append(current)
                current = ""
            elif isinstance(part, str):
                current += part
            else:
                self.pieces.append(part)
                current += f"\x00{len(self.pieces) - 1}\x01"
        return out + [current] if current or not out else out

    def readable(self, text: str) -> str:
        """A message that quotes encoded words, with each non-literal part written as bash shows it."""
        # Either the bytes themselves or, in a message that quoted the word with repr(), their escapes.
        return re.sub(r"\x00(\d+)\x01|\\x00(\d+)\\x01",
                      lambda found: render([self.pieces[int(found.group(1) or found.group(2))]]), text)

    def decode(self, text: str) -> list:
        parts = []
        for literal_, index in re.findall(r"([^\x00]*)(?:\x00(\d+)\x01|$)", text):
            if literal_:
                parts.append(literal_)
            if index:
                parts.append(self.pieces[int(index)])
        return parts


def render(parts: list) -> str:
    """Parts written back as bash would show them, for a message."""
    out = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        elif part[0] in ("var", "unset"):
            out.append("$" + part[1])
        elif part[0] == "subst":
            out.append(f"$({part[1]})")
        elif part[0] == "procsub":
            out.append(f"<({part[1]})")
        elif part[0] == "arith":
            out.append(f"$(({part[1]}))")
        elif part[0] == "param":
            out.append("${" + part[1] + "}")
    return "".join(out)


def literal(parts: list) -> str | None:
    """The parts' text when every part is literal (known before the job runs); else None."""
    return "".join(parts) if all(isinstance(p, str) for p in parts) else None


def basename(text: str) -> str:
    return text.rsplit("/", 1)[-1]
