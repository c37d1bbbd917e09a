"""An OpenAI-compatible HTTP server over the engine (``python -m longctx serve``).

- ``protocol``: request validation, OpenAI error / response / chunk bodies (no torch).
- ``detok``: incremental detokenization with stop strings.
- ``async_engine``: ``AsyncEngine``, one engine loop in a thread feeding per-request asyncio queues.
- ``sampling``: ``SamplingExecutor``, temperature / top-p sampling with a seeded generator per request (torch).
- ``app``: ``create_app(async_engine, tokenizer)``, the FastAPI routes.
- ``launch``: ``build_app``, ``run_server``, ``ServerProcess`` (the server in a child process).

Nothing heavy is imported here: ``from longctx.serve.launch import ServerProcess`` needs no torch.
"""
