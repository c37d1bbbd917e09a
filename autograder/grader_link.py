"""The executor's side of the grader's socket: announces test cells and relays checker requests (in the
sandbox).

At a test cell the executor tells the grader (over /ctl/grader.sock, which the kernel's uid cannot
reach) which cell it is; while the grader's checker runs, this relays the checker's requests ("describe
name", "call function", "new object", "decide") to the kernel and the kernel's plain-data answers back.
The kernel answers through a small module (plaindata.py's codec and plainserve.py's `serve`) installed
at each test cell; its answers are the student's own values only, each request has a time limit, and
each answer at most plaindata.MAX_TEXT_BYTES.

A long request reaches the kernel through a file in /run/lcg, a folder of the executor's uid that the
kernel's uid can read but not write: created with O_CREAT|O_EXCL|O_NOFOLLOW relative to the folder's
descriptor, so no link the kernel could plant is ever followed.
"""

import asyncio
import itertools
import json
import os
import time

MIME = "application/x-longctx-reply"
SERVE_SOURCES = ("/opt/grader/plaindata.py", "/opt/grader/plainserve.py")
REQUEST_DIR = "/run/lcg"
INLINE_CHARS = 2000
MAX_REPLY_BYTES = 8 * 2**20      # plaindata.MAX_TEXT_BYTES: the checker refuses anything larger
MAX_LINE_BYTES = 3 * MAX_REPLY_BYTES


class GraderLink:
    def __init__(self, reader, writer, job):
        self.reader, self.writer = reader, writer
        self.call_timeout_s = float(job.get("call_timeout_s", 20))
        self.serve_source = ""
        for path in SERVE_SOURCES:
            with open(path) as fh:
                self.serve_source += fh.read() + "\n"
        self.dir_fd = os.open(REQUEST_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        self.names = (f"request-{n}.json" for n in itertools.count())
        self.last = None

    @classmethod
    async def connect(cls, job):
        reader, writer = await asyncio.open_unix_connection(job["socket"], limit=MAX_LINE_BYTES)
        return cls(reader, writer, job)

    async def send(self, obj):
        self.writer.write((json.dumps(obj) + "\n").encode())
        await self.writer.drain()

    async def check(self, client, index, deadline):
        """Let the grader check test cell `index`, answering its questions with the kernel's data."""
        await self.send({"op": "test", "cell": index})
        installed = await self.kernel(client, "import sys as _lcg_s, types as _lcg_t\n"
                                      "_lcg_m = _lcg_t.ModuleType('_lcg_serve')\n"
                                      f"exec({self.serve_source!r}, _lcg_m.__dict__)\n"
                                      "_lcg_s.modules['_lcg_serve'] = _lcg_m\n"
                                      "del _lcg_s, _lcg_t, _lcg_m", expect_reply=False)
        while True:
            line = await asyncio.wait_for(self.reader.readline(),
                                          timeout=max(5.0, deadline - time.monotonic() + 60))
            if not line:
                raise ConnectionError("the grader closed the connection")
            request = json.loads(line)
            if request.get("op") == "done":
                self._forget_last()
                await self.kernel(client, "import sys as _lcg_s\n_lcg_s.modules.pop('_lcg_serve', None)\n"
                                  "del _lcg_s", expect_reply=False)
                return
            if installed is not True:
                reply = "!the notebook's kernel could not load the grader's answering code " + str(installed)
            elif not await client.km.is_alive():
                reply = "!the notebook's kernel is not running any more"
            else:
                reply = await self.kernel(client, self.request_code(request["text"]))
            await self.send({"text": reply})

    def request_code(self, text):
        """The kernel's code for one request: the request inline when short, else read from a file."""
        if len(text) < INLINE_CHARS:
            return f"__import__('sys').modules['_lcg_serve'].serve({text!r})"
        self._forget_last()
        name = next(self.names)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                     dir_fd=self.dir_fd)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), 0o644)
            fh.write(text)
        self.last = name
        return f"__import__('sys').modules['_lcg_serve'].serve_file({os.path.join(REQUEST_DIR, name)!r})"

    def _forget_last(self):
        if self.last is not None:
            try:
                os.unlink(self.last, dir_fd=self.dir_fd)
            except OSError:
                pass
            self.last = None

    async def kernel(self, client, code, expect_reply=True):
        """Run `code` silently in the kernel; return the last reply it displayed (or "!problem")."""
        replies, size = [], [0]

        def hook(msg):
            if msg["msg_type"] == "display_data":
                data = msg["content"].get("data", {})
                text = data.get(MIME) if isinstance(data, dict) else None
                if isinstance(text, str):
                    size[0] += len(text)
                    if size[0] <= MAX_REPLY_BYTES:
                        replies.append(text)
            elif msg["msg_type"] == "error" and not expect_reply:
                replies.append("error: " + str(msg["content"].get("ename", ""))[:100])

        try:
            reply = await client.kc.execute_interactive(code, silent=True, store_history=False,
                                                        allow_stdin=False, stop_on_error=False,
                                                        timeout=self.call_timeout_s, output_hook=hook)
        except TimeoutError:
            try:
                await client.km.interrupt_kernel()
            except Exception:  # noqa: BLE001
                pass
            return f"!the student's code did not answer within {self.call_timeout_s:g} s (it was interrupted)"
        if not expect_reply:
            return (True if reply.get("content", {}).get("status") == "ok"
                    else (replies[-1][:200] if replies else ""))
        if size[0] > MAX_REPLY_BYTES:
            return (f"!the notebook's answer was larger than {MAX_REPLY_BYTES // 2**20} MiB (the limit of "
                    "one answer)")
        if not replies:
            return "!the notebook's kernel gave no answer"
        return replies[-1]
