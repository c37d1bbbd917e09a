"""Lesson support: what the lessons' cells and test cells use that the serving core does not need.

- ``stall``: the decode-stall scenario, the source's Exercise 1 (``StallScenario``: 16 decodes and a 12K-token
  prompt), defined once: on the napkin (lesson 01), on any engine (``exercise1`` / ``exercise1_compare`` in
  the simulator, lessons 01-02); ``stall_server.run_stall`` sends it to a server (lesson 08).
- ``policy_state``: a scheduling policy's view of one step as plain data, and ``decide`` on it (lesson 02's
  scheduler exercise; the grader's kernel side calls it).
- ``policy_checks``: ``check_stall_free`` and the toy workloads that grade that exercise.
- ``allocation``: contiguous versus paged KV allocation over a mixed backlog (lesson 03).
- ``gpu_cells``: the lessons' GPU figures, titled with their source (recorded, live or a prediction).

The dependency runs one way: lesson support imports the core (``engine``, ``sim``, ``kv``, ``memory``, ...),
and nothing in the core imports lesson support (``tests/test_lesson_support_contract.py``); only the
front ends (the command line) may. Importing this
package imports none of its modules.
"""
