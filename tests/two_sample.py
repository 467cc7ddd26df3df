"""Two-sample tests of random draws, per element, and Holm's correction across them."""

from __future__ import annotations

import numpy as np
from scipy import stats


def holm_rejects(p_values, alpha):
    """The indices Holm's step-down procedure rejects at family-wise level `alpha`."""
    order = np.argsort(p_values)
    rejected = []
    for rank, index in enumerate(order):
        if p_values[index] > alpha / (len(p_values) - rank):
            break
        rejected.append(int(index))
    return rejected


def two_sample_p_values(ours: np.ndarray, theirs: np.ndarray) -> list[float]:
    """Per element: KS for continuous values, chi-square on the counts for integers."""
    ours, theirs = ours.reshape(len(ours), -1), theirs.reshape(len(theirs), -1)
    p_values = []
    for a, b in zip(ours.T, theirs.T):
        if np.issubdtype(a.dtype, np.integer):
            values = np.union1d(a, b)
            table = np.array([[np.sum(x == v) for v in values] for x in (a, b)])
            table = table[:, table.sum(axis=0) >= 10]  # cells too small for chi-square
            rest = [len(a) - table[0].sum(), len(b) - table[1].sum()]
            table = np.column_stack([table, rest]) if min(rest) > 0 else table
            p_values.append(stats.chi2_contingency(table).pvalue if table.shape[1] > 1 else 1.0)
        else:
            p_values.append(stats.ks_2samp(a, b).pvalue)
    return p_values
