"""A report as a list of blocks (headings, paragraphs, tables, lists, images), rendered to markdown and
to one self-contained HTML page (images inlined as base64 PNG)."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Table:
    header: Sequence[str]
    rows: Sequence[Sequence[str]]


@dataclass(frozen=True)
class Bullets:
    items: Sequence[str]


@dataclass(frozen=True)
class Image:
    path: Path  # a PNG in the report folder
    alt: str


Block = Union[Heading, Paragraph, Table, Bullets, Image]


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: Sequence[Block]) -> str:
    """Markdown; images are linked by their file name (they lie beside the markdown file)."""
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out += ["#" * block.level + " " + block.text, ""]
        elif isinstance(block, Paragraph):
            out += [block.text, ""]
        elif isinstance(block, Table):
            out.append("| " + " | ".join(_md_cell(h) for h in block.header) + " |")
            out.append("|" + "---|" * len(block.header))
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows]
            out.append("")
        elif isinstance(block, Bullets):
            out += [f"- {item}" for item in block.items] + [""]
        elif isinstance(block, Image):
            out += [f"![{block.alt}]({block.path.name})", ""]
    return "\n".join(out).rstrip() + "\n"


def _inline(text: str) -> str:
    """Escaped HTML with markdown's `code` spans as <code>."""
    parts = str(text).split("`")
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p) for i, p in enumerate(parts))


_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; }
th { background: #f3f3f3; }
img { max-width: 100%; }
code { background: #f3f3f3; padding: 0 0.2em; }
"""


def to_html(blocks: Sequence[Block], title: str) -> str:
    """One HTML page with every image inlined (base64), so the file is all there is to share."""
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>{html.escape(title)}</title>", f"<style>{_STYLE}</style>", "</head>", "<body>"]
    for block in blocks:
        if isinstance(block, Heading):
            out.append(f"<h{block.level}>{_inline(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            out.append(f"<p>{_inline(block.text)}</p>")
        elif isinstance(block, Table):
            out.append("<table>")
            out.append("<tr>" + "".join(f"<th>{_inline(h)}</th>" for h in block.header) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>" for row in block.rows]
            out.append("</table>")
        elif isinstance(block, Bullets):
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in block.items) + "</ul>")
        elif isinstance(block, Image):
            data = base64.b64encode(Path(block.path).read_bytes()).decode("ascii")
            out.append(f'<p><img alt="{html.escape(block.alt)}" src="data:image/png;base64,{data}"></p>')
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"
