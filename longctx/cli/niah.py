"""``python -m longctx niah``: needle in a haystack on SmolLM2 in our engine, lengths x depths x seeds.

    python -m longctx niah --lengths 512,1024 --depths 0,0.5,1 [--seeds N] [--haystack passkey|multikey]
                           [--rope-scaling JSON] [--press NAME --compression-ratio R [--question-agnostic]]
                           [--json]

Prints a table (accuracy and mean answer log-probability per length and depth) or, with ``--json``, one JSON
object per trial: ``length`` (real prompt tokens), ``depth``, ``seed``, ``correct``, ``answer_logprob``
(nats), ``output`` and more. ``--rope-scaling`` takes transformers' ``rope_scaling`` dict, e.g.
``'{"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": 8192}'``.
"""

from __future__ import annotations

import json


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated numbers, got {text!r}") from None


def register(subparsers) -> None:
    p = subparsers.add_parser("niah", help="needle-in-a-haystack grid (length x depth) on SmolLM2")
    p.add_argument(
        "--lengths", required=True, help="prompt lengths in tokens, comma-separated (e.g. 512,1024)"
    )
    p.add_argument("--depths", default="0,0.5,1", help="needle depths in [0, 1], comma-separated")
    p.add_argument("--seeds", type=int, default=1, help="trials per cell (seeds 0..N-1)")
    p.add_argument("--haystack", choices=["passkey", "multikey"], default="passkey")
    p.add_argument("--rope-scaling", default=None, help="a rope_scaling dict as JSON (default: plain RoPE)")
    p.add_argument(
        "--press", default=None, help="prune the KV cache: streaming_llm, snapkv, h2o, random, knorm"
    )
    p.add_argument("--compression-ratio", type=float, default=None, help="fraction evicted, in [0, 1)")
    p.add_argument("--question-agnostic", action="store_true",
                   help="prune the context before the question is prefilled (default: with the question)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--json", action="store_true", help="print one JSON object per trial")
    from longctx.cli.model import add_model_argument

    add_model_argument(p)
    from longctx.cli.model import add_placement_arguments

    add_placement_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from longctx.evals.niah import check_grid

    lengths = [int(x) for x in _floats(args.lengths)]
    if any(n != x for n, x in zip(lengths, _floats(args.lengths), strict=True)):
        raise ValueError(f"--lengths must be whole token counts, got {args.lengths!r}")
    if args.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
    lengths, depths, seeds = check_grid(lengths, _floats(args.depths), args.seeds)
    scaling = None
    if args.rope_scaling:
        try:
            scaling = json.loads(args.rope_scaling)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--rope-scaling is not valid JSON: {exc}") from None
        from longctx.model.rope import validate_scaling

        validate_scaling(scaling)
    if args.question_agnostic and args.press is None:   # checked before torch loads (the press needs it)
        raise ValueError("--question-agnostic needs --press NAME --compression-ratio R")
    from longctx.cli.model import make_cli_press

    press = make_cli_press(args.press, args.compression_ratio)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from longctx.cli.model import load_placed_model
    from longctx.evals.niah import NiahRunner, run_grid
    from longctx.model.tokenizer import load_tokenizer

    model, tok = load_placed_model(args), load_tokenizer(args.model)
    model.rope_scaling = scaling
    runner = NiahRunner(model, tok, max_tokens=max(lengths) + 64, press=press,
                        question_aware=not args.question_agnostic)
    table = run_grid(runner, lengths, depths, seeds, args.haystack, progress=not args.json)
    if args.json:
        for row in table.rows:
            print(json.dumps(row))
        return 0
    lengths_, depths_, acc = table.pivot("correct")
    _, _, lp = table.pivot("answer_logprob")
    print(
        f"{args.haystack} haystack, rope={table.rows[0]['rope']}, press={runner.press_label}, "
        f"{len(seeds)} seed(s): "
        "accuracy / mean answer log-prob (nats)"
    )
    print("length " + "".join(f"{f'depth {d:g}':>16}" for d in depths_))
    for i, n in enumerate(lengths_):
        print(f"{n:6d} " + "".join(f"{acc[i, j]:9.2f} /{lp[i, j]:6.2f}" for j in range(len(depths_))))
    return 0
