"""Corral: a control plane that keeps AI agents bounded."""

__version__ = "0.1.0"
