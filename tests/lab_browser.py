"""Drive the course the way a learner meets it: `make lab`'s JupyterLab, in a real Chromium, with Playwright.

Used by tests/test_browser.py. Nothing here is a test; it starts and stops the two programs and offers
the few gestures a learner makes: open a notebook, put the cursor on a cell, run it (Ctrl+Enter), type
into it, save (Ctrl+S), press a toolbar button, look at what is on the screen.

- `LabServer` starts JupyterLab with the command `make lab` runs (read from `make -n lab`, so a change to
  the Makefile is followed), on a free local port, token authentication on, with only the root folder
  moved to a scratch copy of the course (running a lesson in the browser autosaves it: the committed
  notebooks must not change). JupyterLab's own state (settings, workspaces, runtime files) lives in the
  scratch folder too.
- Chromium is Debian's (`/usr/bin/chromium`, installed by scripts/check_browser.sh); Playwright's own
  browser download is not used.
- `NotebookPage` works with JupyterLab 4's windowed notebook: only cells near the viewport exist in the
  page, so cells are reached by moving the active cell with the arrow keys, as a learner scrolls.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / ".ci-output" / "screenshots"
# What a headless Chromium needs on a machine with no network and no display (and, as root, no sandbox).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-quic", "--disable-extensions"]
_PROMPT_DONE = re.compile(r"^\[(\d+)\]:$")
# The notebook on screen, and its cell `index` (JupyterLab 4's windowed list numbers every cell).
_PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"


_ACTIVE_CELL = ".jp-Notebook .jp-Cell.jp-mod-active"


def _cell_selector(index: int) -> str:
    return f'.jp-Notebook .jp-Cell[data-windowed-list-index="{index}"]'


def _prompt_selector(index: int) -> str:
    return f"{_PANEL} {_cell_selector(index)} .jp-InputArea-prompt"


# In the page: the prompt of a cell shows a new execution count ([12]:), not its old one nor [*]:.
_RUN_FINISHED = """([selector, before]) => {
  const prompt = document.querySelector(selector);
  const text = prompt ? prompt.innerText.trim() : before;
  return text !== before && /^\\[\\d+\\]:$/.test(text);
}"""
# In the page, once a cell has run: wait (at most 5 s) until every image its outputs show has loaded or failed
# to, then report what the outputs show (images decoded out of all, each output's MIME type, the text) and
# the prompt's text.
_OUTPUTS_SEEN = """async cell => {
  const images = () => [...cell.querySelectorAll(".jp-OutputArea-output img")];
  const settled = Promise.all(images().map(
    img => img.complete ? null : new Promise(done => { img.onload = done; img.onerror = done; })));
  await Promise.race([settled, new Promise(done => setTimeout(done, 5000))]);
  const area = cell.querySelector(".jp-OutputArea");
  const prompt = cell.querySelector(".jp-InputArea-prompt");
  return {images: images().length, decoded: images().filter(i => i.complete && i.naturalWidth > 0).length,
          mimes: [...cell.querySelectorAll(".jp-OutputArea-output")]
                   .map(n => n.getAttribute("data-mime-type") || ""),
          text: area ? area.innerText : "", prompt: prompt ? prompt.innerText.trim() : ""};
}"""
# In the page: the active cell's index and the text of a prompt (null when it is not on the page).
_WHERE = """([activeSelector, promptSelector]) => {
  const active = document.querySelector(activeSelector);
  const prompt = document.querySelector(promptSelector);
  return {active: active ? Number(active.getAttribute("data-windowed-list-index")) : -1,
          prompt: prompt ? prompt.innerText.trim() : null};
}"""


def chromium_path() -> str | None:
    """Debian's Chromium, or $LONGCTX_CHROMIUM; None when there is none."""
    for candidate in (os.environ.get("LONGCTX_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium",
                      shutil.which("chromium-browser")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def browser_missing_reason() -> str | None:
    """Why the browser tests cannot run on this machine, or None when they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -r requirements.txt)"
    if chromium_path() is None:
        return ("no Chromium on this machine: scripts/check_browser.sh --install installs Debian's chromium "
                "with apt (needs root and apt); `make test` runs it first")
    return None


def lesson_ids() -> list[str]:
    """Every released lesson: lessons/NN_slug/NN_slug.ipynb (lessons added later are picked up)."""
    return sorted(p.parent.name for p in (ROOT / "lessons").glob("*/*.ipynb")
                  if p.stem == p.parent.name and re.match(r"^\d\d_", p.stem))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_lab_command(port: int, root_dir: Path) -> tuple[dict[str, str], list[str]]:
    """(environment assignments, argv) of the command `make lab PORT=port` runs, with its root folder
    replaced by `root_dir` (`NAME=value` words before the program are its environment, as in a shell)."""
    dry = subprocess.run(["make", "-n", "-s", "-o", ".venv/.longctx-setup", "lab", f"PORT={port}"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    lines = [line for line in dry.stdout.splitlines() if re.search(r"\bjupyter\b.*\blab\b", line)]
    if len(lines) != 1:
        raise RuntimeError(f"cannot find the jupyter lab command in `make -n lab`:\n{dry.stdout}")
    argv = shlex.split(lines[0])
    env = {}
    while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
        name, _, value = argv.pop(0).partition("=")
        env[name] = value
    roots = [i for i, arg in enumerate(argv) if arg.startswith("--ServerApp.root_dir=")]
    if len(roots) != 1:
        raise RuntimeError(f"`make lab` no longer passes one --ServerApp.root_dir: {argv}")
    argv[roots[0]] = f"--ServerApp.root_dir={root_dir}"
    if not os.path.isabs(argv[0]):
        argv[0] = str(ROOT / argv[0])
    return env, argv


def formgrade_command(port: int) -> list[str]:
    """The instructor's lab, as autograder/formgrade.sh starts it (on the repository), on `port`."""
    return [str(ROOT / "autograder" / "formgrade.sh"), f"--port={port}"]


class LabServer:
    """JupyterLab as `make lab` starts it, serving `root_dir`; a context manager that stops it and its
    kernels. With `instructor=True`, the instructor's lab instead (autograder/formgrade.sh, serving the
    repository)."""

    def __init__(self, root_dir: Path, state_dir: Path, start_timeout_s: float = 120.0,
                 instructor: bool = False):
        self.instructor = instructor
        self.root_dir = Path(root_dir)
        self.state_dir = Path(state_dir)
        self.start_timeout_s = start_timeout_s
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.token = ""
        self.log_path = self.state_dir / "jupyterlab.log"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LabServer:
        runtime = self.state_dir / "runtime"
        settings = self.state_dir / "settings"
        runtime.mkdir(parents=True, exist_ok=True)
        # Fresh settings, as a learner's first visit: what the lab shows comes from the course's own
        # configuration (binder/learner/ for `make lab`), not from settings a test wrote.
        env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(runtime), JUPYTERLAB_SETTINGS_DIR=str(settings),
                   JUPYTERLAB_WORKSPACES_DIR=str(self.state_dir / "workspaces"),
                   PATH=f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1")
        env.pop("JUPYTER_TOKEN", None)  # the token is the one JupyterLab makes up, as with `make lab`
        env.pop("JUPYTER_CONFIG_PATH", None)
        if self.instructor:
            self.argv = formgrade_command(self.port)
            self.root_dir = ROOT
        else:
            make_env, self.argv = make_lab_command(self.port, self.root_dir)
            env.update(make_env)
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                     stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited ({self.proc.returncode}):\n{self.log()[-3000:]}")
            for info_file in runtime.glob("jpserver-*.json"):
                try:
                    info = json.loads(info_file.read_text())
                except (OSError, ValueError):
                    continue
                if info.get("pid") == self.proc.pid and info.get("port") == self.port:
                    self.token = info.get("token", "")
                    if self._answers():
                        return self
            time.sleep(0.25)
        self.__exit__(None, None, None)
        raise RuntimeError(f"JupyterLab did not start within {self.start_timeout_s:.0f} s:\n"
                           f"{self.log()[-3000:]}")

    def _answers(self) -> bool:
        try:
            self.api("GET", "/api/status")
            return True
        except OSError:
            return False

    def api(self, method: str, path: str):
        request = urllib.request.Request(self.base_url + path, method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        """Stop every kernel (a closed tab leaves its kernel running, as in JupyterLab)."""
        for session in self.api("GET", "/api/sessions") or []:
            self.api("DELETE", f"/api/sessions/{session['id']}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def __exit__(self, *exc) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)  # the server and its kernels (one process group)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)


@dataclass
class CellRun:
    """What the learner saw after running one code cell."""

    index: int
    execution_count: int
    seconds: float
    images: int                      # <img> outputs shown, decoded (naturalWidth > 0)
    broken_images: int               # <img> outputs that did not decode
    output_mimes: list = field(default_factory=list)
    output_text: str = ""


class NotebookPage:
    """One notebook open in JupyterLab in a browser tab."""

    def __init__(self, page, lab: LabServer, relpath: str):
        self.page = page
        self.lab = lab
        self.relpath = relpath
        self.path = lab.root_dir / relpath

    def open(self, timeout_s: float = 120.0) -> NotebookPage:
        # A workspace of its own: JupyterLab would otherwise reopen (and restart the kernels of) the tabs
        # an earlier test left in the default workspace.
        workspace = re.sub(r"[^A-Za-z0-9]+", "-", self.relpath) + f"-{time.monotonic_ns()}"
        self.page.goto(f"{self.lab.base_url}/lab/workspaces/{workspace}/tree/{self.relpath}?token={self.lab.token}")
        self.page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=timeout_s * 1000)
        self.wait_idle(timeout_s)
        # The kernel connected and idle, as the status bar says ("Python 3 (ipykernel) | Idle"): under load
        # the execution indicator could read idle before, and a Run All sent then ran nothing.
        self.page.locator(".jp-StatusBar-Widget", has_text=re.compile(r"\|\s*Idle")).first.wait_for(
            timeout=timeout_s * 1000)
        return self

    # -- what is on the screen -------------------------------------------------------------------
    @property
    def panel(self):
        return self.page.locator(_PANEL).first

    def cell(self, index: int):
        return self.panel.locator(_cell_selector(index))

    def active_index(self) -> int:
        active = self.panel.locator(_ACTIVE_CELL).first
        return int(active.get_attribute("data-windowed-list-index"))

    def wait_idle(self, timeout_s: float = 120.0) -> None:
        self.panel.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').wait_for(
            timeout=timeout_s * 1000)

    def show_output_image(self, index: int) -> None:
        """Scroll so that the first image cell `index` shows is on the screen (cell `index` must be
        active)."""
        image = self.cell(index).locator(".jp-OutputArea-output img").first
        image.evaluate("img => img.scrollIntoView({block: 'end'})")

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(path))
        return path

    # -- gestures --------------------------------------------------------------------------------
    def command_mode(self) -> None:
        """Leave any editor and give the notebook the keyboard (clicking the active cell's prompt)."""
        self.page.keyboard.press("Escape")
        active = self.panel.locator(f"{_ACTIVE_CELL} .jp-InputPrompt").first
        active.click()
        self.page.keyboard.press("Escape")

    def _where(self, index: int) -> dict:
        return self.page.evaluate(_WHERE, [f"{_PANEL} {_ACTIVE_CELL}", _prompt_selector(index)])

    def go_to(self, index: int) -> str:
        """Make cell `index` the active one, as a learner does: click its prompt when it is on the page (the
        click scrolls it into view), else move with the arrow keys (JupyterLab scrolls the active cell into
        view). Returns the cell's prompt text."""
        target = self.cell(index)
        if target.count():
            target.locator(".jp-InputPrompt").first.click()
            self.page.keyboard.press("Escape")
            where = self._where(index)
            if where["active"] == index:
                return where["prompt"]
        self.command_mode()
        for _ in range(20):
            current = self.active_index()
            if current == index:
                self.cell(index).scroll_into_view_if_needed()
                return self._where(index)["prompt"]
            key = "ArrowDown" if current < index else "ArrowUp"
            for _ in range(abs(index - current)):   # the whole distance, then one look at the page
                self.page.keyboard.press(key)
        raise RuntimeError(f"could not reach cell {index}")

    def run_cell(self, index: int, timeout_s: float = 300.0) -> CellRun:
        """Run cell `index` with Ctrl+Enter and wait until its prompt shows its execution count.

        The wait runs in the page (a predicate polled every 50 ms); the outputs, once their images have
        settled, and the prompt are read in one call."""
        from playwright.sync_api import TimeoutError as PageTimeout

        before = self.go_to(index)
        start = time.monotonic()
        self.page.keyboard.press("Control+Enter")
        deadline = start + timeout_s
        while True:
            wait_s = min(10.0, deadline - time.monotonic())
            try:
                self.page.wait_for_function(_RUN_FINISHED, arg=[_prompt_selector(index), before],
                                            polling=50, timeout=max(wait_s, 0.1) * 1000)
                break
            except PageTimeout:
                text = self.cell(index).locator(".jp-InputArea-prompt").first.inner_text().strip()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"cell {index} of {self.relpath} still running after "
                                       f"{timeout_s:.0f} s (prompt {text!r})") from None
                if text == before:
                    # JupyterLab marks a cell [*] as soon as it takes the keypress: this one was lost.
                    self.go_to(index)
                    self.page.keyboard.press("Control+Enter")
        seconds = time.monotonic() - start
        # Outputs arrive before the reply that sets the prompt; the images get up to 5 s to decode.
        seen = self.cell(index).evaluate(_OUTPUTS_SEEN)
        done = _PROMPT_DONE.match(seen["prompt"])
        return CellRun(index=index, execution_count=int(done.group(1)), seconds=seconds,
                       images=seen["decoded"], broken_images=seen["images"] - seen["decoded"],
                       output_mimes=seen["mimes"], output_text=seen["text"] if seen["mimes"] else "")

    def wait_for_cell(self, index: int, timeout_s: float = 300.0) -> int:
        """Bring cell `index` into view and wait until it has run (its prompt shows a number)."""
        self.go_to(index)
        prompt = self.cell(index).locator(".jp-InputArea-prompt").first
        deadline = time.monotonic() + timeout_s
        while not (done := _PROMPT_DONE.match(prompt.inner_text().strip())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"cell {index} of {self.relpath} did not run within {timeout_s:.0f} s")
            time.sleep(0.2)
        return int(done.group(1))

    def run_all_from_menu(self) -> None:
        """Run > Run All Cells, from the menu bar."""
        self.command_mode()
        self.page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).first.click()
        self.page.locator(".lm-Menu-item", has_text="Run All Cells").first.click()

    def set_source(self, index: int, text: str) -> None:
        """Replace the cell's code as a learner does: click into it, select all, type (paste) the answer."""
        self.go_to(index)
        editor = self.cell(index).locator(".jp-InputArea-editor .cm-content").first
        editor.click()
        self.page.keyboard.press("Control+a")
        self.page.keyboard.press("Delete")
        # insert_text is one input event, like a paste: the editor's auto-indent and auto-close
        # brackets do not rewrite it, as they would a character-by-character typing of indented code.
        self.page.keyboard.insert_text(text)
        self.command_mode()

    def save(self, timeout_s: float = 60.0):
        """Ctrl+S, wait until the tab is no longer dirty, and return the notebook as saved on disk."""
        self.command_mode()
        self.page.keyboard.press("Control+s")
        self.page.locator(".lm-TabBar-tab.jp-mod-current:not(.jp-mod-dirty)").first.wait_for(
            timeout=timeout_s * 1000)
        return nbformat.read(self.path, as_version=4)

    def click_validate(self, timeout_s: float = 300.0) -> str:
        """Press nbgrader's Validate button and return the text of the dialog it opens (then close it)."""
        self.command_mode()
        self.panel.locator('.jp-Toolbar jp-button[aria-label="Validate"]').first.click()
        dialog = self.page.locator(".jp-Dialog").first
        dialog.wait_for(timeout=timeout_s * 1000)
        body = dialog.locator(".jp-Dialog-body")
        # nbgrader first shows a "Validating..." state; wait until the result is in.
        deadline = time.monotonic() + timeout_s
        while re.search(r"validating", body.inner_text(), re.I) and time.monotonic() < deadline:
            time.sleep(0.2)
        text = dialog.inner_text()
        return text

    def close_dialog(self) -> None:
        dialog = self.page.locator(".jp-Dialog").first
        buttons = dialog.locator(".jp-Dialog-footer button")
        buttons.last.click()
        dialog.wait_for(state="detached", timeout=30_000)


