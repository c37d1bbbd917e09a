"""The grader against a hostile class, round three (issue 23): one test per hole, each failing on the old
grader.

1. a forged test cell carrying a manually graded code answer's grade_id never runs outside the sandbox;
2. links the kernel plants are never followed by the sandbox's privileged processes; the executor is
   not root; /proc/sys is read-only;
3. whole output messages are measured (metadata, MIME keys), outputs are capped per cell and per
   notebook, and the grader's work folders are removed after bookkeeping (`make clean` removes .work);
4. cgroup v1 or v2 limits, or a refusal that says why (detection tested on fake cgroup roots); the
   executor has an address-space limit and /run a size;
5. a notebook with far more cells than the lesson is refused before nbgrader sees it;
6. a student's timestamp.txt never sets the submission time;
7. the kernel's key management calls are denied (keyrings outlive a uid's processes);
8. checker children run in a limited cgroup with rlimits, and an answer larger than 8 MiB is refused;
9. student folders with odd names are graded under a safe alias and listed, not skipped silently.

The sandbox tests share one `grade.py --jobs 2` run over a small course (module fixture `graded`).
"""

import ctypes
import os
import platform
import subprocess
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

sys.path.insert(0, os.path.dirname(__file__))
import autograder_helpers as h  # noqa: E402

sys.path.insert(0, os.path.join(h.REPO, "autograder"))
import sandbox  # noqa: E402

LESSON = "sec"
PROBLEMS = sandbox.check()


def _host_has_v2():
    try:
        import cgroups
    except ImportError:  # the grader before issue 23
        return False
    return cgroups.detect().kind == "v2"
ODD_FOLDERS = ["-dash", "with space", "Jos\u00e9 Garc\u00eda", "x" * 120]


def lesson_notebook():
    """Two autograded exercises (a function called with a long argument, a value) and a manually graded code
    answer."""
    m = h._meta
    cells = [
        new_markdown_cell("# Security lesson", metadata=m("intro", locked=True)),
        new_code_cell("def total(xs):\n    ### BEGIN SOLUTION\n    return sum(xs)\n    ### END SOLUTION",
                      metadata=m("total", solution=True)),
        new_code_cell("from longctx.grading import check_integer\n"
                      "check_integer('total of 0..2999', total(list(range(3000))), 4498500, "
                      "answer_kind='function')",
                      metadata=m("test_total", grade=True, locked=True, points=2)),
        # nbgrader's manually graded *code* answer: unlocked, real points, its source kept by OverwriteCells
        new_code_cell("### BEGIN SOLUTION\nexplanation = 'a sum'\n### END SOLUTION",
                      metadata=m("explain_code", solution=True, grade=True, points=2)),
        new_code_cell("### BEGIN SOLUTION\nanswer_c = 7\n### END SOLUTION",
                      metadata=m("answer_c", solution=True)),
        new_code_cell("import resource\nfrom longctx.grading import check_integer\n"
                      "print('CHECKER_RLIMIT_CPU', resource.getrlimit(resource.RLIMIT_CPU)[0])\n"
                      "print('CHECKER_CGROUP', open('/proc/self/cgroup').read().replace(chr(10), ' '))\n"
                      "check_integer('answer c', answer_c, 7, answer_kind='value')",
                      metadata=m("test_answer_c", grade=True, locked=True, points=1)),
    ]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def cell_of(nb, grade_id):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def forged(released, marker):
    """Item 1: the written code answer's cell, re-labelled as a test cell, with code that writes on the
    host."""
    cell = cell_of(released, "explain_code")
    cell.metadata["nbgrader"]["solution"] = False
    cell.source = (f"import os\nopen({marker!r}, 'w').write('ran outside the sandbox')\n"
                   "print('SOLUTIONS', os.listdir(os.path.join(os.path.dirname(os.path.dirname("
                   + repr(marker) + ")), 'solutions')))")
    return released


