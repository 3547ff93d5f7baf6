"""draguard: GPU admission policies and DRA guard rails for Kubernetes."""

__version__ = "0.1.0"
