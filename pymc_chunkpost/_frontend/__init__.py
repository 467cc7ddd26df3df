"""The seam every route shares: our options apart from the library's, the fallback to the
library's own function, and the engine's evaluation."""
