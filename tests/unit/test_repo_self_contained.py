"""Every tracked file speaks of the repository alone: no path that leads out of a clone.

A README or a comment that points at a sibling directory of the checkout (the design notes or
research the project started from) is a dead link for everyone who clones it. The check runs over
`git ls-files`, so it sees exactly what a clone holds; binary files are skipped.
"""

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# A path that climbs out of the checkout into a sibling tree of design notes and research, or names
# one of that tree's folders as if it were here. Built from parts so this file does not match itself.
_SHARED = "sha" + "red"
OUTSIDE = re.compile(rf"(\.\./+{_SHARED}\b|(?<![\w./-]){_SHARED}/(?:research|seed|bench|DESIGN|STYLE|hooks)\b)")


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z"], check=True, capture_output=True, timeout=30
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:  # an exported tree without .git
        pytest.skip(f"not a git checkout: {exc}")
    return [REPO / name for name in out.decode().split("\0") if name]


def _outside_references(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
        return []
    return [
        f"{path.relative_to(REPO)}:{lineno}: {line.strip()[:120]}"
        for lineno, line in enumerate(text.splitlines(), 1)
        if OUTSIDE.search(line)
    ]


def test_no_tracked_file_refers_outside_the_repository() -> None:
    files = _tracked_files()
    assert len(files) > 100, "the scan must see the repository's files"
    found = [hit for f in files for hit in _outside_references(f)]
    assert found == [], "these lines point outside a clone; say it here or drop the reference:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("line", "outside"),
    [
        (f"see ../{_SHARED}/DESIGN.md", True),
        (f"cited from {_SHARED}/research/trainer.md", True),
        (f"[baseline](../../{_SHARED}/bench/BASELINE.md)", True),
        (f"persistentvolumeclaim 'ft-ckpt-{_SHARED}' not found", False),
        (f"/dev/shm and /run/{_SHARED}/research", False),
        ("bench/seed/BASELINE.md", False),
    ],
)
def test_the_pattern_catches_what_it_should(line: str, outside: bool) -> None:
    """The check can fail: references out of the repo match, look-alikes inside it do not."""
    assert bool(OUTSIDE.search(line)) is outside
