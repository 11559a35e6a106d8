"""Enough of bash to follow a job script: its commands and their words, and what a word expands to.

Words keep bash's quotes, backslashes, ``$(...)``, ``$((...))``, ``${...}``, backticks and process
substitutions whole; comments, redirections and here-documents are left out. Each command says where it
runs: in the batch shell itself, or apart from it (a subshell, a pipeline, the background, a command or
process substitution), where a variable it sets is never seen by the commands after it. Groups and compound
commands (``{ }``, ``if``, loops, ``case``) are followed so that an ``&`` or ``|`` after one applies to all
of it, and a ``)`` inside a comment or a case pattern does not end a ``$(...)``.

How a word expands is ``bash_expansion``'s.
"""

from __future__ import annotations

import dataclasses
import re


NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\+?=(.*)", re.S)
ARRAY_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
# Words after which the next word still starts a command (``then X=1``, ``! cmd``, ``{ cmd``).
LEADING = frozenset({"!", "time", "then", "else", "elif", "do", "{", "if", "while", "until"})
OPENS = {"{": "}", "if": "fi", "while": "done", "until": "done", "for": "done", "select": "done", "case": "esac"}
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
    definition: int = -1  # which definition of that function (a function defined again replaces its body)
    in_case: bool = False  # in an arm of a case: it runs only when its pattern matches
    case_arm: tuple | None = None  # (the case's word, the arm's patterns, the earlier arms' or None) as written;
    # None where a ;& falls in
    herestring: str | None = None  # the word of its <<< (its standard input, a line of text)
    discards: bool = False  # its standard output or error goes to /dev/null or is closed (hides the job's log)


def _mark_arm(case: dict, commands: list[Command], terminator: str = ";;") -> None:
    """Give the commands of the case arm just ended its word, its patterns and those of the arms before it that
    take the word first (inner cases marked theirs first); ``terminator`` ends the arm (;; ;& ;;&)."""
    arm = case.pop("arm", None)
    if arm is None:
        return
    subject, patterns, start, fallen_into = arm
    earlier = case.setdefault("earlier", [])  # None once a ;& or ;;& lets a later arm run after a match
    for command in commands[start:]:
        if command.case_arm is None and not fallen_into and subject is not None:
            command.case_arm = (subject, patterns, None if earlier is None else tuple(earlier))
    if terminator != ";;":
        case["earlier"] = None
    elif earlier is not None:
        earlier.append(patterns)


def skip_quote(text: str, i: int) -> int:
    end = text.find("'", i + 1)
    return len(text) if end < 0 else end + 1


def skip_backtick(text: str, i: int) -> int:
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
        elif text[j] == "`":
            return j + 1
        else:
            j += 1
    return len(text)


def skip_group(text: str, i: int) -> int:
    """The end of the (...) or {...} that opens at ``i`` by counting brackets (for ``$((...))`` and ``${...}``,
    which hold no commands of their own), quotes inside it included."""
    opening = text[i]
    closing = {"(": ")", "[": "]"}.get(opening, "}")
    depth, j = 0, i
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        if ch == "'":
            j = skip_quote(text, j)
            continue
        if ch == '"':
            j = skip_double(text, j, [])
            continue
        if ch == "`":
            j = skip_backtick(text, j)
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


def substitution(text: str, i: int, sink: list, where: str) -> int:
    """The end of the ``$(...)``, ``<(...)`` or ``>(...)`` whose bracket opens at ``i``, read as the commands it
    holds (they go to ``sink``)."""
    found, end = _scan(text, i + 1, closing=True)
    sink += _nested(found, where)
    return min(end + 1, len(text))


def _backticks(text: str, i: int, sink: list) -> int:
    end = skip_backtick(text, i)
    inner = re.sub(r"\\([\\`$])", r"\1", text[i + 1:end - 1 if text[end - 1:end] == "`" else end])
    sink += _nested(_scan(inner, 0, closing=False)[0], "a command substitution")
    return end


