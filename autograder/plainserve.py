"""The kernel's side of the plain-data protocol: answers one checker request in the student's kernel.

The executor (grader_link.py) sends this file's source, after plaindata.py's, into the student's kernel at
each test cell, where both run as one module (`_lcg_serve`). `serve(request_text)` answers one request
and publishes the answer as display data of type MIME. Whatever the kernel answers is only ever the
student's own value: the checks run elsewhere, and the checker decodes every answer strictly.
"""

if __name__ != "_lcg_serve":  # imported on its own (by tests, linters): the codec comes from plaindata.py
    from plaindata import MAX_TEXT_BYTES, MIME, NotPlainData, decode, dumps, encode, loads, type_name  # noqa: F401

_OBJECTS = {}


def _user_ns():
    from IPython import get_ipython
    return get_ipython().user_ns


def _answer(request):
    op = request.get("op")
    ns = _user_ns()
    if op == "describe":
        name = request["name"]
        if name not in ns:
            return {"ok": True, "kind": "missing"}
        value = ns[name]
        if isinstance(value, type):
            return {"ok": True, "kind": "class", "type": type_name(value)}
        if callable(value):
            return {"ok": True, "kind": "function", "type": type_name(value)}
        try:
            return {"ok": True, "kind": "value", "value": encode(value, name)}
        except NotPlainData as exc:
            return {"ok": True, "kind": "other", "type": type_name(value), "why": str(exc)}
    if op in ("call", "new"):
        target = ns.get(request["name"], None) if "name" in request else _OBJECTS.get(request.get("ref"))
        if target is None:
            return {"ok": False, "ename": "NameError",
                    "evalue": f"name {request.get('name')!r} is not defined"}
        args = decode(request["args"])
        kwargs = decode(request["kwargs"])
        result = target(*args, **kwargs)
        if op == "new":
            ref = len(_OBJECTS) + 1
            _OBJECTS[ref] = result
            return {"ok": True, "ref": ref}
        return {"ok": True, "value": encode(result, request.get("what", "the result"))}
    if op == "decide":
        from longctx.lessons.policy_state import decide
        obj = _OBJECTS.get(request.get("ref"))
        result = decide(obj, decode(request["state"]))
        return {"ok": True, "value": encode(result, "the scheduler's decision")}
    if op == "clear":
        _OBJECTS.clear()
        return {"ok": True}
    return {"ok": False, "ename": "ValueError", "evalue": f"unknown request {op!r}"}


def serve(request_text):
    try:
        reply = _answer(loads(request_text))
    except NotPlainData as exc:
        reply = {"ok": False, "notplain": str(exc)[:2000]}
    except BaseException as exc:  # noqa: BLE001  (the student's exception, reported as theirs)
        reply = {"ok": False, "ename": type(exc).__name__[:100], "evalue": str(exc)[:2000]}
    try:
        text = dumps(reply)
    except (NotPlainData, ValueError) as exc:
        text = dumps({"ok": False, "notplain": str(exc)[:2000]})
    from IPython.display import display
    display({MIME: text}, raw=True)


def serve_file(path):
    """`serve` for a request the executor left in a file (long requests: no big literal to parse)."""
    with open(path, encoding="utf-8") as fh:
        serve(fh.read(MAX_TEXT_BYTES + 1))
