"""Below everything: caches, version workarounds, the planner's configuration, the cache
folder, memory readings, messages and the progress bar."""
