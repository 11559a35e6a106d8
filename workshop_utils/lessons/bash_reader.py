"""Enough of bash to follow a job script: its commands and their words, and what a word expands to.

Words keep bash's quotes, backslashes, ``$(...)``, ``$((...))``, ``${...}``, backticks and process
substitutions whole; comments, redirections and here-documents are left out. Each command says where it
runs: in the batch shell itself, or apart from it (a subshell, a pipeline, the background, a command or
process substitution), where a variable it sets is never seen by the commands after it. Groups and compound
commands (``{ }``, ``if``, loops, ``case``) are followed so that an ``&`` or ``|`` after one applies to all
of it, and a ``)`` inside a comment or a case pattern does not end a ``$(...)``.

A word expands into parts: literal text, or a piece known only when the job runs: ("var", NAME) set by
Slurm or the system, ("unset", NAME) set by nothing, ("subst", COMMAND) a command substitution,
("procsub", COMMAND) a process substitution, ("arith", EXPRESSION) arithmetic the check cannot finish
before the job runs, ("param", TEXT) any other ${...}.
"""

from __future__ import annotations

import dataclasses
import re

from .bash_arithmetic import BashArithmeticError, Unreadable, arithmetic

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\+?=(.*)", re.S)
# Set in every job's environment, their values known only on the node (SLURM_CPUS_PER_TASK and
# SLURM_NTASKS_PER_NODE only with their options: those come from the #SBATCH lines).
RUNTIME = frozenset({
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_NTASKS",
    "SLURM_NPROCS", "SLURM_CPUS_ON_NODE", "SLURM_JOB_CPUS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_SUBMIT_DIR",
    "SLURM_SUBMIT_HOST", "SLURM_CLUSTER_NAME", "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT", "SLURM_NODEID",
    "SLURM_PROCID", "SLURM_LOCALID", "SLURMD_NODENAME", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
    "SLURM_RESTART_COUNT", "SLURM_JOB_UID", "SLURM_JOB_USER", "SLURM_TASK_PID", "SLURM_CONF", "SLURM_JOB_QOS",
    "SLURM_MEM_PER_NODE", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_TOPOLOGY_ADDR",
    "HOME", "USER", "LOGNAME", "PATH", "PWD", "SHELL", "HOSTNAME", "TMPDIR", "LANG", "RANDOM", "BASHPID", "PPID",
})
SPECIAL = "@*#?$!-0123456789"
SPLIT = ("split",)  # where an unquoted expansion's value splits into two words
# Words after which the next word still starts a command (``then X=1``, ``! cmd``, ``{ cmd``).
LEADING = frozenset({"!", "time", "then", "else", "elif", "do", "{", "if", "while", "until"})
_OPENS = {"{": "}", "if": "fi", "while": "done", "until": "done", "for": "done", "select": "done", "case": "esac"}
_REDIRECT = re.compile(r"&>>|&>|<<<|<<-|<<|<>|<&|>&|>>|>\||<|>")


@dataclasses.dataclass
class Command:
    """One simple command: its words as written, the operator that ends it ("\\n", ";", "&", "&&", "|", ...),
    where it runs ("" in the batch shell itself, else "a subshell", "a pipeline", "the background", "a command
    substitution", "a process substitution"), the word its standard input is redirected from, and whether it
    sits inside a substitution in another command's word rather than in the text itself."""

    words: list[str]
    operator: str
    where: str = ""
    stdin: str | None = None
    nested: bool = False
    background: bool = False  # in an and-or list that ends with &, whatever else it is in
    stdout_elsewhere: bool = False  # its standard output redirected (>, >>, &>, >&2): not what a $(...) captures
    function: str | None = None  # the function whose body holds it: it runs only where that function is called


def _skip_quote(text: str, i: int) -> int:
    end = text.find("'", i + 1)
    return len(text) if end < 0 else end + 1


def _skip_backtick(text: str, i: int) -> int:
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
        elif text[j] == "`":
            return j + 1
        else:
            j += 1
    return len(text)


