"""A model's tokenizer and chat template (no transformers needed).

The tokenizer files are rebuilt once from the GGUF's metadata (``longctx.model.gguf.build_tokenizer_files``)
into the model cache (``longctx.model.weights``); loading the cached JSON takes a fraction of a second.

SmolLM2's chat template is ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, a default
system message first when there is none, then ``<|im_start|>assistant\\n`` to ask for the answer; it is
written out here (equal to the GGUF's jinja template, tested). Gemma 3 270M is a base model: its file has no
chat template, so chatting with it is refused (``NoChatTemplate``); its prompts start with BOS
(``prompt_ids``), as SentencePiece models expect.
"""

from __future__ import annotations

import json
from pathlib import Path

from longctx.model.weights import fetch_model

DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def render_chat(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """SmolLM2's chat template (ChatML), hand-written; equals the GGUF's jinja template (tested)."""
    parts = []
    if messages and messages[0]["role"] != "system":
        parts.append(f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n")
    for m in messages:
        parts.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


class NoChatTemplate(ValueError):
    """The model's file has no chat template (a base model): chat is refused, completions work."""


class ChatTokenizer:
    """Encode / decode text and chats. ``eos_token_id`` ends a turn (SmolLM2: ``<|im_end|>``; Gemma 3:
    ``<eos>``). ``model_name`` says whose tokenizer it is (in error messages)."""

    def __init__(self, directory: Path, model_name: str = "smollm2-135m") -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
        info = json.loads((directory / "tokenizer_meta.json").read_text())
        self.model_name = model_name
        self.bos_token_id: int = info["bos_token_id"]
        self.eos_token_id: int = info["eos_token_id"]
        self.add_bos_token: bool = bool(info.get("add_bos_token", False))
        self.chat_template: str = info["chat_template"]
        self.special_tokens: list[str] = info["special_tokens"]

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special tokens written in the text are recognised; no BOS is added).
        ``encode_batch`` releases the GIL while it runs (``encode`` holds it): a long text tokenized in one
        thread never stops the others (the server's event loop and engine)."""
        return self._tok.encode_batch([text], add_special_tokens=False)[0].ids

    def prompt_ids(self, text: str) -> list[int]:
        """Token ids of a whole prompt: ``encode(text)`` after BOS when the model expects one (Gemma 3:
        always, as transformers' tokenizer and llama.cpp do, even before a ``<bos>`` the text spells;
        SmolLM2: no BOS)."""
        ids = self.encode(text)
        return [self.bos_token_id, *ids] if self.add_bos_token else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict] | str, add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages`` (a string is one user message)."""
        if not self.chat_template:
            raise NoChatTemplate(f"model {self.model_name!r} has no chat template (a base model): use "
                                 "completions (a raw prompt), not chat")
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if "<|im_start|>" in self.chat_template:
            return render_chat(messages, add_generation_prompt)
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # another file's own template

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self._tok.id_to_token(self.bos_token_id) or "",
            eos_token=self._tok.id_to_token(self.eos_token_id) or "")

    def encode_chat(self, messages: list[dict] | str, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the chat prompt (what ``generate`` feeds the model unless ``--raw``)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt))


def load_tokenizer(model: str | None = None) -> ChatTokenizer:
    """``model``'s tokenizer (default SmolLM2's) from the cache (building the cache first if needed)."""
    from longctx.model.registry import resolve_model

    source = resolve_model(model)
    return ChatTokenizer(fetch_model(model=source), source.name)
