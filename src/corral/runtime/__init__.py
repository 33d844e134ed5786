"""The composition root: concrete store and workers wired to the core and the scheduler."""