def _skip_group(text: str, i: int) -> int:
    """The end of the (...) or {...} that opens at ``i`` by counting brackets (for ``$((...))`` and ``${...}``,
    which hold no commands of their own), quotes inside it included."""
    opening = text[i]
    closing = ")" if opening == "(" else "}"
    depth, j = 0, i
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        if ch == "'":
            j = _skip_quote(text, j)
            continue
        if ch == '"':
            j = _skip_double(text, j, [])
            continue
        if ch == "`":
            j = _skip_backtick(text, j)
            continue
        if ch == opening:
            depth += 1
        elif ch == closing:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(text)


def _nested(found: list[Command], where: str) -> list[Command]:
    for command in found:
        command.nested, command.where = True, command.where or where
    return found


def _substitution(text: str, i: int, sink: list, where: str) -> int:
    """The end of the ``$(...)``, ``<(...)`` or ``>(...)`` whose bracket opens at ``i``, read as the commands it
    holds (they go to ``sink``)."""
    found, end = _scan(text, i + 1, closing=True)
    sink += _nested(found, where)
    return min(end + 1, len(text))


def _backticks(text: str, i: int, sink: list) -> int:
    end = _skip_backtick(text, i)
    inner = re.sub(r"\\([\\`$])", r"\1", text[i + 1:end - 1 if text[end - 1:end] == "`" else end])
    sink += _nested(_scan(inner, 0, closing=False)[0], "a command substitution")
    return end


def _skip_double(text: str, i: int, sink: list) -> int:
    j = i + 1
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
        elif ch == '"':
            return j + 1
        elif text.startswith("$((", j) or text.startswith("${", j):
            j = _skip_group(text, j + 1)
        elif text.startswith("$(", j):
            j = _substitution(text, j + 1, sink, "a command substitution")
        elif ch == "`":
            j = _backticks(text, j, sink)
        else:
            j += 1
    return len(text)