class LabPage:
    """The JupyterLab window itself, apart from any notebook: its menus, sidebars and pop-ups."""

    NEWS = "official Jupyter news"

    def __init__(self, page, lab: LabServer):
        self.page = page
        self.lab = lab

    def open(self, timeout_s: float = 120.0) -> LabPage:
        workspace = f"lab-{time.monotonic_ns()}"
        self.page.goto(f"{self.lab.base_url}/lab/workspaces/{workspace}?token={self.lab.token}")
        self.page.locator("#jp-main-dock-panel").wait_for(timeout=timeout_s * 1000)
        self.page.locator(".lm-MenuBar-item").first.wait_for(timeout=timeout_s * 1000)
        self.page.wait_for_timeout(3000)  # plugins that start late (news, sidebars) have had their chance
        return self

    def menu_bar(self) -> list[str]:
        return [t.strip() for t in self.page.locator(".lm-MenuBar-item").all_inner_texts()]

    def menu_items(self, menu: str) -> list[str]:
        """The labels of the items a learner sees in menu `menu` of the menu bar (then closes it)."""
        self.page.locator(".lm-MenuBar-item", has_text=re.compile(rf"^{re.escape(menu)}$")).first.click()
        items = self.page.locator(".lm-Menu:not(.lm-mod-hidden) .lm-Menu-item:not(.lm-mod-hidden) "
                                  ".lm-Menu-itemLabel")
        items.first.wait_for(timeout=10_000)
        labels = [t.strip() for t in items.all_inner_texts() if t.strip()]
        self.page.keyboard.press("Escape")
        return labels

    def has_panel(self, panel_id: str) -> bool:
        return self.page.locator(f"#{panel_id}").count() > 0

    def side_tabs(self) -> list[str]:
        """The titles (tooltips) of the sidebar tabs, left and right."""
        tabs = self.page.locator(".jp-SideBar .lm-TabBar-tab")
        return [tabs.nth(i).get_attribute("title") or tabs.nth(i).inner_text() for i in range(tabs.count())]

    def toasts(self) -> list[str]:
        return self.page.locator(".Toastify__toast").all_inner_texts()

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(path))
        return path


