"""Worker adapters: the corral-shim supervisor and the code that spawns and probes it."""
