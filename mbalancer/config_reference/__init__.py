"""docs/configuration.md, made from the typed settings themselves: every key of every section of the config, its
default, and what the comment on its line (or the comment lines just above a key that has none) says of it, in the
dataclass that holds it. `python -m mbalancer.config_reference` writes the file; tests/test_config_reference.py
fails when it is not what the code says. `mbalancer config check FILE` is in cli.py here.

A comment line of its own continues the key above when it starts in lower case; one that starts a sentence is a
note about the keys below it (and, right above a key with no comment of its own, that key's meaning).
"""
from __future__ import annotations

import dataclasses
import inspect
import io
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent.parent / "docs" / "configuration.md"
UNSET = "(unset)"


@dataclass(frozen=True)
class Key:
    name: str
    type: str
    default: str
    meaning: str
    note: str = ""  # a note about this key and the ones below it


def sections() -> list[tuple[str, type]]:
    """(the TOML table, the dataclass behind it), in the config's order."""
    from dataplanes.registry import KINDS
    from mbalancer.config import Balancing, Controller, DataPlane, Monitoring
    from mbalancer.settings import Server
    return [("[[servers]]", Server), ("[balancing]", Balancing), ("[monitor]", Monitoring),
            ("[controller]", Controller), ("[dataplane]", DataPlane),
            *((f"[dataplane.{kind.name}]", kind.settings_class()) for kind in KINDS.values() if kind.settings)]


def keys_of(kind: type) -> list[Key]:
    """Its fields as the config names them (a field the file cannot set, such as [dataplane]'s sections, left out)."""
    comments = _comments(kind)
    keys = []
    for field in dataclasses.fields(kind):
        meaning, note = comments.get(field.name, ("", ""))
        if field.name == "sections":  # [dataplane]'s sub-tables, documented as sections of their own
            continue
        keys.append(Key(field.name, str(field.type), _default(field), meaning, note))
    return keys


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = field.default_factory()  # type: ignore[misc]
    else:
        return "required"
    if value is None:
        return UNSET
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in value) + "]"
    return f'"{value}"' if isinstance(value, str) else str(value)


def _comments(kind: type) -> dict[str, tuple[str, str]]:
    """Field -> (its meaning, a note above it), read from the class's source with Python's own tokenizer."""
    lines = _field_lines(inspect.getsource(kind))
    found: dict[str, tuple[str, str]] = {}
    previous, pending = None, []  # the last field; comment lines since it
    for name, comment in lines:
        if name is None:
            pending.append(comment)
            continue
        meaning, note = _place(pending, comment, previous, found)
        found[name] = (meaning, note)
        previous, pending = name, []
    return found


def _place(pending: list[str], trailing: str, previous: str | None,
           found: dict[str, tuple[str, str]]) -> tuple[str, str]:
    """The comment lines between two fields: the previous field's, a note, or the next field's meaning."""
    blocks: list[list[str]] = []
    for line in pending:
        if not blocks or line[:1].isupper():
            blocks.append([])
        blocks[-1].append(line)
    if blocks and not trailing:  # right above a field with no comment of its own: its meaning
        trailing = " ".join(blocks.pop())
    note = []
    for block in blocks:
        if block[0][:1].isupper() or previous is None:
            note += block
        else:
            meaning, above = found[previous]
            found[previous] = (f"{meaning} {' '.join(block)}".strip(), above)
    return trailing, " ".join(note)


def _field_lines(source: str) -> list[tuple[str | None, str]]:
    """(field name, its trailing comment) per field line of a dataclass body, and (None, text) per comment line of
    its own, in order; the docstring and methods are skipped."""
    found: list[tuple[str | None, str]] = []
    line_tokens: list[tokenize.TokenInfo] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.NEWLINE, tokenize.NL):
            found += _read_line(line_tokens)
            line_tokens = []
        elif token.type not in (tokenize.INDENT, tokenize.DEDENT):
            line_tokens.append(token)
    return found


def _read_line(tokens: list[tokenize.TokenInfo]) -> list[tuple[str | None, str]]:
    if not tokens:
        return []
    text = tokens[-1].string.lstrip("#").strip() if tokens[-1].type == tokenize.COMMENT else ""
    if len(tokens) == 1 and text:
        return [(None, text)]
    is_field = (len(tokens) > 2 and tokens[0].type == tokenize.NAME and tokens[1].string == ":"
                and tokens[0].start[1] > 0 and tokens[0].string != "def")
    return [(tokens[0].string, text)] if is_field else []


def render() -> str:
    """The whole of docs/configuration.md."""
    out = ["# Configuration reference", "",
           "Every key of the config file (TOML; `mbalancer/mbalancer.example.toml` is a commented example), its",
           "default and its meaning, made from the typed settings in the code by `python -m",
           "mbalancer.config_reference` (tests/test_config_reference.py fails when this page is not what the code",
           "says). Unknown sections and keys are errors. `mbalancer config check FILE` checks a file and says what",
           "it sets. Only `[[servers]]` is required.", ""]
    for table, kind in sections():
        out += [f"## `{table}`", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for key in keys_of(kind):
            if key.note:
                out.append(f"| | | | *{_cell(key.note)}* |")
            out.append(f"| `{key.name}` | `{_cell(key.type)}` | `{key.default}` | {_cell(key.meaning)} |")
        out.append("")
    return "\n".join(out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def main() -> int:
    DOC.write_text(render())
    print(f"written: {DOC}", file=sys.stderr)
    return 0