def _scan(text: str, i: int, closing: bool) -> tuple[list[Command], int]:
    """The commands from ``i`` on, and where they end: the ``)`` that closes a substitution (``closing``), or
    the text's end."""
    commands: list[Command] = []
    words: list[str] = []
    word, pending, stdin, heredocs, levels = None, None, None, [], []
    stdout_elsewhere, defining = False, None  # defining: the function whose body the next group is
    state = {"andor": 0, "pipe": 0, "piped": False}  # where the current and-or list and pipeline begin
    n = len(text)

    def top(kind: str | None = None):
        return levels[-1] if levels and (kind is None or levels[-1]["kind"] == kind) else None

    def mark(start: int, where: str):
        for command in commands[start:]:
            command.where = command.where or where
            command.background = command.background or where == "the background"

    def open_level(kind: str):
        nonlocal state, defining
        levels.append({"kind": kind, "start": len(commands), "saved": state, "case": "subject",
                       "function": defining})
        state, defining = {"andor": len(commands), "pipe": len(commands), "piped": False}, None

    def close_level():
        nonlocal state
        level = levels.pop()
        state = level["saved"]
        if level["kind"] == "(":
            mark(level["start"], "a subshell")
        for command in commands[level["start"]:] if level["function"] else []:
            command.function = command.function or level["function"]

    def end_word():
        nonlocal word, pending, stdin, words, defining
        if word is None:
            return
        done, word = word, None
        if pending is not None:
            if pending in ("<<", "<<-"):
                heredocs.append((re.sub(r"[\"'\\]", "", done), pending == "<<-"))
            elif pending == "<":
                stdin = done
            pending = None
            return
        case = top("case")
        if case and case["case"] in ("subject", "in"):
            if case["case"] == "subject":
                case["case"] = "in"
            elif done == "in":
                case["case"], words = "pattern", []
                return
        elif case and case["case"] == "pattern":
            if done == "esac" and not words:
                close_level()
            else:
                words.append(done)  # a pattern's words, dropped at its )
                return
        elif words[-1:] == ["function"] and all(w in LEADING for w in words[:-1]):
            defining, words = done, words[:-1]  # function NAME { ...; }: its body is the next group
            return
        elif all(w in LEADING for w in words):
            if done in _OPENS:
                open_level(done)
            elif levels and _OPENS.get(levels[-1]["kind"]) == done:
                close_level()
        words.append(done)

    def end_command(operator: str):
        nonlocal words, stdin, stdout_elsewhere
        end_word()
        if words:
            commands.append(Command(words, operator, stdin=stdin, stdout_elsewhere=stdout_elsewhere))
        words, stdin, stdout_elsewhere = [], None, False
        if operator in ("|", "|&"):
            state["piped"] = True
            return
        if state["piped"]:
            mark(state["pipe"], "a pipeline")
            state["piped"] = False
        if operator == "&":
            mark(state["andor"], "the background")
        state["pipe"] = len(commands)
        if operator not in ("&&", "||"):
            state["andor"] = len(commands)

    while i < n:
        ch = text[i]
        case = top("case")
        if ch == "\\":
            if text[i + 1:i + 2] == "\n":
                i += 2
            else:
                word, i = (word or "") + text[i:i + 2], i + 2
            continue
        if ch in " \t\r":
            end_word()
            i += 1
            continue
        if ch == "#" and word is None:
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if ch in "<>" and text[i + 1:i + 2] == "(":
            if pending is None:
                end_word()
            where = "a process substitution"
            j = _substitution(text, i + 1, commands, where)
            word, i = (word or "") + text[i:j], j
            continue
        if ch in "'\"`" or (ch == "$" and text[i + 1:i + 2] in ("(", "{")):
            if ch == "'":
                j = _skip_quote(text, i)
            elif ch == '"':
                j = _skip_double(text, i, commands)
            elif ch == "`":
                j = _backticks(text, i, commands)
            elif text.startswith("$((", i) or text.startswith("${", i):
                j = _skip_group(text, i + 1)
            else:
                j = _substitution(text, i + 1, commands, "a command substitution")
            word, i = (word or "") + text[i:j], j
            continue
        redirect = _REDIRECT.match(text, i) if ch in "<>&" else None
        if redirect and (ch != "&" or redirect.group().startswith("&>")):
            descriptor = word if word is not None and word.isdigit() else None
            if descriptor is not None:
                word = None  # the file descriptor of 2>...
            if ">" in redirect.group() and redirect.group() not in ("<>",) and descriptor in (None, "1"):
                stdout_elsewhere = True
            end_word()
            pending, i = redirect.group(), redirect.end()
            continue
        if case and case["case"] == "pattern" and ch in "|()":
            end_word()
            if top("case") is case:  # else the word before was esac, and ch is the shell's own
                if ch == ")":
                    case["case"], words = "body", []
                i += 1
                continue
            case = None
        three, two = text[i:i + 3], text[i:i + 2]
        if three == ";;&" or two in (";;", ";&"):
            end_command(";;")
            if case:
                case["case"] = "pattern"
            i += 3 if three == ";;&" else 2
            continue
        if two in ("&&", "||", "|&"):
            end_command(two)
            i += 2
            continue
        if ch == "(":
            end_word()
            if all(w in LEADING for w in words):
                open_level("(")
            elif re.match(r"\(\s*\)", text[i:]):  # NAME () starts a function's definition
                words = [w for w in words if w != "function"]
                defining = words[-1] if words else defining
                words, i = [], i + re.match(r"\(\s*\)", text[i:]).end()
                continue
            else:
                end_command(";")
            i += 1
            continue
        if ch == ")":
            if top("("):
                end_command(")")
                close_level()
                i += 1
                continue
            if closing:
                end_command("")
                return commands, i
            end_command(";")
            i += 1
            continue
        if ch in ";&|\n":
            end_command(ch)
            i += 1
            if ch == "\n":
                while heredocs:  # the here-documents' bodies start on the next line
                    end_mark, tabs = heredocs.pop(0)
                    while i < n:
                        line_end = text.find("\n", i)
                        line_end = n if line_end < 0 else line_end
                        line = text[i:line_end]
                        i = line_end + 1
                        if (line.lstrip("\t") if tabs else line) == end_mark:
                            break
            continue
        word, i = (word or "") + ch, i + 1
    end_command("")
    return commands, n