def skip_double(text: str, i: int, sink: list) -> int:
    j = i + 1
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
        elif ch == '"':
            return j + 1
        elif text.startswith(("$((", "${", "$["), j):
            j = skip_group(text, j + 1)
        elif text.startswith("$(", j):
            j = substitution(text, j + 1, sink, "a command substitution")
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
    word, pending, stdin, heredocs, levels, herestring = None, None, None, [], [], None
    stdout_elsewhere, defining = False, None  # defining: the function whose body the next group is
    discards, output_pending = False, False  # output_pending: the pending redirection is of stdout or stderr
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
        if level["kind"] == "case":
            _mark_arm(level, commands)
            for command in commands[level["start"]:]:
                command.in_case = True
        for command in commands[level["start"]:] if level["function"] else []:
            if command.function is None:
                command.function, command.definition = level["function"], level["start"]

    def end_word():
        nonlocal word, pending, stdin, words, defining, herestring, discards
        if word is None:
            return
        done, word = word, None
        if pending is not None:
            discards = discards or (output_pending and done in ("/dev/null", "-"))  # >/dev/null, or 1>&- closed
            if pending in ("<<", "<<-"):
                heredocs.append((re.sub(r"[\"'\\]", "", done), pending == "<<-"))
            elif pending == "<":
                stdin = done
            elif pending == "<<<":
                herestring = done
            pending = None
            return
        case = top("case")
        if case and case["case"] in ("subject", "in"):
            if case["case"] == "subject":
                case["case"] = "in"
            elif done == "in":
                case["subject"] = words[-1] if len(words) == 2 else None
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
            if done in OPENS:
                open_level(done)
            elif levels and OPENS.get(levels[-1]["kind"]) == done:
                close_level()
        words.append(done)

    def end_command(operator: str):
        nonlocal words, stdin, stdout_elsewhere, herestring, discards
        end_word()
        if words:
            commands.append(Command(words, operator, stdin=stdin, stdout_elsewhere=stdout_elsewhere,
                                    herestring=herestring, discards=discards))
        words, stdin, stdout_elsewhere, herestring, discards = [], None, False, None, False
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
            j = substitution(text, i + 1, commands, where)
            word, i = (word or "") + text[i:j], j
            continue
        if ch in "'\"`" or (ch == "$" and text[i + 1:i + 2] in ("(", "{", "[")):
            if ch == "'":
                j = skip_quote(text, i)
            elif ch == '"':
                j = skip_double(text, i, commands)
            elif ch == "`":
                j = _backticks(text, i, commands)
            elif text.startswith(("$((", "${", "$["), i):
                j = skip_group(text, i + 1)
            else:
                j = substitution(text, i + 1, commands, "a command substitution")
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
            output_pending = ">" in redirect.group() and redirect.group() != "<>" and descriptor in (None, "1", "2")
            pending, i = redirect.group(), redirect.end()
            continue
        if case and case["case"] == "pattern" and ch in "|()":
            end_word()
            if top("case") is case:  # else the word before was esac, and ch is the shell's own
                if ch == ")":
                    case["arm"] = (case.get("subject"), tuple(words), len(commands), case.get("fall", False))
                    case["case"], words = "body", []
                i += 1
                continue
            case = None
        three, two = text[i:i + 3], text[i:i + 2]
        if three == ";;&" or two in (";;", ";&"):
            end_command(";;")
            if case:
                _mark_arm(case, commands, ";;&" if three == ";;&" else two)
                case["case"], case["fall"] = "pattern", two == ";&"
            i += 3 if three == ";;&" else 2
            continue
        if two in ("&&", "||", "|&"):
            end_command(two)
            i += 2
            continue
        if ch == "(" and word is not None and ARRAY_ASSIGNMENT.fullmatch(word):  # NAME=( words ): an array
            j = skip_group(text, i)
            word, i = word + text[i:j], j
            continue
        if ch == "(":
            end_word()
            if defining and not words and re.match(r"\(\s*\)", text[i:]):  # function NAME () { ...; }
                i += re.match(r"\(\s*\)", text[i:]).end()
                continue
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
            end_word()  # `done)` closes the loop before the parenthesis closes its subshell
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
