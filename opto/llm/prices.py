"""Prices of well-known models, from genai-prices (a maintained price table).

`Model` uses them when its `prices=` has no entry for its name, so `cost_usd` and
`Budget(max_cost_usd=...)` work for, e.g., "gpt-4o-mini" without configuration. The
table ships in the package: no network is needed.
"""

from __future__ import annotations

import functools

from .usage import Price

__all__ = ["known_price"]

_MILLION = 1_000_000


@functools.lru_cache(maxsize=256)
def known_price(model: str) -> Price | None:
    """USD per million input and output tokens for `model`, or None when the table has no such model.

    A LiteLLM-style "provider/model" name is looked up as that provider's model.
    """
    try:
        from genai_prices import Usage, calc_price
    except ImportError:  # pragma: no cover - a dependency, but a price table is never worth a crash
        return None
    provider, _, name = model.rpartition("/")
    for ref, provider_id in ((model, None), (name, provider or None)):
        try:
            input_price = calc_price(
                Usage(input_tokens=_MILLION, output_tokens=0), model_ref=ref, provider_id=provider_id
            ).total_price
            output_price = calc_price(
                Usage(input_tokens=0, output_tokens=_MILLION), model_ref=ref, provider_id=provider_id
            ).total_price
        except (LookupError, ValueError):
            continue
        return Price(input=float(input_price), output=float(output_price))
    return None
