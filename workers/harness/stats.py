"""The one percentile of the harness, the CLI's meters and the scripts.

Nearest rank: the smallest sample with at least ``q`` percent of the
samples at or below it (``ceil(q / 100 * n)``-th of the sorted values), so
every reported figure is a value that was measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 100]); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])
