"""The grader against a hostile class, round four (issue 44): one family per break, each failing on the old
grader.

1. user namespaces: `unshare -U` (and clone with CLONE_NEWUSER) fails inside the sandbox (seccomp), threads
   and subprocesses still work;
2. TCP buffers: a submission's loopback connections cannot buffer more than its cgroup allows (v1:
   memory.kmem.tcp.limit_in_bytes; v2: memory.max counts sockets);
3. student ids are matched whole (`alice\\n` is not alice): no broken grades.csv row, refused ids get an
   alias and a line in the summary, the bookkeeper refuses a non-id;
4. only the notebook (and files the lesson ships) reaches the sandbox, autograded/ and feedback/;
5. a student's string cannot start a line of a report or of the summary, nor reorder it (line breaks,
   control and bidi characters escaped);
6. a forged reply that spins the checker stops at the checker's CPU limit and is counted in the timings;
   the sandbox's /proc/1/cmdline shows no host path.

Every payload is bounded (at most 192 MiB of TCP buffers for at most 15 s, a 6 MB reply, 5 CPU seconds).
The sandbox tests share one `grade.py --jobs 2` run over the toy lesson (module fixture `graded`), where
honest neighbours must keep full marks.
"""

import json
import os
import platform
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import autograder_helpers as h  # noqa: E402

sys.path.insert(0, os.path.join(h.REPO, "autograder"))
import cgroups  # noqa: E402
import sandbox  # noqa: E402
import staging  # noqa: E402

LESSON = "toy"
FULL = 5
PROBLEMS = sandbox.check()
KNOWN_ARCH = platform.machine() in ("x86_64", "aarch64")
MiB = 2**20

# buffers up to TOTAL bytes in N loopback TCP connections that nobody reads (15 s at most), prints the total
TCP_PAYLOAD = """
import socket, sys, time
TOTAL, N = int(sys.argv[1]), int(sys.argv[2])
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(N)
pairs, sent, chunk, t0, stalled = [], 0, b"x" * 65536, time.monotonic(), 0
for _ in range(N):
    c = socket.create_connection(srv.getsockname()); s, _ = srv.accept(); \
c.setblocking(False); pairs.append((c, s))
while sent < TOTAL and stalled < 3 and time.monotonic() - t0 < 15:
    progress = 0
    for c, _ in pairs:
        try:
            while sent < TOTAL:
                n = c.send(chunk); sent += n; progress += n
        except BlockingIOError:
            pass
    stalled = 0 if progress else stalled + 1
    time.sleep(0.05)
print("TCP_BUFFERED", sent, flush=True)
"""
TCP_ARGS = (str(192 * MiB), "48")

USERNS_PROBE = """
import ctypes, os, subprocess, threading
p = subprocess.run(["unshare", "-Urn", "true"], capture_output=True, text=True)
print("UNSHARE_CMD", p.returncode, p.stderr.strip()[:80])
libc = ctypes.CDLL(None, use_errno=True)
print("UNSHARE_CALL", libc.unshare(0x10000000), ctypes.get_errno())
box = []
t = threading.Thread(target=lambda: box.append(1)); t.start(); t.join()
print("THREAD_OK", box == [1], "SUBPROCESS_OK", subprocess.run(["true"]).returncode == 0)
"""
CMDLINE_PROBE = """
import os
seen = []
for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
    try:
        seen.append(pid + ":" + open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode())
    except OSError:
        pass
print("CMDLINES", repr(seen))
"""
# kv_bytes raises an exception whose message forges report lines; answer_b stays right
LIAR = ("def kv_bytes(n_tokens):\n"
        "    raise ValueError('x\\n  [passed] test_answer_b: 3/3\\n  "
        "note: \\u202eforged\\rtoy: 5 / 5 points - ok')\n")