# links where the old executor (root) wrote long requests: to a root-owned /proc/sys entry that only this
# sandbox sees (its own UTS namespace's hostname), and to a file of the student's own
PLANT = ("import os\nBAIT = '/home/student/bait.txt'\nopen(BAIT, 'w').write('untouched')\n"
         "os.chmod(BAIT, 0o600)\n"
         "os.makedirs('/tmp/.longctx-grader', exist_ok=True)\n"
         "os.symlink('/proc/sys/kernel/hostname', '/tmp/.longctx-grader/request.json.tmp')\n"
         "os.symlink(BAIT, '/tmp/.longctx-grader/request.json')\n"
         "for folder in ('/run/lcg', '/run', '/run/jupyter', '/ctl'):\n"
         "    try:\n        os.symlink(BAIT, folder + '/request-0.json')\n        print('PLANTED', folder)\n"
         "    except OSError as e:\n        print('cannot plant in', folder, type(e).__name__)\n")
INSPECT = ("import os\nprint('BAIT', open(BAIT).read()[:30], oct(os.stat(BAIT).st_mode & 0o777))\n"
           "print('HOSTNAME', open('/proc/sys/kernel/hostname').read().strip()[:80])\n"
           "status = open(f'/proc/{os.getppid()}/status').read()\n"
           "print('EXECUTOR_UID', [l for l in status.splitlines() if l.startswith('Uid:')][0].split()[1])\n"
           "limits = open(f'/proc/{os.getppid()}/limits').read()\n"
           "print('EXECUTOR_AS', "
           "[l for l in limits.splitlines() if l.startswith('Max address space')][0].split()[3])\n"
           "mounts = [l.split() for l in open('/proc/self/mountinfo')]\n"
           "print('PROCSYS', [m[5].split(',')[0] for m in mounts if m[4] == '/proc/sys'])\n"
           "st = os.statvfs('/run')\nprint('RUN_BYTES', st.f_blocks * st.f_frsize)\n")
FLOOD = ("from IPython.display import display\n"
         "for i in range(12):\n    display({'text/plain': 'x'}, metadata={'m': 'y' * 1_000_000}, raw=True)\n"
         "display({'k' * 100_000 + str(i): '' for i in range(100)}, raw=True)\n")
ADD_KEY = ("import ctypes, platform\nlibc = ctypes.CDLL(None, use_errno=True)\n"
           "nr = {'x86_64': 248, 'aarch64': 217}[platform.machine()]\n"
           "r = libc.syscall(nr, b'user', b'lcg-issue23', b'secret', 6, -4)\n"
           "print('ADD_KEY', r, ctypes.get_errno())\n")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if PROBLEMS:
        pytest.skip("; ".join(PROBLEMS))
    root = h.make_course(tmp_path_factory.mktemp("security"), lessons=[])
    os.makedirs(os.path.join(root, "solutions", LESSON))
    nbformat.write(lesson_notebook(), os.path.join(root, "solutions", LESSON, f"{LESSON}.ipynb"))
    h.release(root, LESSON)
    released, solution = (lambda: h.released(root, LESSON)), (lambda: h.solution(root, LESSON))
    marker = os.path.join(root, "autograder", "PWNED-item1")
    h.submit(root, "honest", LESSON, solution())
    h.submit(root, "forger", LESSON, forged(released(), marker))
    planter = h.answer(h.answer(solution(), "total", PLANT + "def total(xs):\n    return sum(xs)"),
                       "answer_c", "answer_c = 7\n" + INSPECT)
    h.submit(root, "planter", LESSON, planter)
    h.submit(root, "flooder", LESSON, h.answer(solution(), "answer_c", "answer_c = 7\n" + FLOOD))
    h.submit(root, "keyring", LESSON, h.answer(solution(), "answer_c", "answer_c = 7\n" + ADD_KEY))
    h.submit(root, "bigreply", LESSON,
             h.answer(solution(), "total", "def total(xs):\n    return ['x' * 1000] * 14_000"))
    h.submit(root, "timestamp", LESSON, solution(),
             extra_files={"timestamp.txt": "2000-01-01 00:00:00.000000 UTC"})
    bomb = solution()
    bomb.cells += [new_markdown_cell("") for _ in range(5_000)]
    h.submit(root, "cellbomb", LESSON, bomb)
    for folder in ODD_FOLDERS:
        h.submit(root, folder, LESSON, solution())
    result = h.grade(root, "--jobs", "2", "--cell-timeout-s", "60", "--call-timeout-s", "20", timeout=1500)
    grades, rows = h.read_grades(root)
    return root, result, grades, rows, marker


