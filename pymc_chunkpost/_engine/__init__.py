"""The engine: any JAX per-draw function over every draw, within a memory budget.

Layers, top to bottom: `call` (the pipeline), `plan` (policy), `execute` (mechanism),
`kernels` (the mathematics of a chunk), `data` (what a call is)."""
