"""USD prices per million tokens, for streams that report tokens but no cost (Codex).

The table is configuration, not truth: vendors change prices, so a deployment passes its own
`PriceTable` (through `StreamOptions.prices`). The built-in entries are the two whose arithmetic
the recorded fixtures confirm exactly (Sonnet 4.5 at $3 / $15 gives Claude
Code's `total_cost_usd`; gpt-5 at $1.25 / $10 with cached input at $0.125 gives OpenCode's
`step_finish.part.cost`). A model the table does not name falls back to its vendor's default,
which is a price estimate only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

MTOK = 1_000_000

# "claude-sonnet-4-5-20250929" and "gpt-5-2025-08-07" are priced like their undated names.
_DATE_SUFFIX = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})$")
_VENDOR_PREFIXES: tuple[tuple[str, str], ...] = (
    ("claude", "anthropic"),
    ("gpt", "openai"),
    ("codex", "openai"),
    ("o1", "openai"),
    ("o3", "openai"),
    ("o4", "openai"),
    ("gemini", "google"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Price:
    """USD per million tokens. `cached_in_per_mtok` None: cached input costs as much as input."""

    in_per_mtok: float
    out_per_mtok: float
    cached_in_per_mtok: float | None = None

    def cost(self, tokens_in: int, tokens_out: int, cached_in: int = 0) -> float:
        """Cost of a call; `tokens_in` includes the `cached_in` tokens served from a cache."""
        cached = min(max(cached_in, 0), max(tokens_in, 0))
        cached_rate = self.cached_in_per_mtok
        if cached_rate is None:
            cached_rate = self.in_per_mtok
        # Sum in per-MTok units first and divide once: exact for the fixture figures.
        units = (
            (max(tokens_in, 0) - cached) * self.in_per_mtok
            + cached * cached_rate
            + max(tokens_out, 0) * self.out_per_mtok
        )
        return units / MTOK


SONNET_4_5 = Price(in_per_mtok=3.0, out_per_mtok=15.0, cached_in_per_mtok=0.30)
GPT_5 = Price(in_per_mtok=1.25, out_per_mtok=10.0, cached_in_per_mtok=0.125)


def vendor_of(model: str) -> str | None:
    """The vendor a model name belongs to: a `provider/` prefix wins, else the name's family."""
    if "/" in model:
        return model.split("/", 1)[0].lower() or None
    name = model.lower()
    for prefix, vendor in _VENDOR_PREFIXES:
        if name.startswith(prefix):
            return vendor
    return None


def _base_name(model: str) -> str:
    return _DATE_SUFFIX.sub("", model.rsplit("/", 1)[-1].lower())


@dataclass(frozen=True, slots=True, kw_only=True)
class PriceTable:
    """Prices by model name, plus one default per vendor for models the table does not name."""

    models: Mapping[str, Price] = field(default_factory=dict)
    vendor_defaults: Mapping[str, Price] = field(default_factory=dict)

    def lookup(self, model: str | None, *, vendor: str | None = None) -> Price | None:
        """The model's price, else its vendor's default (`vendor` when the name says nothing)."""
        if model:
            price = self.models.get(model) or self.models.get(_base_name(model))
            if price is not None:
                return price
            vendor = vendor_of(model) or vendor
        return self.vendor_defaults.get(vendor) if vendor else None

    def cost_of(
        self,
        model: str | None,
        tokens_in: int,
        tokens_out: int,
        *,
        cached_in: int = 0,
        vendor: str | None = None,
    ) -> float | None:
        """USD for the tokens, or None when neither the model nor the vendor has a price."""
        price = self.lookup(model, vendor=vendor)
        return None if price is None else price.cost(tokens_in, tokens_out, cached_in)


DEFAULT_PRICES = PriceTable(
    models={"claude-sonnet-4-5": SONNET_4_5, "gpt-5": GPT_5},
    vendor_defaults={"anthropic": SONNET_4_5, "openai": GPT_5},
)


def cost_of(
    model: str | None,
    tokens_in: int,
    tokens_out: int,
    *,
    cached_in: int = 0,
    vendor: str | None = None,
    table: PriceTable = DEFAULT_PRICES,
) -> float | None:
    """USD for `tokens_in`/`tokens_out` of `model` by `table`; None when it has no price."""
    return table.cost_of(model, tokens_in, tokens_out, cached_in=cached_in, vendor=vendor)