def shell_commands(text: str) -> list[Command]:
    """The simple commands of a shell text, in the order bash finishes them (those inside a substitution
    before the command whose word holds it)."""
    return _scan(text, 0, closing=False)[0]


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

    def assign(self, command: Command, take: bool = True) -> bool:
        """Take a command that only assigns (``A=1 B=2``, ``export A=1``, ``declare -x A=1``); False otherwise.
        An assignment that runs apart from the batch shell is noted (``elsewhere``), never taken; with ``take``
        False (after the launch, which cannot see it) it is only recognised."""
        words, start = command.words, 0
        while start < len(words) and words[start] in LEADING:
            start += 1
        builtin = words[start] if start < len(words) and words[start] in (
            "export", "declare", "typeset", "readonly", "local") else None
        rest = words[start + bool(builtin):]
        options = [w for w in rest if builtin and w.startswith("-")]
        rest = [w for w in rest if not (builtin and w.startswith("-"))]
        matches = [ASSIGNMENT.fullmatch(w) for w in rest]
        if builtin is None and (not rest or not all(matches)):
            return False
        exported = builtin == "export" or (builtin in ("declare", "typeset") and any("x" in o for o in options))
        for text, found in zip(rest, matches if take else []):
            name = found.group(1) if found else (text if NAME.fullmatch(text) else None)
            if name is None:
                continue
            if command.where:
                self.elsewhere.setdefault(name, command.where)
                continue
            if found:
                self.assigned[name] = found.group(2)
            if exported:
                self.exported.add(name)
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
                j = _skip_group(word, i + 1)
                expression = word[i + 3:j - 2] if word[j - 2:j] == "))" else word[i + 3:j]
                try:  # known before the job runs: bash's digits
                    add([str(arithmetic(expression, self.text_of))])
                except (BashArithmeticError, Unreadable, RecursionError):
                    add([("arith", expression)])
                return j
            if after == "(":
                j = _substitution(word, i + 1, [], "")
                add([("subst", word[i + 2:j - 1] if word[j - 1:j] == ")" else word[i + 2:j])])
                return j
            if after == "{":
                j = _skip_group(word, i + 1)
                inner = word[i + 2:j - 1] if word[j - 1:j] == "}" else word[i + 2:j]
                if NAME.fullmatch(inner) or (len(inner) == 1 and inner in SPECIAL):
                    add(self.variable(inner, quoted, depth, hidden))
                else:
                    add([("param", inner)])
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
                j = _skip_quote(word, i)
                add([word[i + 1:j - 1] if word[j - 1:j] == "'" and j - 1 > i else word[i + 1:j]])
                i = j
            elif ch in "<>" and word[i + 1:i + 2] == "(":
                j = _substitution(word, i + 1, [], "")
                add([("procsub", word[i + 2:j - 1] if word[j - 1:j] == ")" else word[i + 2:j])])
                i = j
            elif ch == '"':
                j = _skip_double(word, i, [])
                end = j - 1 if j - 1 > i and word[j - 1] == '"' else j
                k = i + 1
                while k < end:
                    if word[k] == "\\" and k + 1 < end and word[k + 1] in '$`"\\\n':
                        add([word[k + 1]] if word[k + 1] != "\n" else [])
                        k += 2
                    elif word[k] == "$":
                        k = dollar(k, True)
                    elif word[k] == "`":
                        j2 = _skip_backtick(word, k)
                        add([("subst", word[k + 1:j2 - 1])])
                        k = j2
                    else:
                        add([word[k]])
                        k += 1
                i = j
            elif ch == "$":
                i = dollar(i, False)
            elif ch == "`":
                j = _skip_backtick(word, i)
                add([("subst", word[i + 1:j - 1])])
                i = j
            else:
                add([ch])
                i += 1
        return parts

    def fields(self, word: str) -> list[str]:
        """The word's expansion as the words a command receives, each encoded: literal text with every
        non-literal part as \\x00INDEX\\x01 (see ``decode``), so that argument parsers can read them."""
        out, current = [], ""
        for part in self.parts(word):
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
