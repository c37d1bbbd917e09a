"""A chat request's prompt text: the model's chat template, or a Jinja template given to the server
(``--chat-template``) or in the request (``chat_template``), with ``chat_template_kwargs`` and
``continue_final_message`` as vLLM (v0.11) applies them.

Without a template of its own and without ``chat_template_kwargs``, a chat is rendered by the tokenizer's
hand-written template (``apply_chat_template``: SmolLM2's ChatML, equal to the GGUF's Jinja text). Otherwise
the Jinja text (the given one, or the tokenizer's ``chat_template``) is rendered in Jinja's sandbox with the
variables transformers gives a template: ``messages``, ``add_generation_prompt``, ``bos_token``,
``eos_token``, plus every ``chat_template_kwargs`` entry (a template reads the ones it knows; SmolLM2's reads
none). ``continue_final_message``: rendered without a generation prompt and cut just after the last
message's content, so the model continues that message (transformers' rule).
"""

from __future__ import annotations

from pathlib import Path

from longctx.serve.protocol import APIError

TEMPLATE_FIELD = "chat_template"


def _template_text(template: str) -> str:
    """``--chat-template``: a file's path (as vLLM reads it) or the template itself."""
    path = Path(template)
    try:
        if len(template) < 4096 and "{" not in template and path.is_file():
            return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"--chat-template: cannot read {template!r}: {exc}") from None
    if "{" not in template:
        raise ValueError(f"--chat-template {template!r} is neither a readable file nor a Jinja template")
    return template


def _compile(text: str, field: str):
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    try:
        return env.from_string(text)
    except TemplateError as exc:
        raise APIError(400, f"'{field}' is not a valid Jinja template: {exc}", field,
                       "invalid_value") from None


class ChatRenderer:
    """Renders conversations for one tokenizer; ``template``: the server's own Jinja template (text or
    path), or None for the tokenizer's; ``trust_request_template``: accept a request's ``chat_template``
    (vLLM's ``--trust-request-chat-template``: off by default, since a template is code the server runs)."""

    def __init__(self, tokenizer, template: str | None = None, trust_request_template: bool = False) -> None:
        self.tokenizer = tokenizer
        self.trust_request_template = bool(trust_request_template)
        self.server_template = None
        if template is not None:
            try:
                self.server_template = _compile(_template_text(template), "--chat-template")
            except APIError as exc:
                raise ValueError(exc.message) from None
        self._model_template = None  # the tokenizer's Jinja text, compiled when first needed

    def _jinja(self, request_template: str | None):
        if request_template is not None:
            if not self.trust_request_template:
                raise APIError(400, "'chat_template' in a request is refused: this server was not started "
                               "with --trust-request-chat-template (as vLLM refuses it)", TEMPLATE_FIELD,
                               "invalid_value")
            return _compile(request_template, TEMPLATE_FIELD)
        if self.server_template is not None:
            return self.server_template
        if self._model_template is None:
            self._model_template = _compile(self.tokenizer.chat_template, TEMPLATE_FIELD)
        return self._model_template

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               continue_final_message: bool = False, request_template: str | None = None,
               kwargs: dict | None = None) -> str:
        """The prompt text of ``messages`` (``{"role", "content", ...}`` dicts)."""
        add = add_generation_prompt and not continue_final_message
        if request_template is None and self.server_template is None and not self.tokenizer.chat_template:
            raise APIError(400, f"this model ({self.tokenizer.model_name}) has no chat template (a base "
                           "model): use /v1/completions, or start the server with --chat-template",
                           "messages", "invalid_value")
        if request_template is None and self.server_template is None and not kwargs:
            text = self.tokenizer.apply_chat_template(messages, add)
        else:
            tok = self.tokenizer
            variables = {**(kwargs or {}), "messages": messages, "add_generation_prompt": add,
                         "bos_token": tok.decode([tok.bos_token_id], skip_special_tokens=False),
                         "eos_token": tok.decode([tok.eos_token_id], skip_special_tokens=False)}
            try:
                text = self._jinja(request_template).render(**variables)
            except Exception as exc:  # a template's own error (jinja's, or one it raises): the client's
                raise APIError(400, f"the chat template failed on this conversation: {type(exc).__name__}: "
                               f"{str(exc)[:200]}", TEMPLATE_FIELD, "invalid_value") from None
        if continue_final_message:
            text = _cut_after_final_message(text, messages[-1]["content"])
        return text


def _cut_after_final_message(text: str, final: str) -> str:
    """``text`` up to the end of the last message's content (transformers' ``continue_final_message``)."""
    for content in (final, final.strip()):
        at = text.rfind(content) if content else -1
        if at != -1:
            return text[: at + len(content)]
    raise APIError(400, "continue_final_message: the last message's content is not in the rendered prompt "
                   "(an empty message has nothing to continue)", "continue_final_message", "invalid_value")