def nbgrader_role(cell) -> str:
    """'exercise' (a solution code cell), 'test' (an autograded test cell), 'written' (a manually graded
    Markdown answer) or '' for everything else."""
    meta = cell.metadata.get("nbgrader", {})
    if meta.get("solution"):
        return "exercise" if cell.cell_type == "code" else "written"
    if meta.get("grade") and cell.cell_type == "code":
        return "test"
    return ""


def solution_answer(lesson: str, grade_id: str) -> str:
    """The instructor's answer for exercise `grade_id`: the solution cell with nbgrader's markers removed."""
    nb = nbformat.read(ROOT / "solutions" / lesson / f"{lesson}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            lines = [line for line in cell.source.splitlines()
                     if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION")]
            return "\n".join(lines) + "\n"
    raise KeyError(f"{grade_id} is not a cell of solutions/{lesson}")


# -- which cells a browser run executes -----------------------------------------------------------------
# A browser run repeats what tests/test_lessons_graded.py already executes through a kernel; its
# job is what only a browser shows (rendering, the learner's gestures). To keep `make test` within its
# budget it leaves out the cells that run the real model or other long measurements (they import torch,
# load the model, build an engine, start a server, or recompute a recorded sweep), and every later cell that
# reads a name only such a cell defines. LONGCTX_BROWSER_ALL_CELLS=1 runs every cell.
HEAVY_CELL = re.compile(r"\b(import torch|from torch\b|load_model|build_engine|TorchExecutor|ServerProcess\("
                        r"|launch_server|RECOMPUTE\s*=\s*True)")


def defined_and_used(source: str) -> tuple[set, set]:
    import ast

    source = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set(), set()
    defined, used, parameters = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (defined if isinstance(node.ctx, ast.Store) else used).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.arg):
            parameters.add(node.arg)
    # a function's parameter read in its body is not a read of the notebook's name (a cell that also reads the
    # notebook's own `x` beside a parameter `x` is missed: the graded run then fails with a NameError, loudly)
    return defined, used - parameters


