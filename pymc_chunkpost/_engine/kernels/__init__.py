"""The mathematics of a chunk: the strategies, `chunked_vmap` and the jaxpr evaluation."""
