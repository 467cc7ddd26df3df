"""One call, start to end: the options checked, the facts gathered, then plan and run."""
