"""Facts the documentation states that the code can check (issue 34: docs that no longer matched)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _table_first_column(text: str, header: str) -> list[str]:
    """The first cell of every row of the Markdown table whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line.split("|")[1].strip())
    return rows


def test_readme_lists_every_profiler_parameter_it_counts():
    from scopebench.harness.solver import ProfiledSolverMixin

    text = (REPO / "README.md").read_text()
    names = [cell.strip("`") for cell in _table_first_column(text, "| parameter | default |")]
    assert names == list(ProfiledSolverMixin.parameters)
    words = {6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}
    assert f"the same {words[len(names)]} parameters" in text


def test_profiler_page_lists_every_profiler_parameter_in_one_table():
    from scopebench.harness.solver import ProfiledSolverMixin

    text = (REPO / "docs" / "profiler.md").read_text()
    names = [cell.strip("`") for cell in _table_first_column(text, "| parameter | default |")]
    assert names == list(ProfiledSolverMixin.parameters)


def test_the_tools_page_lists_every_command():
    from scopebench.cli import COMMANDS

    text = (REPO / "docs" / "tools.md").read_text()
    listed = [re.search(r"`([a-z-]+)`", cell).group(1) for cell in _table_first_column(text, "| command |")]
    assert sorted(listed) == sorted(COMMANDS)


def test_extending_says_where_every_diagnosis_rule_module_is():
    text = (REPO / "docs" / "extending.md").read_text()
    section = text[text.index("## A diagnosis rule") :]
    for module in ("diagnosis.py", "ledger_rules.py", "host_rules.py", "memory_rules.py", "backend_comparison.py"):
        assert f"`{module}`" in section, module
        assert (REPO / "src" / "scopebench" / "report" / module).is_file()
