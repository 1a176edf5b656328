"""Grammar-constrained sampling for llama.cpp that checks the grammar only when it must.

llama-cpp-python applies a JSON grammar to every token of the vocabulary at every step
(49,152 tokens for SmolLM2), which made a JSON reply 1.6 times slower than free text on
one core. llama.cpp's own sampler does it the other way round: sample as if there were
no grammar, check the one token drawn, and only when the grammar refuses it apply the
grammar to the whole vocabulary and draw again. Greedy decoding picks the same tokens
either way; sampled replies follow the grammar just as strictly.

`lazy_grammar_llama(llama_module)` is a subclass of llama-cpp-python's `Llama` that
samples this way. It relies on two of that class's internals (`_init_sampler`, and the
`sample(ctx, idx)` call of its sampler), so it falls back to the stock sampler when they
are not there.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
from typing import Any

from .errors import LLMError

__all__ = ["lazy_grammar_llama"]

logger = logging.getLogger(__name__)


class LazyGrammarSampler:
    """A sampler chain without the grammar, and the grammar beside it (see the module)."""

    def __init__(self, bindings: Any, chain: Any, grammar: Any, n_vocab: int) -> None:
        import numpy as np

        self._bindings = bindings
        self._chain = chain  # llama-cpp-python's LlamaSampler, which frees itself
        self._grammar = grammar  # a llama_sampler pointer, freed in close()
        self._n_vocab = n_vocab
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self._data = (bindings.llama_token_data * n_vocab)()
        self._view = np.ctypeslib.as_array(self._data)
        self._as_array = np.ctypeslib.as_array  # numpy once, not at every token

    def sample(self, ctx: Any, idx: int = -1) -> int:
        b = self._bindings
        token = self._draw(ctx, idx, grammar_first=False)
        if not self._allows(token):
            token = self._draw(ctx, idx, grammar_first=True)
        b.llama_sampler_accept(self._grammar, token)
        b.llama_sampler_accept(self._chain.sampler, token)
        return token

    def _draw(self, ctx: Any, idx: int, *, grammar_first: bool) -> int:
        b = self._bindings
        logits = self._as_array(b.llama_get_logits_ith(ctx.ctx, idx), shape=(self._n_vocab,))
        self._view["id"] = self._ids
        self._view["logit"] = logits
        self._view["p"] = 0.0
        candidates = b.llama_token_data_array(
            data=ctypes.cast(self._data, b.llama_token_data_p), size=self._n_vocab, selected=-1, sorted=False
        )
        if grammar_first:
            b.llama_sampler_apply(self._grammar, ctypes.byref(candidates))
        b.llama_sampler_apply(self._chain.sampler, ctypes.byref(candidates))
        if not 0 <= candidates.selected < candidates.size:
            raise LLMError(f"llama.cpp's sampler selected no token (index {candidates.selected})")
        return int(self._data[candidates.selected].id)

    def _allows(self, token: int) -> bool:
        b = self._bindings
        one = b.llama_token_data(id=token, logit=1.0, p=0.0)
        candidates = b.llama_token_data_array(data=ctypes.pointer(one), size=1, selected=-1, sorted=False)
        b.llama_sampler_apply(self._grammar, ctypes.byref(candidates))
        return math.isfinite(one.logit)

    def close(self) -> None:
        if self._grammar is not None:
            self._bindings.llama_sampler_free(self._grammar)
            self._grammar = None
        close = getattr(self._chain, "close", None)
        if close is not None:
            close()

    def __del__(self) -> None:
        self.close()


@functools.cache  # one subclass per llama-cpp-python, however many models load
def lazy_grammar_llama(llama_module: Any) -> type:
    """`llama_module.Llama` (llama-cpp-python's), sampling grammar-constrained replies lazily."""
    bindings = llama_module.llama_cpp
    base = llama_module.Llama

    class LazyGrammarLlama(base):  # type: ignore[misc, valid-type]
        def _init_sampler(self, *args: Any, grammar: Any = None, **kwargs: Any) -> Any:
            if grammar is None or kwargs.get("logits_processor") is not None:
                return super()._init_sampler(*args, grammar=grammar, **kwargs)
            chain = super()._init_sampler(*args, grammar=None, **kwargs)
            try:
                pointer = bindings.llama_sampler_init_grammar(
                    self._model.vocab, grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8")
                )
            except AttributeError:  # another llama-cpp-python: its own sampler, grammar first
                logger.debug("llama-cpp-python without the expected sampler internals: grammar applied eagerly")
                return super()._init_sampler(*args, grammar=grammar, **kwargs)
            if not pointer:
                raise LLMError("llama.cpp could not parse the grammar of the reply's response_format")
            return LazyGrammarSampler(bindings, chain, pointer, self._n_vocab)

    LazyGrammarLlama.__name__ = LazyGrammarLlama.__qualname__ = "LazyGrammarLlama"
    return LazyGrammarLlama
