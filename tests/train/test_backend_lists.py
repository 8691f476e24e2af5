"""Every list of training backends a user reads comes from the registry (issue 46): the tables of
docs/distributed.md are generated, every ``--help`` that names backends names them all, and no
page enumerates them by hand. A backend added as one module then shows up everywhere with no
other edit but the regenerated tables (``SCOPEBENCH_UPDATE_DOCS=1`` rewrites them)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from scopebench.train.backends import all_backends, backend_table, phase_table

REPO = Path(__file__).resolve().parents[2]
#: Marker name -> the generated text between ``<!-- backends:<name> -->`` and ``<!-- /backends:<name> -->``.
BLOCKS = {"table": backend_table, "phases": phase_table}
#: Where a user reads about backends: the docs, the README, the shipped configs' comments.
PAGES = sorted(
    [
        *(REPO / "docs").glob("*.md"),
        REPO / "README.md",
        *(REPO / "configs").rglob("*.yml"),
        *(REPO / "configs").rglob("*.yaml"),
    ]
)
#: A list of this many backends or more must name every one.
LIST = 3


def _spellings(backend) -> list[str]:
    """How prose names a backend: its setting (``zero2``), its title (``DeepSpeed ZeRO-2``) and the
    title's short form (``ZeRO-2``, ``HSDP``)."""
    short = backend.title.split(" (")[0].split()[-1]
    return sorted({backend.name, backend.title, short}, key=len, reverse=True)


def mentions(text: str, backends=None) -> list[tuple[int, int, str]]:
    """``(start, end, backend)`` of each backend ``text`` names (case-insensitive, whole words; the
    longest spelling wins where two overlap: ``HSDP (FSDP2, 2-D mesh)`` is one mention).

    >>> [name for _, _, name in mentions("DDP, ZeRO-2 or fsdp2.yaml, not zero22")]
    ['ddp', 'zero2', 'fsdp2']
    """
    spellings = sorted(
        ((s, b.name) for b in backends or all_backends() for s in _spellings(b)), key=lambda p: -len(p[0])
    )
    taken: list[tuple[int, int, str]] = []
    for spelling, name in spellings:
        for m in re.finditer(rf"(?<![\w-]){re.escape(spelling)}(?!\w)", text, flags=re.IGNORECASE):
            if all(m.end() <= a or m.start() >= b for a, b, _ in taken):
                taken.append((m.start(), m.end(), name))
    return sorted(taken)


#: What may stand between two items of a list: punctuation but a sentence's end, markup and one
#: joining word.
_JOIN = re.compile(r"[^\w.;:]*(?:(?:and|or|nor|vs)\b[^\w.;:]*)?", flags=re.IGNORECASE)


def lists(text: str, backends=None) -> list[set[str]]:
    """The backends of each list in ``text``: runs of mentions joined only by punctuation and
    ``and`` / ``or`` (``ddp``, ``zero2`` or ``zero3``; DDP / ZeRO-2 / FSDP2), not a sentence that
    compares a few (ZeRO-3 is slower than DDP but FSDP2...).

    >>> [sorted(run) for run in lists("`ddp`, `zero2` or `zero3`. FSDP2 is slower than DDP here")]
    [['ddp', 'zero2', 'zero3'], ['fsdp2'], ['ddp']]
    """
    runs: list[set[str]] = []
    previous = None
    for start, end, name in mentions(text, backends):
        if previous is not None and _JOIN.fullmatch(text[previous:start]):
            runs[-1].add(name)
        else:
            runs.append({name})
        previous = end
    return runs


def lists_missing_a_backend(text: str, backends=None) -> list[str]:
    """Paragraphs of ``text`` (outside the generated blocks; a paragraph's lines joined, so a list
    wrapped over two lines is one) holding a list of :data:`LIST` backends or more that misses one,
    each with its first line's number and what it misses."""
    backends = backends or all_backends()
    every = {b.name for b in backends}
    blank = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    text = re.sub(r"<!-- backends:(\w+) -->.*?<!-- /backends:\1 -->", blank, text, flags=re.DOTALL)
    # another script's generated block (``<!-- overhead-table:begin ... -->``): its script's words
    text = re.sub(r"<!-- ([\w-]+):begin.*?<!-- \1:end -->", blank, text, flags=re.DOTALL)
    found = []
    number = 1
    for paragraph in re.split(r"(\n\s*\n)", text):
        joined = " ".join(paragraph.split())
        for seen in lists(joined, backends):
            if len(seen) >= LIST and seen != every:
                found.append(f"{number}: misses {sorted(every - seen)}: {joined[:120]}")
        number += paragraph.count("\n")
    return found


