"""The comments of a settings dataclass, read from its source: each field's explanation (the
comment lines right above it plus its trailing comment) and the sections its fields fall in (the
first comment line after a blank line). `radixlm serve --help` shows them, so a flag is explained
once, next to its default in config.py.

    @dataclass
    class Settings:
        # Memory                          <- a section's title (after a blank line)
        page_size: int = 1                # tokens a page   <- page_size's help
        # Requests beyond this many       <- max_queued's help, with the line below
        # are refused with HTTP 429
        max_queued: int | None = None
"""

from __future__ import annotations

import inspect
import io
import re
import tokenize
from dataclasses import dataclass, field

_FIELD = re.compile(r"^\s+(\w+)\s*:")
# A comment line indented far past the '#' continues the trailing comment of the line above
_CONTINUATION = re.compile(r"^#\s{8,}\S")


@dataclass
class Section:
    title: str
    description: str = ""
    fields: list[str] = field(default_factory=list)


@dataclass
class FieldComments:
    help: dict[str, str] = field(default_factory=dict)        # field name -> its explanation
    sections: list[Section] = field(default_factory=list)     # in source order


def field_comments(cls: type) -> FieldComments:
    """The comments of `cls`'s fields; empty where its source cannot be read."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return FieldComments()
    comments: dict[int, str] = {}      # line number -> comment text (without '#')
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    lines = source.splitlines()
    out = FieldComments()
    block: list[str] = []               # comment-only lines since the last field / blank line
    block_after_blank = False
    last_field: str | None = None
    shared: dict[str, str] = {}        # fields explained only by the lines above them
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            if block_after_blank and block:   # (a section's title with no field under it yet)
                out.sections.append(_section(block[:1]))
            block, block_after_blank, last_field = [], True, None
            continue
        comment = comments.get(number)
        if number not in code_lines:        # a comment-only line
            if comment is None:
                continue
            if last_field and not block and _CONTINUATION.match(comment):
                out.help[last_field] += " " + _text(comment)
                continue
            block.append(_text(comment))
            continue
        match = _FIELD.match(line)
        if match is None:
            if line[:1].isspace() and line.strip().startswith(("def ", "@")):
                break                      # the methods: the fields are over
            # (the decorator; the class line, whose first comment is a section's title)
            block, block_after_blank = [], line.lstrip().startswith("class ")
            continue
        name = match.group(1)
        if block_after_blank and block:       # its first line is a section's title
            out.sections.append(_section(block[:1]))
            block = block[1:]
        if not out.sections:
            out.sections.append(Section(""))
        out.sections[-1].fields.append(name)
        parts = [" ".join(block)] if block else []
        if comment:          # (a trailing "None: ..." says what the default None means)
            parts.append(re.sub(r"^None: ", "default: ", _text(comment)))
        if not parts and last_field in shared:
            # (a field right under one explained by the lines above it shares them:
            # `# the shortest and longest window` over min_window and max_window)
            parts = [shared[last_field]]
        out.help[name] = "; ".join(p for p in parts if p)
        if block and not comment:
            shared[name] = out.help[name]
        block, block_after_blank, last_field = [], False, name
    return out


def _text(comment: str) -> str:
    return comment.lstrip("#").strip()


def _section(block: list[str]) -> Section:
    """A section header: its words up to the first ' (', ': ' or '; ' are the title; the whole
    text is the description where it says more."""
    text = " ".join(block)
    cuts = [i for i in (text.find(" ("), text.find(": "), text.find("; ")) if i > 0]
    title = text[:min(cuts)] if cuts else text
    return Section(title, text if title != text else "")
