"""The statistics: PSIS, and LOO computed in blocks of observations."""