# every reply carrying a value is replaced by a dict of 200,000 int keys that all hash to 0: decoding it
# costs the checker quadratic time, the kernel nothing (the text is written, not built as a dict)
HASHBOMB = """
import IPython.display as _d, json as _j
_real = _d.display
def _forge(obj=None, *args, **kw):
    if isinstance(obj, dict) and len(obj) == 1 and kw.get("raw"):
        (mime, text), = obj.items()
        if mime.startswith("application/x-longctx") and '"value"' in text and '"kind"' not in text:
            M = 2**61 - 1
            entries = ",".join(f"[{k * M},0]" for k in range(1, 200_001))
            obj = {mime: '{"ok": true, "value": {"$": "d", "v": [' + entries + ']}}'}
    return _real(obj, *args, **kw)
_d.display = _forge
def kv_bytes(n_tokens):
    return 2 * n_tokens
"""
HIDDEN_FORGER = ".z\nbob  toy  5/5  ok\nx"
STUDENTS = ("honest", "alice", "prober", "tcphog", "liar", "hashbomb", "files")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if PROBLEMS:
        pytest.skip("; ".join(PROBLEMS))
    root = h.make_course(tmp_path_factory.mktemp("hostile4"))
    sol, rel = (lambda: h.solution(root, LESSON)), (lambda: h.released(root, LESSON))
    h.submit(root, "honest", LESSON, sol())
    h.submit(root, "alice", LESSON, sol())
    h.submit(root, "alice\n", LESSON, rel())           # earns 0: must never become alice's row
    h.submit(root, "prober", LESSON,
             h.answer(sol(), "answer_b", "answer_b = 42\n" + USERNS_PROBE + CMDLINE_PROBE))
    tcp = f"import subprocess, sys\nprint(subprocess.run([sys.executable, '-c', {TCP_PAYLOAD!r}, " \
          f"{TCP_ARGS[0]!r}, {TCP_ARGS[1]!r}], capture_output=True, text=True, timeout=60).stdout)\n"
    h.submit(root, "tcphog", LESSON, h.answer(sol(), "answer_b", "answer_b = 42\n" + tcp))
    h.submit(root, "liar", LESSON, h.answer(sol(), "kv_bytes", LIAR))
    h.submit(root, "hashbomb", LESSON, h.answer(sol(), "kv_bytes", HASHBOMB))
    folder = h.submit(root, "files", LESSON, sol(), extra_files={
        "evil.html": "<script>alert(1)</script>", "x.html\n": "<script>alert(2)</script>",
        "blob.bin": "b" * (2 * MiB)})
    os.makedirs(os.path.join(folder, "sub"))
    with open(os.path.join(folder, "sub", "pic.svg"), "w") as fh:
        fh.write("<svg onload=alert(3)></svg>")
    h.submit(root, HIDDEN_FORGER, LESSON, sol())
    timings = os.path.join(str(root), "t.json")
    result = h.grade(root, "--jobs", "2", "--cell-timeout-s", "60", "--call-timeout-s", "20",
                     "--test-timeout-s", "60", "--checker-cpu-s", "5", "--timings", timings, timeout=1200)
    return root, result, timings


def _outputs(root, student):
    import nbformat

    path = os.path.join(root, "autograder", "autograded", student, LESSON, f"{LESSON}.ipynb")
    nb = nbformat.read(path, as_version=4)
    return "".join(o.get("text", "") + str(o.get("data", "")) for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))


def _grades(root):
    return h.read_grades(root)


@pytest.mark.slow
def test_the_run_finishes_and_honest_neighbours_keep_full_marks(graded):
    root, result, _ = graded
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    grades, _rows = _grades(root)
    for student in ("honest", "alice", "prober", "tcphog", "files"):
        assert grades[(student, LESSON)] == FULL, h.report(root, student)


# ----------------------------------------------------------------------------- 1. user namespaces
@pytest.mark.slow
@pytest.mark.skipif(not KNOWN_ARCH, reason="the seccomp filter is built for x86_64 and aarch64")
def test_user_namespaces_are_denied_in_the_sandbox(graded):
    root, *_ = graded
    text = _outputs(root, "prober")
    assert "UNSHARE_CMD 0" not in text and "UNSHARE_CMD " in text, text[-2000:]
    assert "UNSHARE_CALL -1 1" in text, text[-2000:]  # EPERM
    assert "THREAD_OK True SUBPROCESS_OK True" in text, text[-2000:]


