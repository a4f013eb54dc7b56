"""The README's code runs: every ```python block as a script, every `make` target exists.

Each Python block is written to a file and run with this interpreter from the repository root,
as a user who pastes it into a script would (the blocks guard their collectors with
``if __name__ == "__main__":`` because the workers start with spawn). Relative links must
point at committed files, and every number in a results table must appear in the results file
linked above it: re-measuring a benchmark without updating its README table fails here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def blocks(*languages: str) -> list[str]:
    """The bodies of the README's fenced blocks in ``languages``, in order."""
    text = README.read_text(encoding="utf-8")
    return [body for lang, body in FENCE.findall(text) if lang in languages]


PYTHON_BLOCKS = blocks("python", "py")


def makefile_targets() -> set[str]:
    """Targets the Makefile defines (rules ``name: ...``, not ``NAME := value``)."""
    rule = re.compile(r"^([A-Za-z0-9_.-]+)[ \t]*:(?!=)", re.MULTILINE)
    return set(rule.findall((ROOT / "Makefile").read_text(encoding="utf-8")))


def make_targets(command: str) -> set[str]:
    """Targets of one ``make ...`` command (``VAR=value`` and ``-flag`` arguments skipped)."""
    words = command.split("#")[0].split()
    if not words or words[0] != "make":
        return set()
    return {word for word in words[1:] if "=" not in word and not word.startswith("-")}


def shell_make_targets() -> set[str]:
    """Targets of the ``make`` command lines in the README's shell blocks."""
    targets: set[str] = set()
    for body in blocks("bash", "sh", "shell", "console"):
        for line in body.splitlines():
            targets |= make_targets(line.strip().removeprefix("$ "))
    return targets


def inline_make_targets() -> set[str]:
    """Targets of the ``make ...`` commands quoted inline in the README's prose."""
    spans = re.findall(r"`(make [^`]+)`", README.read_text(encoding="utf-8"))
    return set().union(*(make_targets(span) for span in spans))


def test_readme_has_python_blocks():
    assert PYTHON_BLOCKS, "README.md has no ```python block: the tests below would pass vacuously"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_python_block_runs(index, tmp_path):
    script = tmp_path / f"readme_block_{index}.py"
    script.write_text(PYTHON_BLOCKS[index], encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, (
        f"README python block {index} exited with {result.returncode}\n"
        f"--- block ---\n{PYTHON_BLOCKS[index]}\n"
        f"--- stdout (tail) ---\n{result.stdout[-2000:]}\n"
        f"--- stderr (tail) ---\n{result.stderr[-4000:]}"
    )
    assert result.stdout.strip(), "the block printed nothing"


def test_the_two_commands_are_make_targets():
    shown = shell_make_targets()
    assert {"run", "test"} <= shown, f"the README's shell blocks show make {sorted(shown)}"
    missing = shown - makefile_targets()
    assert not missing, f"README shows make targets the Makefile lacks: {sorted(missing)}"


def test_every_make_target_mentioned_exists():
    mentioned = inline_make_targets()
    missing = mentioned - makefile_targets()
    assert not missing, f"README mentions make targets the Makefile lacks: {sorted(missing)}"


def test_ci_runs_make_test():
    assert re.search(r"^\s*make test\s*$", (ROOT / ".ci" / "run").read_text(), re.MULTILINE)


RESULTS = ROOT / "benchmarks" / "RESULTS.md"
PAGES = (README, RESULTS)
"""The pages whose links and results tables are checked (links relative to each page)."""


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_exist(page):
    text = page.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link.split("#")[0] for link in links if "://" not in link and link.split("#")[0]]
    assert local, f"{page.name} links no committed file"
    missing = [link for link in local if not (page.parent / link).exists()]
    assert not missing, f"{page.name} links missing files: {missing}"


NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?(?:e-?\d+)?")


def numbers(text: str) -> set[str]:
    return {token.replace(",", "") for token in NUMBER.findall(text)}


def quoted_tables(page: Path = README) -> list[tuple[list[Path], list[str]]]:
    """Each results table of ``page`` with the results files linked just above it.

    The README's tables are those of its Results section; the results page's, all of them.
    """
    text = page.read_text(encoding="utf-8")
    if page == README:
        text = text.split("\n## Results", 1)[1].split("\n## ", 1)[0]
    tables, links, rows = [], [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows.append(line)
            continue
        if rows:
            tables.append((links, rows[2:]))  # data rows: after the header and the separator
            links, rows = [], []
        found = re.findall(r"\]\(((?:benchmarks/)?results/[^)\s]+\.md)\)", line)
        links = links + [page.parent / link for link in found]
    return tables


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_results_tables_quote_their_files(page):
    tables = quoted_tables(page)
    assert tables, f"{page.name} has no results tables"
    for links, rows in tables:
        assert links, f"a results table has no link to its file above it: {rows[0]}"
        source = numbers("".join(link.read_text(encoding="utf-8") for link in links))
        for row in rows:
            stale = numbers(row) - source
            assert not stale, (
                f"{links}: {page.name} row {row!r} quotes {sorted(stale)}, not in the file"
            )
