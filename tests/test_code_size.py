"""Code size: no function over 80 lines of code, no class over 300 lines and no module over 800
lines in ``mvg_dask`` and its lab, ``mvg_dask_lab``.

A function's lines of code exclude its docstring, blank lines and comment-only lines; a class
and a module count every line, docstrings included. Long code is split into named steps instead,
and a long module into modules by concern.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import mvg_dask
import mvg_dask_lab

PACKAGE = Path(mvg_dask.__file__).parent
LAB = Path(mvg_dask_lab.__file__).parent
MAX_FUNCTION_CODE_LINES = 80
MAX_CLASS_LINES = 300
MAX_MODULE_LINES = 800

#: The modules still over :data:`MAX_MODULE_LINES`, each with the reason; an entry goes when its
#: module is split (the test fails on an entry whose module is back under the limit).
LONG_MODULES: dict[str, str] = {}


def _code_lines(source: str) -> set[int]:
    """The line numbers that carry code (a token other than a comment or a line break)."""
    lines: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines


def _docstring_lines(node: ast.AST) -> set[int]:
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return set()
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            return set(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    return set()


def measure(path: Path) -> list[tuple[str, int, int]]:
    """``(kind name, lines, limit)`` of every function and class of a module over its limit."""
    source = path.read_text()
    code = _code_lines(source)
    over = []
    for node in ast.walk(ast.parse(source)):
        end = getattr(node, "end_lineno", None)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and end is not None:
            span = set(range(node.lineno, end + 1))
            nested = set()
            for sub in ast.walk(node):
                if sub is not node:
                    nested |= _docstring_lines(sub)
            n = len((span & code) - _docstring_lines(node) - nested)
            if n > MAX_FUNCTION_CODE_LINES:
                over.append((f"function {node.name}", n, MAX_FUNCTION_CODE_LINES))
        elif isinstance(node, ast.ClassDef) and end is not None:
            n = end - node.lineno + 1
            if n > MAX_CLASS_LINES:
                over.append((f"class {node.name}", n, MAX_CLASS_LINES))
    return over


def test_no_long_functions_or_classes() -> None:
    offenders = [
        f"{path.relative_to(package.parent)}: {what} has {n} lines (limit {limit})"
        for package in (PACKAGE, LAB)
        for path in sorted(package.rglob("*.py"))
        for what, n, limit in measure(path)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_measure_counts_code_not_docstrings_or_comments(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}  # comment" for i in range(81))
    doc = '    """' + "\n".join("doc" for _ in range(50)) + '"""\n'
    long_fn = tmp_path / "long.py"
    long_fn.write_text(f"def f():\n{doc}{body}\n")
    assert measure(long_fn) == [("function f", 82, 80)]  # the def line and 81 statements
    short = tmp_path / "short.py"
    comments = "\n".join("    # note" for _ in range(100))
    short.write_text(f"def g():\n{doc}{comments}\n    return 1\n")
    assert measure(short) == []


def _module_lines() -> dict[str, int]:
    return {
        path.relative_to(package.parent).as_posix(): len(path.read_text().splitlines())
        for package in (PACKAGE, LAB)
        for path in sorted(package.rglob("*.py"))
    }


def test_no_long_modules() -> None:
    lines = _module_lines()
    over = [
        f"{name}: {n} lines (limit {MAX_MODULE_LINES}); split it by concern"
        for name, n in lines.items()
        if n > MAX_MODULE_LINES and name not in LONG_MODULES
    ]
    assert not over, "\n".join(over)


def test_the_long_modules_allowed_are_still_long() -> None:
    stale = [
        f"{name} has {lines} lines: remove it from LONG_MODULES"
        for name, lines in ((name, _module_lines().get(name, 0)) for name in LONG_MODULES)
        if lines <= MAX_MODULE_LINES
    ]
    assert not stale, "\n".join(stale)
