#!/usr/bin/env bash
# Set up hitenter in .venv at the repository root.
#   ./scripts/setup.sh          the package and its runtime dependencies
#   ./scripts/setup.sh --test   plus the test tools (pytest, openai, playwright, ...)
# torch: a CPU build (torch==2.13.0) is installed only when no torch is importable; a torch the
# user already has (in .venv, or in the python used to make it) is never replaced.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" - <<'PYV' || { echo "hitenter needs Python 3.11 or newer ($PY is too old)" >&2; exit 1; }
import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)
PYV
if [ ! -x .venv/bin/python ]; then
  if "$PY" -c "import torch" 2>/dev/null; then
    echo "setup: reusing the torch that $PY already has" >&2
    "$PY" -m venv --system-site-packages .venv
  else
    "$PY" -m venv .venv
  fi
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "setup: installing the CPU build of torch (torch==2.13.0)" >&2
  "${PIP[@]}" install "torch==2.13.0"
fi
if [ "${1:-}" = "--test" ]; then
  "${PIP[@]}" install -e ".[test]"
else
  "${PIP[@]}" install -e .
fi
.venv/bin/python -c "import torch, hitenter; print('setup: hitenter', hitenter.__version__, 'torch', torch.__version__)" >&2