def outputs(root, student):
    nb = nbformat.read(os.path.join(root, "autograder", "autograded", student, LESSON, f"{LESSON}.ipynb"),
                       as_version=4)
    return "".join(o.get("text", "") + str(o.get("data", "")) for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))


@pytest.mark.slow
def test_the_run_finishes(graded):
    root, result, *_ = graded
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert h.read_grades(root)[0][("honest", LESSON)] == 3, h.report(root, "honest")


# ----------------------------------------------------------------------------- item 1
@pytest.mark.slow
def test_item1_a_forged_test_cell_never_runs_outside_the_sandbox(graded):
    root, result, grades, _rows, marker = graded
    assert not os.path.exists(marker), "the student's cell ran in the checker, on the host"
    assert grades[("forger", LESSON)] == 0, h.report(root, "forger")
    text = h.report(root, "forger")
    assert "[PENDING] explain_code" in text, text  # still the written answer it is, graded by a person


# ----------------------------------------------------------------------------- item 2
@pytest.mark.slow
def test_item2_planted_links_are_not_followed_and_the_executor_is_not_root(graded):
    root, _result, grades, *_ = graded
    text = outputs(root, "planter")
    assert grades[("planter", LESSON)] == 3, h.report(root, "planter")
    assert "HOSTNAME grader\n" in text, text[-2000:]  # the old executor wrote a request into it
    assert "BAIT untouched 0o600" in text, text[-2000:]
    assert "PLANTED" not in text, text[-2000:]
    uid = int(text.split("EXECUTOR_UID ")[1].split()[0])
    assert uid != 0 and uid >= sandbox.BASE_UID, text[-2000:]
    assert "PROCSYS ['ro']" in text, text[-2000:]


# ----------------------------------------------------------------------------- item 3
@pytest.mark.slow
def test_item3_whole_messages_are_capped_and_work_folders_removed(graded):
    root, _result, grades, *_ = graded
    path = os.path.join(root, "autograder", "autograded", "flooder", LESSON, f"{LESSON}.ipynb")
    assert os.path.getsize(path) < 1_000_000, os.path.getsize(path)  # 12 MB of metadata, 10 MB of MIME keys
    assert grades[("flooder", LESSON)] == 3
    assert "cells whose output was cut" in h.report(root, "flooder")
    work = os.path.join(root, "autograder", ".work")
    for sub in ("jobs", "staged"):
        assert not os.path.isdir(os.path.join(work, sub)) or os.listdir(os.path.join(work, sub)) == [], \
            os.listdir(os.path.join(work, sub))


def test_item3_make_clean_removes_the_work_folder():
    dry = subprocess.run(["make", "-n", "clean"], cwd=h.REPO, capture_output=True, text=True, check=True)
    assert "autograder/.work" in dry.stdout, dry.stdout


def test_a_students_folder_outlives_its_first_lesson_until_the_run_ends(tmp_path):
    """done() of a student's lesson leaves the student's folder: another of the student's lessons may be
    creating its folder in it at that moment (a fresh-clone run once lost a lesson to that: makedirs found no
    parent). The run removes the empty student folders once every job is done."""
    sys.path.insert(0, os.path.join(h.REPO, "autograder"))
    import pipeline

    work = tmp_path / ".work"
    jobs = [pipeline.Job("alice", lesson, ctl_dir=str(work / "jobs" / "alice" / lesson / "ctl"))
            for lesson in ("00_a", "01_b")]
    for job in jobs:
        os.makedirs(job.ctl_dir)
        os.makedirs(work / "staged" / "alice" / job.lesson)
    runner = object.__new__(pipeline.Run)
    runner.work = str(work)
    runner.done(jobs[0])
    assert os.listdir(work / "jobs" / "alice") == ["01_b"]
    runner.done(jobs[1])
    assert os.listdir(work / "jobs") == ["alice"]  # empty now, and kept until the run ends
    runner.remove_empty_student_folders()
    assert os.listdir(work / "jobs") == [] and os.listdir(work / "staged") == []