def prose(path: Path) -> str:
    """What a page says in words: a Markdown page without its fenced examples (a sample of output
    is not a list), a YAML file's comments (its values are a run's choice, such as the backends an
    experiment sweeps); lines keep their numbers."""
    text = path.read_text()
    if path.suffix in (".yml", ".yaml"):
        return "\n".join(line.partition("#")[2] for line in text.splitlines())
    return re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.DOTALL | re.MULTILINE)


def _block(text: str, name: str) -> str | None:
    match = re.search(rf"<!-- backends:{name} -->\n(.*?)<!-- /backends:{name} -->", text, flags=re.DOTALL)
    return None if match is None else match.group(1)


def test_the_generated_backend_tables_are_current():
    path = REPO / "docs" / "distributed.md"
    text = path.read_text()
    for name, render in BLOCKS.items():
        want = render() + "\n"
        if os.environ.get("SCOPEBENCH_UPDATE_DOCS") == "1":
            text = re.sub(
                rf"(<!-- backends:{name} -->\n).*?(<!-- /backends:{name} -->)",
                lambda m, want=want: m.group(1) + want + m.group(2),
                text,
                flags=re.DOTALL,
            )
            path.write_text(text)
        assert _block(text, name) == want, f"docs/distributed.md's {name} block is stale: SCOPEBENCH_UPDATE_DOCS=1"
    table = _block(text, "table")
    for backend in all_backends():
        assert f"| `{backend.name}` | {backend.title} |" in table


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_lists_the_backends_by_hand(page):
    found = lists_missing_a_backend(prose(page))
    assert (
        not found
    ), f"{page.relative_to(REPO)} lists backends by hand (generate the list, or name none):\n" + "\n".join(found)


def _help_texts() -> dict[str, str]:
    """Every text ``scopebench --help`` and ``scopebench <command> --help`` print."""
    from scopebench.cli import COMMANDS, build_parser

    parser = build_parser()
    texts = {"scopebench --help": parser.format_help()}
    sub = next(a for a in parser._actions if a.choices and set(COMMANDS) <= set(a.choices))
    for name, command in sub.choices.items():
        texts[f"scopebench {name} --help"] = command.format_help()
    return texts


def test_every_help_that_names_backends_names_them_all():
    texts = _help_texts()
    found = {where: lists_missing_a_backend(text) for where, text in texts.items()}
    found = {where: hits for where, hits in found.items() if hits}
    assert not found, found
    for command in ("train", "profile-step", "estimate-memory", "find-max-batch"):
        backend_help = texts[f"scopebench {command} --help"]
        assert {b.name for b in all_backends()} in lists(backend_help), command
    top = " ".join(texts["scopebench --help"].split())
    assert f"resume (backend {', '.join(b.name for b in all_backends())})" in top


def test_the_check_finds_a_list_that_misses_a_backend():
    """The checks above can fail: a sixth backend is missing from every list written before it."""
    from dataclasses import replace

    sixth = replace(all_backends()[0], name="sixth", title="Sixth", order=99)
    backends = (*all_backends(), sixth)
    line = "`backend` is " + ", ".join(f"`{b.name}`" for b in all_backends())
    assert lists_missing_a_backend(line, backends) == [f"1: misses ['sixth']: {line[:120]}"]
    wrapped = "Intro.\n\n" + line.replace(", ", ",\n", 1)  # a list wrapped over two lines is one list
    assert lists_missing_a_backend(wrapped, backends) == [f"3: misses ['sixth']: {line[:120]}"]
    assert lists_missing_a_backend(line) == []
    assert not lists_missing_a_backend("ZeRO-2 against DDP", backends)  # a comparison is not a list
