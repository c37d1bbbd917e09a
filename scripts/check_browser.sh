#!/usr/bin/env bash
# Says whether this machine can run the browser tests (tests/test_browser.py), and what to install if not.
# Usage: scripts/check_browser.sh [--install]   (--install: apt-get install chromium chromium-driver when missing)
# The tests drive Debian's Chromium with Playwright (a pinned Python package in requirements.txt);
# Playwright's own browser download is not used (it needs a host these machines cannot reach).
set -u
say() { printf '%s\n' "$*"; }
PY="${PYTHON:-.venv/bin/python}"
find_chromium() {
  for c in "${LONGCTX_CHROMIUM:-}" "$(command -v chromium 2>/dev/null)" /usr/bin/chromium "$(command -v chromium-browser 2>/dev/null)"; do
    if [ -n "$c" ] && [ -x "$c" ]; then printf '%s\n' "$c"; return 0; fi
  done
  return 1
}
if ! find_chromium >/dev/null && [ "${1:-}" = "--install" ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    say "installing Debian's chromium and chromium-driver (apt) ..."
    export DEBIAN_FRONTEND=noninteractive
    (apt-get install -y chromium chromium-driver >/dev/null 2>&1 \
      || (apt-get update >/dev/null 2>&1 && apt-get install -y chromium chromium-driver >/dev/null 2>&1)) \
      || say "MISSING: chromium (apt-get install -y chromium chromium-driver failed)"
  else
    say "cannot install chromium here: needs apt-get and root (sudo apt-get install -y chromium chromium-driver)"
  fi
fi
ok=1
if chromium=$(find_chromium); then
  say "ok: $("$chromium" --version 2>/dev/null | head -1) at $chromium"
else
  say "MISSING: chromium: apt-get install -y chromium chromium-driver (Debian/Ubuntu), or set LONGCTX_CHROMIUM"
  ok=0
fi
if [ -x "$PY" ] && "$PY" -c "import playwright.sync_api" 2>/dev/null; then
  say "ok: playwright $("$PY" -c 'import importlib.metadata as m; print(m.version("playwright"))')"
else
  say "MISSING: the playwright package in $PY (pip install -r requirements.txt)"
  ok=0
fi
if [ $ok = 1 ]; then say "ok: the browser tests can run here"; exit 0; fi
say "the browser tests will be skipped with this reason"
exit 1
