"""Constrained decoding in the embedded engine: a request's `Constraint` compiled by xgrammar, one matcher per row.

Each decode step, the rows under a constraint have every token their grammar does not allow next set to -inf in
their logits before sampling (`mask`), so the token is drawn from the model's distribution restricted to the
allowed tokens and renormalised, and its recorded log-prob is under that constrained distribution (the
sampler's `log_softmax` of the masked logits); the sampled token then advances the row's matcher (`advance`).
Once the grammar is complete only the end-of-sequence tokens are allowed, so a constrained reply ends as a
complete value (or at its token cap). JSON is compact (no whitespace, `,` and `:` alone), as vLLM writes it with
drmas' settings, so both engines decode one grammar. Compiled grammars are cached per constraint (programs send
the same schema over and over); a constraint that does not compile is refused when the request is submitted.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Iterable

import torch

from drmas.core.constraints import Constraint

CACHED_GRAMMARS = 256


class Grammars:
    """The compiled grammars of one engine (its tokenizer and vocabulary), and the matchers of its rows."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Iterable[int]) -> None:
        self._tokenizer, self._vocab_size, self._stop_ids = tokenizer, vocab_size, sorted(stop_ids)
        self._compiler: Any = None
        self._compiled: OrderedDict[Constraint, Any] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, constraint: Constraint) -> Any:
        """The constraint's compiled grammar (ValueError: it does not compile, and why)."""
        with self._lock:
            if constraint in self._compiled:
                self._compiled.move_to_end(constraint)
                return self._compiled[constraint]
            compiler = self._compiler or self._new_compiler()
            try:
                if constraint.kind == "json_schema":  # compact JSON, as vLLM's (drmas.engines.vllm_engine)
                    grammar = compiler.compile_json_schema(constraint.spec, any_whitespace=False, separators=(",", ":"))
                else:
                    grammar = compiler.compile_structural_tag(constraint.spec)
            except Exception as exc:  # xgrammar raises RuntimeError / InvalidJSONError / its own kinds
                raise ValueError(f"the {constraint.kind.replace('_', ' ')} constraint does not compile: "
                                 f"{type(exc).__name__}: {exc}") from None
            self._compiled[constraint] = grammar
            while len(self._compiled) > CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
            return grammar

    def matcher(self, constraint: Constraint) -> Any:
        import xgrammar

        return xgrammar.GrammarMatcher(self.compile(constraint))

    def mask(self, logits: torch.Tensor, rows: list[tuple[int, Any]]) -> None:
        """Set the logits of tokens each (row index, matcher) may not sample next to -inf, in place."""
        import xgrammar

        bitmask = xgrammar.allocate_token_bitmask(logits.shape[0], self._vocab_size)  # rows not listed: untouched
        for i, matcher in rows:
            matcher.fill_next_token_bitmask(bitmask, i)
        xgrammar.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True),
                                             indices=[i for i, _ in rows])

    @staticmethod
    def advance(matcher: Any, token: int) -> bool:
        """Feed the sampled token to the row's matcher; True when the grammar is done (only EOS could follow)."""
        matcher.accept_token(token)
        return matcher.is_terminated()

    def _new_compiler(self) -> Any:
        import xgrammar

        info = xgrammar.TokenizerInfo.from_huggingface(self._tokenizer, vocab_size=self._vocab_size,
                                                       stop_token_ids=self._stop_ids or None)
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        return self._compiler
