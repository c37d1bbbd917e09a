"""An OpenAI-compatible HTTP server over the engine (``python -m longctx serve``), as vLLM's (v0.11) answers.

- ``protocol``: request models (pydantic) and OpenAI's error shape (no torch).
- ``validation``: reading a body (413 past the cap, 400 for JSON nested too deeply) and the one handler that
  turns a failed validation into OpenAI's 400 naming the field.
- ``limits``: what the context alone proves: a lower bound on a text's tokens (a text provably too long is
  refused untokenized) and the body cap.
- ``chat``: a chat's prompt text (the model's template, or a Jinja one; ``chat_template_kwargs``,
  ``continue_final_message``).
- ``responses``: response, chunk and usage bodies; log-probabilities in both endpoints' formats.
- ``detok``: incremental detokenization with stop strings (none before ``min_tokens``), at a constant cost
  per token.
- ``async_engine``: ``AsyncEngine``, one engine loop in a thread feeding per-request asyncio queues (tokens,
  their log-probabilities, latencies for the histograms).
- ``choices``: ``ChoiceRun``, one sequence of a request: events -> text, finish reason, log-probabilities.
- ``generation``: ``Generation``, a validated request -> its sequences (prompts x ``n``) -> an SSE stream or
  one JSON body.
- ``prometheus``: ``GET /metrics`` in Prometheus' text format under vLLM's names (``vllm:``).
- ``tokenizer_routes``: ``/tokenize``, ``/detokenize``, ``/tokenizer_info``, ``/version``.
- ``app``: ``create_app(async_engine, tokenizer)``, the FastAPI routes (and the API key's middleware).
- ``launch``: ``build_app`` (the model loaded by ``_load_model_and_tokenizer``, the one place that loads it),
  ``run_server``, ``ServerProcess`` (the server in a child process).

Sampling is not here: each request's ``SamplingParams`` ride on its engine sequence and the executor draws its
tokens and records their log-probabilities (``longctx.engine.sampling_params``, ``longctx.engine.sampler``,
``longctx.engine.logprobs``).

Nothing heavy is imported here: ``from longctx.serve.launch import ServerProcess`` needs no torch.
"""