@pytest.mark.skipif(not KNOWN_ARCH, reason="the seccomp filter is built for x86_64 and aarch64")
def test_the_filter_denies_new_user_namespaces_and_keeps_threads(tmp_path):
    control = subprocess.run(["unshare", "-U", "true"], capture_output=True)
    if control.returncode != 0:
        pytest.skip("this host denies user namespaces anyway: the filter cannot be told apart")
    loader = (
        "import ctypes, subprocess, sys, threading\nsys.path.insert(0, sys.argv[1])\nimport seccomp\n"
        "prog = seccomp.sandbox_filter()\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "class F(ctypes.Structure):\n    _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_char_p)]\n"
        "buf = ctypes.create_string_buffer(prog, len(prog))\n"
        "assert libc.prctl(38, 1, 0, 0, 0) == 0\n"
        "assert libc.prctl(22, 2, ctypes.byref(F(len(prog) // 8, ctypes.cast(buf, ctypes.c_char_p))), "
        "0, 0) == 0\n"
        "print('CMD', subprocess.run(['unshare', '-U', 'true'], capture_output=True).returncode)\n"
        "print('CALL', libc.unshare(0x10000000), ctypes.get_errno())\n"
        "print('NET_ONLY', libc.unshare(0x40000000), ctypes.get_errno())\n"
        "t = threading.Thread(target=print, args=('THREAD',)); t.start(); t.join()\n")
    out = subprocess.run([sys.executable, "-c", loader, os.path.join(h.REPO, "autograder")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0] != "CMD 0" and lines[1] == "CALL -1 1" and "THREAD" in lines, out.stdout
    # flags without CLONE_NEWUSER are not the filter's business (root may unshare a netns)
    if os.geteuid() == 0:
        assert lines[2].startswith("NET_ONLY 0 "), out.stdout


# ----------------------------------------------------------------------------- 2. TCP buffers
@pytest.mark.slow
def test_tcp_buffers_of_a_submission_are_capped(graded):
    root, *_ = graded
    text = _outputs(root, "tcphog")
    buffered = int(text.split("TCP_BUFFERED ")[1].split()[0])
    assert buffered < 128 * MiB, (buffered, text[-1500:])  # the old grader let 192 MiB through on v1


def test_cgroup_v1_caps_tcp_buffers_and_a_v1_host_without_the_cap_is_refused(tmp_path):
    root = tmp_path / "cg"
    for controller in ("memory", "pids", "cpu"):
        (root / controller).mkdir(parents=True)
    assert cgroups.detect(str(root), str(tmp_path / "none"), env={}).kind is None  # no tcp limit file
    (root / "memory" / "memory.kmem.tcp.limit_in_bytes").write_text("9223372036854771712\n")
    host = cgroups.detect(str(root), str(tmp_path / "none"), env={})
    assert host.kind == "v1", host
    group = cgroups.Cgroup(host, "run", memory_bytes=5 * 2**30, max_pids=320, cpus=1)
    assert (open(os.path.join(group.paths[0], "memory.kmem.tcp.limit_in_bytes")).read()
            == str(cgroups.SOCKET_BYTES))


@pytest.mark.parametrize("option", ["nosocket", "nokmem", "nobpf,nosocket"])
def test_a_kernel_that_charges_sockets_or_kernel_memory_to_no_cgroup_is_refused(tmp_path, option):
    root = tmp_path / "cg"
    for controller in ("memory", "pids", "cpu"):
        (root / controller).mkdir(parents=True)
    (root / "memory" / "memory.kmem.tcp.limit_in_bytes").write_text("9223372036854771712\n")
    cmdline = tmp_path / "cmdline"
    cmdline.write_text(f"BOOT_IMAGE=/vmlinuz ro cgroup.memory={option} quiet\n")
    host = cgroups.detect(str(root), str(tmp_path / "none"), env={}, cmdline=str(cmdline))
    assert host.kind is None and "cgroup.memory=" in host.problem and option.split(",")[-1] in host.problem
    cmdline.write_text("BOOT_IMAGE=/vmlinuz ro quiet\n")
    assert cgroups.detect(str(root), str(tmp_path / "none"), env={}, cmdline=str(cmdline)).kind == "v1"


def test_grading_refuses_an_architecture_the_seccomp_filter_does_not_know(tmp_path):
    import seccomp

    limit = tmp_path / "max_user_namespaces"
    limit.write_text("15000\n")
    assert seccomp.unprotected_here("x86_64", str(limit)) is None
    problem = seccomp.unprotected_here("riscv64", str(limit))
    assert "riscv64" in problem and "max_user_namespaces=0" in problem
    limit.write_text("0\n")  # the host allows no user namespaces at all: the filter's main job is done
    assert seccomp.unprotected_here("riscv64", str(limit)) is None


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or cgroups.detect().kind is None,
                    reason="needs root and usable cgroups")
