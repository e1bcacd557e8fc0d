"""Every `FTJOB_*` environment variable is named once, in `finetune_api.constants`.

A knob spelled as a string literal somewhere else is a second source of truth that drifts (a rename
misses it, a reader cannot list the knobs); this scans the three product packages' syntax trees for
string constants that start with `FTJOB_` (docstrings and comments may still mention the names).
"""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("api/finetune_api", "operator/finetune_operator", "trainer/finetune_trainer")
CONSTANTS = REPO / "api" / "finetune_api" / "constants.py"


def _ftjob_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("FTJOB_")
    ]


def test_no_ftjob_literal_outside_the_constants_module() -> None:
    files = [f for pkg in PACKAGES for f in sorted((REPO / pkg).rglob("*.py")) if f != CONSTANTS]
    assert len(files) > 50, "the scan must see the product's modules"
    found = [hit for f in files for hit in _ftjob_literals(f)]
    assert found == [], "name these in finetune_api.constants instead:\n" + "\n".join(found)


def test_the_scan_sees_the_constants_module_itself() -> None:
    """The check can fail: the constants module does hold such literals."""
    assert _ftjob_literals(CONSTANTS), "expected FTJOB_ literals in finetune_api/constants.py"


def test_every_ftjob_knob_has_a_docstring() -> None:
    """Each `ENV_* = "FTJOB_..."` assignment is followed by a string (its one-line docstring)."""
    tree = ast.parse(CONSTANTS.read_text())
    body = tree.body
    undocumented = []
    for i, node in enumerate(body):
        if not isinstance(node, ast.AnnAssign | ast.Assign):
            continue
        value = node.value
        if not (isinstance(value, ast.Constant) and isinstance(value.value, str) and value.value.startswith("FTJOB_")):
            continue
        nxt = body[i + 1] if i + 1 < len(body) else None
        doc = nxt.value if isinstance(nxt, ast.Expr) else None
        if not (isinstance(doc, ast.Constant) and isinstance(doc.value, str)):
            undocumented.append(value.value)
    assert undocumented == []
