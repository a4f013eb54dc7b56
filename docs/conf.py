"""Sphinx configuration of the API reference (``make docs``).

The front page is the README (its repository-relative links and images rewritten relative to
this folder into ``_readme.md``, written at every build and ignored by git); the reference is
built from the docstrings, whose plain-text math (``[*B, T]``, ``|x|``) and indented formulas
are kept as written (:func:`_plain_math`).
"""

import re
from pathlib import Path

project = "ac_extensions"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode", "myst_parser"]
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
exclude_patterns = ["_build", "_readme.md"]
html_theme = "alabaster"
suppress_warnings = ["ref.python", "myst.xref_missing", "myst.header"]
myst_heading_anchors = 3

_HERE = Path(__file__).resolve().parent
_readme = (_HERE.parent / "README.md").read_text(encoding="utf-8")
for _folder in ("benchmarks/", "examples/", "ac_extensions/", "tests/"):
    _readme = _readme.replace(f"]({_folder}", f"](../{_folder}")
_readme = _readme.replace("](docs/", "](")  # the README's links into this folder
(_HERE / "_readme.md").write_text(_readme, encoding="utf-8")

_CODE = re.compile(r"(``.*?``|`[^`]*`)")


def _escape(text: str) -> str:
    """Plain-text math in a docstring line as literal characters (``[*B, T]``, ``|x|``)."""
    parts = _CODE.split(text)
    for i in range(0, len(parts), 2):  # outside inline code
        part = re.sub(r"(?<!\*)\*(?!\*)", r"\\*", parts[i])  # single * (not **bold**)
        parts[i] = part.replace("|", r"\|")
    return "".join(parts)


_SECTIONS = re.compile(
    r"^(Args|Arguments|Returns|Yields|Raises|Example|Examples|Attributes|"
    r"Note|Notes|Warning|See Also|Keyword Args)s?:\s*$"
)


def _literal_blocks(lines: list[str]) -> None:
    """Make the indented blocks of a description (formulas, diagrams) literal blocks.

    The docstrings indent their displayed formulas under the paragraph they belong to; as
    reStructuredText those are block quotes, which mangle the alignment. Before each such block
    (a blank line, then deeper indentation, after a paragraph of the description) a ``::``
    paragraph is inserted. Google-style sections (``Args:`` ...) are left to napoleon.
    """
    i = 1
    while i < len(lines) - 1:
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        opens = (
            not lines[i].strip()
            and lines[i + 1].strip()
            and len(lines[i + 1]) - len(lines[i + 1].lstrip()) > 0
            and len(previous) - len(previous.lstrip()) == 0
            and not previous.rstrip().endswith("::")
            and not _SECTIONS.match(previous.strip())
            and not lines[i + 1].lstrip().startswith((">>>", "* ", "- "))
        )
        if opens:
            lines[i:i] = ["", "::"]
            i += 2
        i += 1


def _plain_math(app, what, name, obj, options, lines) -> None:
    """Escape ``*`` and ``|`` outside literal blocks, doctests and inline code."""
    _literal_blocks(lines)
    literal_indent = None  # indentation of the line that opened a ``::`` literal block
    doctest = False
    for i, line in enumerate(lines):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if literal_indent is not None:
            if stripped and indent <= literal_indent:
                literal_indent = None
            else:
                continue
        if stripped.startswith((">>>", "...")):
            doctest = True
            continue
        if doctest:
            if stripped:
                continue
            doctest = False
        bullet = re.match(r"\s*[*-] ", line)  # a list item keeps its marker
        head = bullet.group(0) if bullet else ""
        lines[i] = head + _escape(line[len(head) :])
        if stripped.endswith("::"):
            literal_indent = indent


def setup(app) -> None:
    """Register the docstring filter."""
    app.connect("autodoc-process-docstring", _plain_math, priority=100)  # before napoleon