def test_tcp_buffers_are_charged_on_this_host():
    host = cgroups.detect()
    host.activate()
    group = cgroups.Cgroup(host, "tcpprobe", memory_bytes=128 * MiB, max_pids=16, cpus=1)
    try:
        out = subprocess.run([sys.executable, "-c", TCP_PAYLOAD, *TCP_ARGS], preexec_fn=group.enter,
                             capture_output=True, text=True, timeout=90)
        if out.returncode != 0:  # v2 may kill it at memory.max: charged, which is the point
            assert group.oom_killed(), out.stderr[-1500:]
            return
        buffered = int(out.stdout.split()[1])
        assert MiB < buffered < 128 * MiB, buffered
    finally:
        group.remove()


PIPE_PAYLOAD = """
import os, resource
resource.setrlimit(resource.RLIMIT_NOFILE, (4200, 4200))
held = 0
try:
    for _ in range(2000):
        r, w = os.pipe(); os.set_blocking(w, False)
        try:
            while True:
                held += os.write(w, b"x" * 65536)
        except BlockingIOError:
            pass
except OSError:
    pass
print("PIPES_HELD", held, flush=True)
"""


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or cgroups.detect().kind is None,
                    reason="needs root and usable cgroups")
def test_kernel_memory_is_charged_to_the_cgroup_on_this_host():
    """Pipe buffers are kernel memory: up to 125 MiB of them, in a cgroup of 64 MiB, never get past it
    (v1 and v2 both charge kernel memory to the memory limit; this guards that claim of the README)."""
    host = cgroups.detect()
    host.activate()
    group = cgroups.Cgroup(host, "kmemprobe", memory_bytes=64 * MiB, max_pids=16, cpus=1)
    try:
        out = subprocess.run([sys.executable, "-c", PIPE_PAYLOAD], preexec_fn=group.enter,
                             capture_output=True, text=True, timeout=90)
        if out.returncode != 0:
            assert group.oom_killed(), out.stderr[-1500:]
            return
        assert int(out.stdout.split()[1]) < 64 * MiB, out.stdout
    finally:
        group.remove()


# ----------------------------------------------------------------------------- 3. student ids
@pytest.mark.slow
def test_a_newline_folder_never_forges_a_grade_row(graded):
    root, result, _ = graded
    grades, rows = _grades(root)
    assert all(staging.is_student_id(r["student_id"]) for r in rows), [r["student_id"] for r in rows]
    alice = [float(r["score"]) for r in rows if r["student_id"] == "alice"]
    assert alice == [FULL], rows
    aliases = [s for s, _ in grades if s.startswith("alice-")]
    assert len(aliases) == 1 and grades[(aliases[0], LESSON)] == 0, grades
    assert "[folder: 'alice\\n']" in result.stdout, result.stdout[-3000:]


def test_ids_are_matched_whole_and_the_bookkeeper_refuses_others(tmp_path):
    import bookkeeper

    base = tmp_path / "autograder" / "submitted"
    for folder in ("alice", "alice\n", "bob\r"):
        (base / folder / LESSON).mkdir(parents=True)
    found, _skipped, ids = staging.discover(str(tmp_path), set(), set(), {LESSON})
    assert ids["alice"] == "alice" and ids["alice\n"] != "alice" and ids["bob\r"].startswith("bob-"), ids
    assert all(staging.is_student_id(s) for s, _, _ in found)
    reply = bookkeeper.handle({"op": "add_student", "student": "alice\n"}, None, None, None)
    assert not reply["ok"] and "not a student id" in reply["error"], reply


# ----------------------------------------------------------------------------- 4. student files
@pytest.mark.slow
def test_only_the_notebook_reaches_autograded_and_feedback(graded):
    root, *_ = graded
    for kind, name in (("autograded", f"{LESSON}.ipynb"), ("feedback", f"{LESSON}.html")):
        folder = os.path.join(root, "autograder", kind, "files", LESSON)
        assert sorted(os.listdir(folder)) == [name], (kind, os.listdir(folder))
    text = h.report(root, "files")
    assert "ignored 'evil.html'" in text and "ignored 'sub'" in text and "ignored 'x.html\\n'" in text, text


