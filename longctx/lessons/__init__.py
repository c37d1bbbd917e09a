"""Lesson support: what the lessons' cells and test cells use that the serving core does not need.

- ``stall``: lesson 01's napkin model of decode starvation (``StallScenario``, fixed step times).
- ``exercise1``: the source's Exercise 1 (16 decodes and a 12K-token prompt) on any engine; ``exercise1``
  and ``exercise1_compare`` run it in the simulator (lessons 01 and 02; the GPU suite measures it).
- ``policy_state``: a scheduling policy's view of one step as plain data, and ``decide`` on it (lesson 02's
  scheduler exercise; the grader's kernel side calls it).
- ``policy_checks``: ``check_stall_free`` and the toy workloads that grade that exercise.
- ``allocation``: contiguous versus paged KV allocation over a mixed backlog (lesson 03).
- ``gpu_cells``: the lessons' GPU figures, titled with their source (recorded, live or a prediction).

The dependency runs one way: lesson support imports the core (``engine``, ``sim``, ``kv``, ``memory``, ...),
and nothing in the core imports lesson support (``tests/test_lesson_support_contract.py``); only the
front ends (the command line, the GPU suite that records lesson 01's scenario) may. Importing this
package imports none of its modules.
"""
