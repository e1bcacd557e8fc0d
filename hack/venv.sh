#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv outside the repo and install the project into it.
# Cached by the hash of pyproject.toml, so a second run installs nothing. Prints the venv path.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${FTJOB_CACHE:-$HOME/.cache/finetune-operator}"
venv="${FTJOB_VENV:-$cache/venv}"
extras="${FTJOB_EXTRAS:-trainer,dev}"
python="${PYTHON:-python3}"
# setuptools warns on every editable install of this layout (three package directories): an 11-line "Editable
# installation ... be careful with folders ... of the same name" banner that says nothing about this install.
export PYTHONWARNINGS="ignore::UserWarning:setuptools.command.editable_wheel${PYTHONWARNINGS:+,$PYTHONWARNINGS}"
stamp="$venv/.ftjob-installed-$(sha256sum pyproject.toml | cut -c1-16)-${extras//,/-}"
# One installer at a time: make targets run in parallel (and several checkouts share the venv).
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [ ! -x "$venv/bin/python" ]; then
  echo "venv.sh: creating $venv" >&2
  "$python" -m venv "$venv"
fi
if [ ! -f "$stamp" ]; then
  echo "venv.sh: installing finetune-operator[$extras] into $venv (first run downloads torch: minutes)" >&2
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -m pip install -q -e ".[$extras]" >&2
  touch "$stamp"
fi
here_check='import finetune_operator, pathlib, sys; sys.exit(pathlib.Path(finetune_operator.__file__).resolve().is_relative_to(pathlib.Path("operator").resolve()) is False)'
if ! "$venv/bin/python" -c "$here_check" 2>/dev/null; then
  # Same dependencies, another checkout (CI clones afresh): point the editable install here.
  "$venv/bin/python" -m pip install -q --no-deps -e . >&2
fi
echo "$venv"
