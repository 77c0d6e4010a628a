"""The least-squares pieces of the search's model (:mod:`experiments.advise_search`):
``y = r[row] + c[col]`` fitted by backfitting, and which rows and columns the
observations connect (the fit pins each connected part only up to a constant)."""

from __future__ import annotations

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

BACKFIT_SWEEPS = 200


def connected_parts(
    structures: np.ndarray, policies: np.ndarray, num_structures: int, num_policies: int
) -> np.ndarray:
    """Connected part of every policy (first ``num_policies``) and structure (the rest) in
    the graph whose edges are the runs (a policy and a structure run together)."""
    n = num_policies + num_structures
    edges = coo_matrix(
        (np.ones(len(policies)), (policies, num_policies + structures)), shape=(n, n)
    )
    return connected_components(edges, directed=False)[1]


def two_way_fit(
    y: np.ndarray, rows: np.ndarray, cols: np.ndarray, num_rows: int, num_cols: int
) -> tuple[np.ndarray, np.ndarray]:
    """Least squares of ``y = r[rows] + c[cols]`` by alternating means (backfitting): each
    sweep is exact for one side given the other, so it converges to a least-squares fit."""
    r, c = np.zeros(num_rows), np.zeros(num_cols)
    n_rows = np.maximum(np.bincount(rows, minlength=num_rows), 1)
    n_cols = np.maximum(np.bincount(cols, minlength=num_cols), 1)
    for _ in range(BACKFIT_SWEEPS):
        r = np.bincount(rows, y - c[cols], minlength=num_rows) / n_rows
        c_new = np.bincount(cols, y - r[rows], minlength=num_cols) / n_cols
        if np.abs(c_new - c).max() < 1e-9:
            return r, c_new
        c = c_new
    return r, c
