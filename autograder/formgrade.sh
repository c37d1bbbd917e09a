#!/usr/bin/env bash
# Grade written answers by hand: JupyterLab with nbgrader's Formgrader panel on this course (Nbgrader menu >
# Formgrader), using autograder/formgrader/nbgrader_config.py (the course configuration, student Markdown
# and outputs shown as text). Run `make grade` first; afterwards run it again for the final totals and
# feedback. Extra arguments go to `jupyter lab` (e.g. --port=8890). See autograder/README.md.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv_bin="$root/.venv/bin"
export PATH="$venv_bin:$PATH"  # nbgrader runs alembic as a subprocess
extra=()
if [ "$(id -u)" = 0 ]; then extra+=(--allow-root); fi
cd "$here/formgrader"
exec "$venv_bin/jupyter" lab --no-browser --ServerApp.root_dir="$root" "${extra[@]}" "$@"
