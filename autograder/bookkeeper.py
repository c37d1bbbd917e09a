"""nbgrader's bookkeeping for `make grade`, in a worker process the grader can stop at any time.

    python autograder/bookkeeper.py COURSE_ROOT WORK_DIR      (started by autograder/grade.py)

Reads one JSON task per line on stdin and answers one JSON line on stdout:
    {"op": "autograde", "student", "lesson", "ctl_dir", "stop_reason"} -> score, tests, pending, notes
    {"op": "feedback", "student", "lesson"}                              -> ok / error
    {"op": "export", "dest"}                                             -> grades.csv written
    {"op": "add_student", "student"}                                     -> the student is in the gradebook
The grader gives every task a time limit and restarts this worker if it overruns (a feedback page that
would take minutes to render costs its author their feedback, never the rest of the class).

nbgrader's `autograde` runs with its Execute step replaced by `ReplayVerdicts`: the outputs of the
student's cells come from the sandbox (ctl_dir/outputs.jsonl) and the outputs of each test cell are
the verdict of the checker process (ctl_dir/verdicts.json): nothing else, so a test cell scores exactly
when its checker passed it. nbgrader's gradebook, feedback and export then work as usual.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

# jsonschema (through nbformat) imports rfc3987_syntax for one format check notebooks never use; that
# import costs ~1.2 s of CPU in every process that reads a notebook. Skip it.
sys.modules.setdefault("rfc3987_syntax", None)

import nbformat  # noqa: E402
from executor_output import (  # noqa: E402
    MAX_CELL_OUTPUT_CHARS,
    MAX_NOTEBOOK_OUTPUT_CHARS,
    read_outputs,
    written_size,
)
from nbgrader import utils  # noqa: E402
from nbgrader.preprocessors import NbGraderPreprocessor  # noqa: E402
from staging import MAX_NOTEBOOK_BYTES, clean, is_student_id  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NOTE_ROOM = 4096   # per cell, beyond the output caps: the executor's note and a cut error's name and message
MAX_FEEDBACK_BYTES = 32 * 2**20
DROPPED = "[the grader dropped the rest of this cell's output: it passed the output cap as written]\n"
warnings.filterwarnings("ignore")


def load_config(root: str, work: str):
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=os.path.join(root, "autograder")).load_config()
    override = Config()
    override.CourseDirectory.root = root
    override.CourseDirectory.submitted_directory = os.path.join(work, "staged")
    override.CourseDirectory.release_directory = os.path.join(work, "release")
    override.CourseDirectory.db_url = "sqlite:///" + os.path.join(root, "autograder", "gradebook.db")
    override.OverwriteCells.add_missing_cells = True
    override.OverwriteCells.missing_cell_notification = (
        "# This cell (id:{cell_id}) was missing from the submission; the grader added it back.\n")
    override.RestoreCellRoles.release_directory = os.path.join(work, "release")
    from cellroles import RestoreCellRoles
    from nbconvert.preprocessors import ClearMetadataPreprocessor
    from nbgrader.preprocessors import (
        AssignLatePenalties,
        CheckCellMetadata,
        ClearOutput,
        DeduplicateIds,
        IgnorePattern,
        LimitOutput,
        OverwriteCells,
        OverwriteKernelspec,
        SaveAutoGrades,
    )

    override.Autograde.sanitize_preprocessors = [ClearOutput, DeduplicateIds, RestoreCellRoles,
                                                 OverwriteKernelspec, OverwriteCells, CheckCellMetadata]

    override.Autograde.autograde_preprocessors = [ReplayVerdicts, IgnorePattern, ClearMetadataPreprocessor,
                                                  LimitOutput, SaveAutoGrades, AssignLatePenalties,
                                                  CheckCellMetadata]
    config.merge(override)
    return config


def make_api(config):
    import logging

    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    api = NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)
    api.log.setLevel(logging.ERROR)
    return api


def grade_id(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "?")


def verdict_outputs(verdict, reason):
    """A test cell's outputs from its checker's verdict: its printout, and an error when it failed."""
    from nbformat.v4 import new_output

    if verdict is None:
        return [new_output("error", ename="TestNotCompleted", evalue=reason,
                           traceback=[f"TestNotCompleted: {reason}"])]
    outputs = []
    if verdict.get("stdout"):
        outputs.append(new_output("stream", name="stdout", text=str(verdict["stdout"])[:20000]))
    if not verdict.get("passed"):
        ename = str(verdict.get("ename") or "TestFailed")[:100]
        evalue = str(verdict.get("evalue", ""))[:4000]
        outputs.append(new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"]))
    return outputs


CURRENT: dict = {}  # the task being done: ctl_dir, stop_reason, notes


class ReplayVerdicts(NbGraderPreprocessor):
    """Stands in for nbgrader's Execute: student cells' outputs from the sandbox, test cells' from the
    checker."""

    def preprocess(self, nb, resources):
        ctl_dir = CURRENT["ctl_dir"]
        path = os.path.join(ctl_dir, "outputs.jsonl")
        executed = read_outputs(path, len(nb.cells), 4 * MAX_NOTEBOOK_BYTES)
        budget = {"left": MAX_NOTEBOOK_OUTPUT_CHARS + NOTE_ROOM * len(nb.cells), "cut": []}
        if executed is None and os.path.exists(path):
            CURRENT["notes"].append(
                "the executed notebook did not match the submission; its outputs were dropped")
        try:
            with open(os.path.join(ctl_dir, "verdicts.json")) as fh:
                verdicts = {int(k): v for k, v in json.load(fh).items()}
        except (OSError, ValueError):
            verdicts = {}
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            cell.execution_count = None
            if utils.is_grade(cell) and not utils.is_solution(cell):
                cell.outputs = verdict_outputs(verdicts.get(index), CURRENT["stop_reason"])
            else:
                cell.outputs = [nbformat.from_dict(o) for o in capped(executed or {}, index, budget)]
        if budget["cut"]:
            CURRENT["notes"].append("outputs of cells " + ", ".join(map(str, budget["cut"])) +
                                    " were cut in the graded notebook: past the output caps as written")
        return nb, resources


def capped(executed, index, budget):
    """Cell `index`'s outputs within the output caps, measured as they are written (written_size, as the
    executor measured them): the graded notebook never grows past what was measured."""
    kept, used = [], 0
    for out in executed.get(index, []):
        room = min(MAX_CELL_OUTPUT_CHARS + NOTE_ROOM - used, budget["left"])
        size = written_size(out, room)
        if size > room:
            budget["cut"].append(index)
            kept.append({"output_type": "stream", "name": "stdout", "text": DROPPED})
            break
        kept.append(out)
        used += size
        budget["left"] -= size
    return kept


def collect(config, student, lesson, autograded_dir):
    """Scores from the gradebook. A written answer (or task) with neither an automatic nor a manual score
    is pending: its score is None and it is listed in "pending" as (name, max points)."""
    from nbgrader.api import Gradebook, MissingEntry

    out = {"score": 0.0, "max_score": 0.0, "tests": [], "pending": [], "hand_graded": []}
    with Gradebook(config.CourseDirectory.db_url) as gb:
        try:
            nb = gb.find_submission_notebook(lesson, lesson, student)
        except MissingEntry:
            out["error"] = "no grade was recorded"
            return out
        out["score"] = float(nb.score or 0.0)
        out["max_score"] = float(nb.max_score or 0.0)
        tests = []
        for g in nb.grades:
            pending = g.auto_score is None and g.manual_score is None
            tests.append((g.name, None if pending else float(g.score or 0.0), float(g.max_score or 0.0)))
            if pending:
                out["pending"].append((g.name, float(g.max_score or 0.0)))
            elif g.manual_score is not None:
                out["hand_graded"].append(g.name)
    messages = {}
    try:
        graded = nbformat.read(os.path.join(autograded_dir, f"{lesson}.ipynb"), as_version=4)
        for cell in graded.cells:
            for o in cell.get("outputs", []):
                if o.get("output_type") == "error":
                    messages[grade_id(cell)] = f"{o.get('ename')}: {o.get('evalue')}"[:600]
            if utils.is_grade(cell) and (utils.is_solution(cell) or utils.is_task(cell)):
                messages.setdefault(grade_id(cell), "written answer")
    except Exception:  # noqa: BLE001
        pass
    for name, score, _ in tests:
        if score is None:
            messages[name] = "awaiting manual grading"
        elif name in out["hand_graded"]:
            messages[name] = "graded by hand"
        elif messages.get(name) == "written answer" and score == 0:
            messages[name] = "no answer (the cell is as released)"  # nbgrader scores an untouched answer 0
    out["tests"] = [(n, s, m, messages.get(n, "")) for n, s, m in sorted(tests)]
    return out


def handle(task, api, config, root):
    op = task["op"]
    if "student" in task and not is_student_id(task["student"]):  # the grader never sends one; refuse anyway
        return {"ok": False, "error": f"refused: {clean(ascii(task['student']))[:120]} is not a student id"}
    if op == "autograde":
        CURRENT.clear()
        CURRENT.update(ctl_dir=task["ctl_dir"], stop_reason=task["stop_reason"], notes=[])
        result = api.autograde(task["lesson"], task["student"], force=True, create=True)
        out = {"ok": bool(result["success"]), "notes": CURRENT["notes"]}
        if not result["success"]:
            out["error"] = (result.get("error") or result.get("log") or "")[-1500:]
            return out
        autograded = os.path.join(root, "autograder", "autograded", task["student"], task["lesson"])
        out.update(collect(config, task["student"], task["lesson"], autograded))
        return out
    if op == "feedback":
        result = api.generate_feedback(task["lesson"], task["student"], force=True)
        page = os.path.join(root, "autograder", "feedback", task["student"], task["lesson"],
                            f"{task['lesson']}.html")
        size = os.path.getsize(page) if result["success"] and os.path.exists(page) else 0
        if size > MAX_FEEDBACK_BYTES:  # measured as written; SafeFeedback's caps keep real pages far below
            return {"ok": False, "error": f"the page would take {size:,} bytes, more than "
                                          f"{MAX_FEEDBACK_BYTES // 2**20} MiB"}
        return {"ok": bool(result["success"]), "error": (result.get("error") or "")[-300:]}
    if op == "add_student":
        from nbgrader.api import Gradebook
        with Gradebook(config.CourseDirectory.db_url) as gb:
            gb.update_or_create_student(task["student"])
        return {"ok": True}
    if op == "export":
        from nbgrader.api import Gradebook
        from nbgrader.plugins import CsvExportPlugin
        tmp = task["dest"] + ".tmp"
        with Gradebook(config.CourseDirectory.db_url) as gb:
            CsvExportPlugin(to=tmp).export(gb)
        os.replace(tmp, task["dest"])
        return {"ok": True}
    if op == "noop":
        return {"ok": True}
    return {"ok": False, "error": f"unknown task {op!r}"}


def main():
    root, work = sys.argv[1], sys.argv[2]
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8", errors="backslashreplace")
    os.dup2(2, 1)  # nbgrader and nbconvert may print: keep the protocol channel clean
    sys.stdout = sys.stderr
    config = load_config(root, work)
    api = make_api(config)
    proto.write(json.dumps({"ready": True}) + "\n")
    proto.flush()
    for line in sys.stdin:
        try:
            task = json.loads(line)
            cpu0 = time.process_time()
            reply = handle(task, api, config, root)
            reply["cpu_s"] = round(time.process_time() - cpu0, 3)
        except Exception as exc:  # noqa: BLE001  (reported for this task; the worker keeps going)
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[-1500:]}
        proto.write(json.dumps(reply, ensure_ascii=True, default=str) + "\n")
        proto.flush()


if __name__ == "__main__":
    main()
