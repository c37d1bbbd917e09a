"""An OpenAI-compatible HTTP server over the engine (``python -m longctx serve``).

- ``protocol``: request models (pydantic), OpenAI error / response / chunk bodies (no torch).
- ``validation``: the one handler that turns a failed validation into OpenAI's 400.
- ``detok``: incremental detokenization with stop strings.
- ``async_engine``: ``AsyncEngine``, one engine loop in a thread feeding per-request asyncio queues.
- ``generation``: ``Generation``, a validated request -> tokens -> an SSE stream or one JSON body.
- ``metrics``: ``GET /metrics`` in Prometheus' text format, vLLM's metric names (``prometheus_client``).
- ``app``: ``create_app(async_engine, tokenizer)``, the FastAPI routes.
- ``launch``: ``build_app``, ``run_server``, ``ServerProcess`` (the server in a child process).

Sampling (temperature, top-p, seed) is not here: each request's ``SamplingParams`` ride on its engine
sequence and the executor samples (``longctx.engine.sampling_params``, ``longctx.engine.sampler``).

Nothing heavy is imported here: ``from longctx.serve.launch import ServerProcess`` needs no torch.
"""
