"""An OpenAI-compatible HTTP server over the engine (``python -m longctx serve``), as vLLM's (v0.11) answers.

- ``protocol``: request models (pydantic) and OpenAI's error shape (no torch).
- ``validation``: reading a body (413 past 32 MiB, 400 for JSON nested too deeply) and the one handler that
  turns a failed validation into OpenAI's 400 naming the field.
- ``responses``: response, chunk and usage bodies; log-probabilities in both endpoints' formats.
- ``detok``: incremental detokenization with stop strings (none before ``min_tokens``).
- ``async_engine``: ``AsyncEngine``, one engine loop in a thread feeding per-request asyncio queues (tokens,
  their log-probabilities, latencies for the histograms).
- ``choices``: ``ChoiceRun``, one sequence of a request: events -> text, finish reason, log-probabilities.
- ``generation``: ``Generation``, a validated request -> its sequences (prompts x ``n``) -> an SSE stream or
  one JSON body.
- ``prometheus``: ``GET /metrics`` in Prometheus' text format, vLLM's metric names and latency histograms.
- ``tokenizer_routes``: ``/tokenize``, ``/detokenize``, ``/tokenizer_info``, ``/version``.
- ``app``: ``create_app(async_engine, tokenizer)``, the FastAPI routes.
- ``launch``: ``build_app``, ``run_server``, ``ServerProcess`` (the server in a child process).

Sampling is not here: each request's ``SamplingParams`` ride on its engine sequence and the executor draws its
tokens and records their log-probabilities (``longctx.engine.sampling_params``, ``longctx.engine.sampler``,
``longctx.engine.logprobs``).

Nothing heavy is imported here: ``from longctx.serve.launch import ServerProcess`` needs no torch.
"""
