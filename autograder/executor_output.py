"""What the executor keeps of a cell's outputs, and how it writes them (inside the sandbox).

Every output message is measured whole (`written_size`: its data, MIME keys, metadata, names and texts
all count, as nbformat writes them in the graded notebook: indented, text split in lines, non-ASCII
escaped, an upper bound of its bytes on disk), against a cap per cell and a cap for the whole notebook
(the bookkeeper measures them again, the same way, before it writes the graded notebook); beyond a cap
the output is dropped, a note says so once per cell, and an error keeps only its (short) name and
message, once per cell.
Output metadata is dropped, and display-id updates are ignored (one small update could otherwise
rewrite every earlier output that shares its id). The outputs of each executed cell are appended to
/ctl/outputs.jsonl as one JSON line: no rewrite of the whole notebook after every cell.
"""

import json
import os

NOTE = "\n[the grader truncated this cell's output after {cap} characters]\n"
NOTEBOOK_NOTE = ("\n[the grader dropped this cell's output: the notebook's outputs passed {cap} characters "
                 "in total]\n")
MAX_CELL_OUTPUT_CHARS = 200_000           # every kind of output of one cell, as written
MAX_NOTEBOOK_OUTPUT_CHARS = 20 * 2**20     # all cells together
OUTPUT_DEPTH = 4                           # an output's nesting in the notebook: cells, cell, outputs, output
OUTPUT_KINDS = ("stream", "display_data", "execute_result", "error", "update_display_data")


def written_size(obj, limit, depth=OUTPUT_DEPTH):
    """An upper bound of the bytes `obj` takes in a notebook file as nbformat writes it (indent 1, one line
    per list item, dict entry and line of text, non-ASCII escaped at worst), nested `depth` levels deep;
    stops counting past `limit`. Every key, string and number counts, so deep nesting counts its
    indentation and a string of blank lines counts a line each."""
    total, stack = 0, [(obj, depth)]
    while stack and total <= limit:
        item, level = stack.pop()
        if isinstance(item, str):
            if len(item) > limit - total:  # past the limit already: no need to escape it
                total += len(item) + 2
                continue
            lines = item.count("\n") + 1
            total += len(json.dumps(item)) + lines * (level + 5) + 4
        elif isinstance(item, dict):
            total += 2 + level
            for key, value in item.items():
                total += len(json.dumps(str(key))) + level + 4
                stack.append((value, level + 1))
        elif isinstance(item, (list, tuple)):
            total += 2 + level + len(item) * (level + 3)
            stack.extend((x, level + 1) for x in item)
        elif isinstance(item, int) and not isinstance(item, bool):
            total += item.bit_length() // 3 + 2   # its decimal digits, at most
        else:
            total += 24                           # a float, a boolean, null
    return total


def _kept_content(kind, content):
    """The parts of a message that become the output: no metadata, no transient display ids."""
    if kind == "stream":
        return {"name": content.get("name", "stdout"), "text": content.get("text", "")}
    if kind == "error":
        return {"ename": content.get("ename", "Error"), "evalue": content.get("evalue", ""),
                "traceback": content.get("traceback", [])}
    kept = {"data": content.get("data", {}), "metadata": {}}
    if kind == "execute_result":
        kept["execution_count"] = content.get("execution_count")
    return kept


class OutputCaps:
    """The caps of one notebook run; `admit` returns the message to keep (possibly shortened) or None."""

    def __init__(self, cell_cap, notebook_cap, status):
        self.cell_cap, self.notebook_cap, self.status = int(cell_cap), int(notebook_cap), status
        self.cell_chars, self.total_chars = {}, 0
        self.noted, self.errors_kept = set(), set()

    def admit(self, msg, cell_index, outs, new_output):
        kind = msg["msg_type"]
        if kind not in OUTPUT_KINDS:
            return msg
        content = msg.get("content") if isinstance(msg.get("content"), dict) else {}
        used = self.cell_chars.get(cell_index, 0)
        room = min(self.cell_cap - used, self.notebook_cap - self.total_chars)
        size = written_size(content, room)  # the whole message, as it would be written in the notebook
        msg = dict(msg, content=_kept_content(kind, content))
        over_cell = used + size > self.cell_cap
        over_notebook = self.total_chars + size > self.notebook_cap
        if not over_cell and not over_notebook:
            self.cell_chars[cell_index] = used + size
            self.total_chars += size
            return msg
        self._note(cell_index, outs, new_output, over_notebook)
        if kind == "error" and cell_index not in self.errors_kept:  # keep that the cell failed, not its text
            self.errors_kept.add(cell_index)
            content = msg["content"]
            return dict(msg, content={"ename": str(content.get("ename", "Error"))[:200],
                                      "evalue": str(content.get("evalue", ""))[:2000], "traceback": []})
        return None

    def _note(self, cell_index, outs, new_output, over_notebook):
        if cell_index in self.noted:
            return
        self.noted.add(cell_index)
        if over_notebook:
            if self.status.get("output_cut_at") is None:
                self.status["output_cut_at"] = cell_index
            text = NOTEBOOK_NOTE.format(cap=self.notebook_cap)
        else:
            text = NOTE.format(cap=self.cell_cap)
        if cell_index not in self.status["truncated_cells"]:
            self.status["truncated_cells"].append(cell_index)
        outs.append(new_output("stream", name="stdout", text=text))


class OutputLog:
    """/ctl/outputs.jsonl: a header line {"cells": n}, then {"cell": i, "outputs": [...]} per executed
    cell."""

    def __init__(self, path, n_cells):
        self.path = path
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(json.dumps({"cells": n_cells}) + "\n")

    def append(self, index, cell):
        line = json.dumps({"cell": index, "outputs": cell.get("outputs", []),
                           "execution_count": cell.get("execution_count")}, ensure_ascii=False)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def read_outputs(path, n_cells, max_bytes):
    """{cell index: outputs} from an outputs.jsonl (the grader's side); None when it is missing or does not
    match a notebook of `n_cells` cells (None: any). A line cut short by a crash is ignored."""
    try:
        if os.path.getsize(path) > max_bytes:
            return None
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    try:
        if n_cells is not None and json.loads(lines[0]).get("cells") != n_cells:
            return None
    except (ValueError, IndexError, AttributeError):
        return None
    out = {}
    for line in lines[1:]:
        try:
            item = json.loads(line)
            if isinstance(item.get("cell"), int) and isinstance(item.get("outputs"), list):
                out[item["cell"]] = item["outputs"]
        except (ValueError, AttributeError):
            continue
    return out
