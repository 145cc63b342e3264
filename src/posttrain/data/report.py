"""The validation report of one dataset: rows read/kept, drops by reason, truncations, token-length stats."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from dataclasses import field as dc_field


@dataclass
class DataReport:
    """What loading one dataset did. Invariant: ``rows_read == rows_kept + sum(dropped.values())``.

    ``rows_read``: rows considered (after the ``max_rows`` sample; ``rows_in_source`` is the source total).
    ``token_stats`` (tokens, measured before over-length handling, on rows that passed parsing): min, median,
    p95, max, n_over_context. ``context_len``: the model's ``max_seq_len`` in tokens. ``sha256``: of the source
    file(s), or of the HF id + subset + split.
    """

    name: str
    source: str
    rows_read: int
    rows_kept: int
    dropped: dict[str, int] = dc_field(default_factory=dict)
    truncated: int = 0
    token_stats: dict[str, float] = dc_field(default_factory=dict)
    context_len: int = 0
    sha256: str = ""
    rows_in_source: int = 0
    field: str = ""          # the recipe field, e.g. "data.sft[0]"

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        """Flat float metrics, keys ``<prefix>rows_read``, ``<prefix>dropped_<reason>``, ``<prefix>tokens_p95``...
        A prefix not ending in ``/``, ``.`` or ``_`` gets a ``.`` appended."""
        if prefix and not prefix.endswith(("/", ".", "_")):
            prefix += "."
        out = {"rows_in_source": self.rows_in_source, "rows_read": self.rows_read, "rows_kept": self.rows_kept,
               "rows_dropped": sum(self.dropped.values()), "truncated": self.truncated,
               "context_len": self.context_len}
        out.update({f"dropped_{k}": v for k, v in self.dropped.items()})
        out.update({f"tokens_{k}": v for k, v in self.token_stats.items()})
        return {prefix + k: float(v) for k, v in out.items()}

    def to_dict(self) -> dict:
        return asdict(self)

    def render(self) -> str:
        """A small fixed-width table for logs and the run summary."""
        rows = [("dataset", f"{self.name} ({self.field})" if self.field else self.name),
                ("source", self.source), ("sha256", self.sha256[:16]),
                ("rows read / kept", f"{self.rows_read} / {self.rows_kept}"
                 + (f" (source has {self.rows_in_source})" if self.rows_in_source != self.rows_read else ""))]
        rows += [(f"dropped: {k}", str(v)) for k, v in sorted(self.dropped.items())]
        rows.append(("truncated", str(self.truncated)))
        if self.token_stats:
            s = self.token_stats
            rows.append(("tokens min/med/p95/max", f"{s['min']:.0f} / {s['median']:.0f} / {s['p95']:.0f} / "
                                                   f"{s['max']:.0f}"))
            rows.append((f"over context ({self.context_len})", f"{s['n_over_context']:.0f}"))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def token_stats(lengths: list[int], context_len: int) -> dict[str, float]:
    """min, median, p95 (nearest rank), max and the count over ``context_len`` of token lengths."""
    if not lengths:
        return {"min": 0.0, "median": 0.0, "p95": 0.0, "max": 0.0, "n_over_context": 0.0}
    s = sorted(lengths)
    n = len(s)
    median = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    p95 = s[min(n - 1, max(0, -(-95 * n // 100) - 1))]
    return {"min": float(s[0]), "median": float(median), "p95": float(p95), "max": float(s[-1]),
            "n_over_context": float(sum(1 for x in s if x > context_len))}