def test_staging_copies_the_notebook_and_the_lessons_own_files_only(tmp_path):
    src = tmp_path / "autograder" / "submitted" / "alice" / LESSON
    (src / "sub").mkdir(parents=True)
    for name in (f"{LESSON}.ipynb", "data.csv", "evil.html", "x.html\n", "sub/pic.svg"):
        (src / name).write_text("{}")
    lesson = tmp_path / "solutions" / LESSON
    lesson.mkdir(parents=True)
    (lesson / f"{LESSON}.ipynb").write_text("{}")
    (lesson / "data.csv").write_text("a,b\n")  # a file the lesson ships: the student's copy is graded
    dst, notes = staging.stage(str(tmp_path), str(tmp_path / "work"), "alice", "alice", LESSON)
    assert sorted(os.listdir(dst)) == ["data.csv", f"{LESSON}.ipynb"], os.listdir(dst)
    assert len(notes) == 3 and all("\n" not in n for n in notes), notes


def test_a_notebook_that_is_a_link_or_a_hard_link_is_not_copied(tmp_path):
    src = tmp_path / "autograder" / "submitted"
    outside = tmp_path / "outside.ipynb"
    outside.write_text("{}")
    (src / "linker" / LESSON).mkdir(parents=True)
    os.symlink(outside, src / "linker" / LESSON / f"{LESSON}.ipynb")
    (src / "hard" / LESSON).mkdir(parents=True)
    os.link(outside, src / "hard" / LESSON / f"{LESSON}.ipynb")
    for student, why in (("linker", "not a regular file"), ("hard", "a hard link")):
        dst, notes = staging.stage(str(tmp_path), str(tmp_path / "work"), student, student, LESSON)
        assert os.listdir(dst) == [] and any(why in n for n in notes), notes


# ----------------------------------------------------------------------------- 5. forged lines
@pytest.mark.slow
def test_student_strings_cannot_forge_report_or_summary_lines(graded):
    root, result, _ = graded
    text = h.report(root, "liar")
    assert "\u202e" not in text and "\r" not in text and "\\u202e" in text, text
    assert [line for line in text.split("\n")
            if line.startswith("  [passed]")] == ["  [passed] test_answer_b: 3/3"], text
    assert h.read_grades(root)[0][("liar", LESSON)] == 3
    assert not any(line.startswith(("bob", "x ")) for line in result.stdout.split("\n")), \
        result.stdout[-3000:]
    assert "\u202e" not in result.stdout


def test_clean_escapes_line_breaks_control_and_bidi_characters():
    import reports

    assert staging.clean("a\nb\r\u202ec\x1b[1m\u2028\u2066d") == "a\\nb\\r\\u202ec\\x1b[1m\\u2028\\u2066d"
    job = type("J", (), {})()
    job.__dict__.update(lesson=LESSON, result=None, pending=[], hand_graded=[], score=0.0, max_score=5.0,
                        error="", oom_note="", flags=[], notes=["n\nfake"],
                        tests=[("t", 0.0, 2.0, "E: m\n  [passed] t: 2/2")])
    lines = reports.report_lines(job)
    assert all("\n" not in line for line in lines) and not any(line.startswith("  [passed]")
                                                               for line in lines)


# ----------------------------------------------------------------------------- 6. checker CPU, /proc
@pytest.mark.slow
def test_a_checker_spun_by_a_forged_reply_stops_at_its_cpu_limit_and_is_counted(graded):
    root, _result, timings = graded
    assert h.read_grades(root)[0][("hashbomb", LESSON)] == 3, h.report(root, "hashbomb")
    assert "grader's CPU" in h.report(root, "hashbomb"), h.report(root, "hashbomb")
    rows = {r["student"]: r for r in json.load(open(timings))["submissions"]}
    assert rows["hashbomb"]["check_cpu_s"] >= 3.5, rows["hashbomb"]
    assert rows["honest"]["check_cpu_s"] < 3, rows["honest"]


@pytest.mark.slow
def test_the_sandbox_proc_shows_no_host_path(graded):
    root, *_ = graded
    text = _outputs(root, "prober")
    seen = text.split("CMDLINES ")[1].split("\n")[0]
    assert "1:bwrap --args" in seen, seen
    assert root not in seen and "--bind" not in seen, seen
    # the course's checkout and its .venv
    course = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert course not in seen and sys.prefix not in seen and "/opt/venv/bin/" in seen, seen