def read_by_graded_cells(nb) -> set[int]:
    """The code cells an exercise or test cell reads from, directly or through other such cells: by name, as
    `defined_and_used` sees them, each name from the last cell before its reader that binds it. A name a cell
    binds itself (a loop variable, a local) is not a read from an earlier cell; a cell that reads a name
    before rebinding it (`rows = [r for r in rows]`) is missed, and the graded run then fails with a
    NameError, loudly."""
    needed, wanted = set(), set()
    for index in range(len(nb.cells) - 1, -1, -1):
        cell = nb.cells[index]
        if cell.cell_type != "code":
            continue
        defined, used = defined_and_used(cell.source)
        if nbgrader_role(cell) in ("exercise", "test") or defined & wanted:
            needed.add(index)
            wanted = (wanted - defined) | (used - defined)
    return needed


def plan_cells(nb, run_everything: bool | None = None) -> tuple[list[int], dict[int, str]]:
    """(code cells to run, {skipped cell: why}) for a browser run of `nb`."""
    if run_everything is None:
        run_everything = os.environ.get("LONGCTX_BROWSER_ALL_CELLS") == "1"
    run, skipped, cheap_names, heavy_names = [], {}, set(), set()
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        defined, used = defined_and_used(cell.source)
        reason = ""
        if not run_everything:
            if HEAVY_CELL.search(cell.source):
                reason = f"runs the model or a long measurement ({HEAVY_CELL.search(cell.source).group(0)})"
            elif (used - defined) & heavy_names:
                reason = f"reads {sorted((used - defined) & heavy_names)[0]} from a skipped cell"
        if reason:
            skipped[index] = reason
            heavy_names |= defined - cheap_names
        else:
            run.append(index)
            cheap_names |= defined
            heavy_names -= defined
    return run, skipped