def test_item3_output_caps_count_whole_messages_and_the_notebook_total():
    import executor_output

    status = {"truncated_cells": [], "output_cut_at": None}
    caps = executor_output.OutputCaps(cell_cap=5 * 2**20, notebook_cap=10 * 2**20, status=status)
    kept = {}
    for cell in range(6):
        outs = kept.setdefault(cell, [])
        for _ in range(2):  # 2 MiB per message, all of it in metadata and MIME keys
            msg = {"msg_type": "display_data", "content": {"data": {"k" * 2**20: ""},
                                                           "metadata": {"m": "y" * 2**20},
                                                           "transient": {"display_id": "d"}}}
            out = caps.admit(msg, cell, outs, nbformat.v4.new_output)
            if out is not None:
                assert out["content"]["metadata"] == {} and "transient" not in out["content"]
                outs.append(out)
    assert status["output_cut_at"] == 2  # 10 MiB in total: two cells of 4 MiB, then nothing
    assert [len(kept[c]) for c in range(6)] == [2, 2, 1, 1, 1, 1], kept.keys()
    assert all(kept[c][0]["output_type"] == "stream" and "in total" in kept[c][0]["text"]
               for c in range(2, 6))
    assert status["truncated_cells"] == [2, 3, 4, 5]
    errors = [caps.admit({"msg_type": "error",
                          "content": {"ename": "E" * 6 * 2**20, "evalue": "v", "traceback": []}},
                         0, kept[0], nbformat.v4.new_output) for _ in range(1000)]
    assert sum(e is not None for e in errors) == 1  # past a cap: one short error per cell, not a thousand
    assert len(errors[0]["content"]["ename"]) <= 200


# ----------------------------------------------------------------------------- item 4
def _fake_v2(tmp_path, own="/", procs=None, controllers="cpuset cpu io memory hugetlb pids"):
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("")
    (root / "cgroup.procs").write_text("")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"0::{own}\n")
    if own != "/":
        mine = root / own.lstrip("/")
        mine.mkdir(parents=True)
        (mine / "cgroup.controllers").write_text(controllers + "\n")
        (mine / "cgroup.procs").write_text("\n".join(procs or []) + "\n")
    return str(root), str(proc)


def test_item4_cgroup_v2_limits_are_written_in_a_delegated_subtree(tmp_path):
    import cgroups

    root, proc = _fake_v2(tmp_path)
    host = cgroups.detect(root, proc, env={})
    assert (host.kind, host.base) == ("v2", os.path.join(root, "longctx-grader")), host
    host.activate()
    assert set(open(os.path.join(root, "cgroup.subtree_control")).read().split()) == {"+cpu", "+memory",
                                                                                      "+pids"}
    group = cgroups.Cgroup(host, "run", memory_bytes=5 * 2**30, max_pids=320, cpus=2)
    path = group.paths[0]
    assert os.path.dirname(path) == host.base
    read = lambda name: open(os.path.join(path, name)).read()  # noqa: E731
    assert (read("memory.max"), read("memory.swap.max"), read("pids.max"), read("cpu.max")) == \
        (str(5 * 2**30), "0", "320", "200000 100000")
    assert group.procs_files() == [os.path.join(path, "cgroup.procs")]


