"""docs/errors.md cannot drift from the tests: every row names tests that exist, every `quoted` part of what the
user sees is text its test checks, and every test of the hostile-input files has a row."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "errors.md"
FILES = ("test_bad_checkpoints.py", "test_bad_inputs.py", "test_atomic_output.py", "test_no_surprises.py",
         "test_properties.py", "test_full_disk.py", "test_integrity.py",
         "test_changing_files.py", "test_resume.py", "test_lost_rank.py", "test_hub_faults.py",
         "test_concurrent_folders.py")  # fmt: skip
NOT_A_ROW = {"test_bad_checkpoints.py::test_verify_cli_prints_diffs"}  # a success path kept beside the failures


def _test_sources() -> dict[str, str]:
    """'file::test_name' -> source of the test function, decorators included."""
    found = {}
    for name in FILES:
        text = (ROOT / "tests" / name).read_text()
        lines = text.splitlines()
        body = ast.parse(text).body
        # Module-level tables a test reads (its parametrize rows) count as the test's text.
        tables = {
            target.id: "\n".join(lines[node.lineno - 1 : node.end_lineno])
            for node in body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                source = "\n".join(lines[first - 1 : node.end_lineno])
                used = [table for table_name, table in tables.items() if re.search(rf"\b{table_name}\b", source)]
                found[f"{name}::{node.name}"] = "\n".join([source, *used])
    return found


def _rows() -> list[tuple[str, list[str]]]:
    """(what the user sees, [test ids]) for every table row whose last column names tests."""
    rows = []
    for line in PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        tests = re.findall(r"`(test_\w+\.py::test_\w+)`", cells[-1]) if line.startswith("|") else []
        if tests:
            rows.append((cells[-2] if len(cells) > 2 else "", tests))
    return rows


def _checked_in(source: str, text: str) -> bool:
    """The text as the test writes it: literally, or escaped inside a regular expression."""
    escaped = re.sub(r"([.()\[\]*+?])", r"\\\1", text)
    return text in source or escaped in source


def test_every_row_is_backed_by_its_test():
    sources = _test_sources()
    rows = _rows()
    assert rows
    problems = []
    for seen, tests in rows:
        problems += [f"{test} does not exist" for test in tests if test not in sources]
        for quoted in re.findall(r"`([^`]+)`", seen):
            if not any(_checked_in(sources.get(t, ""), quoted) for t in tests):
                problems.append(f"no test of {tests} checks {quoted!r}")
    assert not problems, "docs/errors.md drifted from the tests:\n" + "\n".join(problems)


def test_every_test_has_a_row():
    named = {test for _, tests in _rows() for test in tests}
    missing = sorted(set(_test_sources()) - named - NOT_A_ROW)
    assert not missing, f"tests without a row in docs/errors.md: {missing}"