def test_item4_cgroup_v2_own_scope_and_explicit_delegation(tmp_path):
    import cgroups

    root, proc = _fake_v2(tmp_path, own="/system.slice/grader.scope", procs=[str(os.getpid())])
    host = cgroups.detect(root, proc, env={})
    assert host.kind == "v2" and host.move_self and host.base.endswith("grader.scope"), host
    delegated = os.path.join(root, "delegated")
    os.makedirs(delegated)
    open(os.path.join(delegated, "cgroup.controllers"), "w").write("cpu memory pids\n")
    open(os.path.join(delegated, "cgroup.procs"), "w").write("")
    host = cgroups.detect(root, proc, env={"LONGCTX_GRADER_CGROUP": delegated})
    assert (host.kind, host.base) == ("v2", delegated), host


@pytest.mark.parametrize("case", ["shared", "no_controllers", "nothing"])
def test_item4_without_usable_cgroups_the_grader_refuses_and_says_why(tmp_path, monkeypatch, capsys, case):
    import cgroups

    if case == "nothing":
        root, proc = str(tmp_path), str(tmp_path / "none")
    else:
        root, proc = _fake_v2(tmp_path, own="/user.slice/session-1.scope", procs=["1", str(os.getpid())],
                              controllers="cpu memory pids" if case == "shared" else "cpu io")
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", root)
    monkeypatch.setattr(cgroups, "PROC_SELF_CGROUP", proc)
    host = cgroups.detect()
    assert host.kind is None and host.problem
    words = {"shared": "Delegate=yes", "no_controllers": "memory, pids",
             "nothing": "no cgroup hierarchy"}[case]
    assert words in host.problem, host.problem
    if PROBLEMS and not any("cgroup" in p for p in PROBLEMS):
        pytest.skip("; ".join(PROBLEMS))  # no root or bubblewrap: grade.py stops before the cgroups anyway
    import grade

    assert grade.main(["--course-root", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "cannot grade safely" in out and words in out.replace("\n", " "), out


@pytest.mark.slow
@pytest.mark.skipif(not _host_has_v2() or os.geteuid() != 0,
                    reason="this host has no usable cgroup v2 (v1 here: see the "
                           "fake-root tests and the v1 run in test_autograder_hostile)")
def test_item4_cgroup_v2_limits_hold_on_this_host(tmp_path):
    import cgroups

    host = cgroups.detect()
    host.activate()
    group = cgroups.Cgroup(host, "probe", memory_bytes=64 * 2**20, max_pids=8, cpus=0.5)
    try:
        hog = subprocess.run([sys.executable, "-c", "b = bytearray(512 * 2**20); print(len(b))"],
                             preexec_fn=group.enter, capture_output=True)
        assert hog.returncode != 0 and group.oom_killed()
    finally:
        group.remove()


@pytest.mark.slow
def test_item4_executor_address_space_and_run_size_are_limited(graded):
    root, *_ = graded
    text = outputs(root, "planter")
    limit = text.split("EXECUTOR_AS ")[1].split()[0]
    assert limit != "unlimited" and int(limit) <= sandbox.Limits().executor_memory_bytes, text[-1500:]
    assert int(text.split("RUN_BYTES ")[1].split()[0]) <= 64 * 2**20, text[-1500:]


# ----------------------------------------------------------------------------- item 5
@pytest.mark.slow
def test_item5_a_notebook_with_too_many_cells_is_refused_before_nbgrader(graded):
    root, _result, grades, *_ = graded
    text = h.report(root, "cellbomb")
    assert "5,006 cells, more than the 12 this lesson allows" in text, text
    assert grades[("cellbomb", LESSON)] == 0


# ----------------------------------------------------------------------------- item 6
@pytest.mark.slow
def test_item6_timestamp_txt_never_sets_the_submission_time(graded):
    root, _result, grades, rows, _ = graded
    row = next(r for r in rows if r["student_id"] == "timestamp")
    assert not row["timestamp"].startswith("2000"), row
    assert grades[("timestamp", LESSON)] == 3
    assert "ignored timestamp.txt" in h.report(root, "timestamp")


# ----------------------------------------------------------------------------- item 7
@pytest.mark.slow
@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"),
                    reason="key syscall numbers known here only")
def test_item7_key_management_calls_are_denied(graded):
    root, *_ = graded
    text = outputs(root, "keyring")
    assert "ADD_KEY -1 1" in text, text[-1500:]  # EPERM: no key reaches the uid's keyring


# ----------------------------------------------------------------------------- item 8
@pytest.mark.slow
def test_item8_checkers_are_limited_and_huge_answers_refused(graded):
    root, _result, grades, *_ = graded
    assert grades[("bigreply", LESSON)] == 1
    assert "larger than 8 MiB" in h.report(root, "bigreply"), h.report(root, "bigreply")
    text = outputs(root, "honest")
    cpu = int(text.split("CHECKER_RLIMIT_CPU ")[1].split()[0])
    assert 0 < cpu <= 400, text[-1500:]
    assert "longctx-grader-checkers" in text.split("CHECKER_CGROUP ")[1], text[-1500:]


# ----------------------------------------------------------------------------- item 9
@pytest.mark.slow
def test_item9_odd_folder_names_are_graded_under_an_alias(graded):
    root, result, grades, *_ = graded
    aliases = {s for s, lesson in grades if lesson == LESSON} - {"honest", "forger", "planter", "flooder",
                                                                   "keyring", "bigreply", "timestamp",
                                                                   "cellbomb"}
    assert len(aliases) == len(ODD_FOLDERS), (aliases, result.stdout[-3000:])
    for alias in aliases:
        assert grades[(alias, LESSON)] == 3, h.report(root, alias)
        assert "cannot be a student id" in h.report(root, alias)
    assert "skipped" not in result.stdout, result.stdout[-3000:]
    import staging

    for folder in ODD_FOLDERS:  # quoted, so that no name reads as table text
        assert f"[folder: {staging.shown(folder, 120)}]" in result.stdout, folder


def test_item9_discover_gives_safe_aliases_and_lists_what_it_skips(tmp_path):
    import staging

    base = tmp_path / "autograder" / "submitted"
    for folder in ODD_FOLDERS + ["alice", ".git"]:
        (base / folder / LESSON).mkdir(parents=True)
    (base / "alice" / "unknown_lesson").mkdir()
    os.symlink(base / "alice", base / "linked")
    found, skipped, ids = staging.discover(str(tmp_path), set(), set(), {LESSON})
    assert {folder for _, folder, _ in found} == set(ODD_FOLDERS) | {"alice"}
    for student, folder, _ in found:
        assert staging.ID_RE.match(student) and (student == folder) == (folder == "alice"), (student, folder)
    assert len({student for student, _, _ in found}) == len(found)
    reasons = {(s, lesson): why for s, lesson, why in skipped}
    assert reasons[("alice", "'unknown_lesson'")] == "no such lesson in solutions/"
    assert "symbolic link" in reasons[("linked", "*")] and "hidden" in reasons[("'.git'", "*")]


def test_item6_staging_drops_timestamp_txt(tmp_path):
    import staging

    folder = tmp_path / "autograder" / "submitted" / "alice" / LESSON
    folder.mkdir(parents=True)
    (folder / "timestamp.txt").write_text("2000-01-01 00:00:00.000000 UTC")
    (folder / f"{LESSON}.ipynb").write_text("{}")
    dst, notes = staging.stage(str(tmp_path), str(tmp_path / "work"), "alice", "alice", LESSON)
    assert sorted(os.listdir(dst)) == [f"{LESSON}.ipynb"] and any("timestamp.txt" in n for n in notes)


def test_item7_the_seccomp_program_denies_the_key_calls():
    import struct

    import seccomp

    program = seccomp.sandbox_filter("x86_64")
    ops = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    assert ops[-1] == (0x06, 0, 0, 0x00050001)  # deny: EPERM
    deny = len(ops) - 1
    denied = {k for i, (code, jt, _, k) in enumerate(ops) if code == 0x15 and jt and i + 1 + jt == deny}
    # add_key, request_key, keyctl; user namespaces: test_autograder_hostile4
    assert denied == {248, 249, 250}
    assert seccomp.sandbox_filter("sparc") is None
    assert ctypes.sizeof(ctypes.c_uint32) == 4
