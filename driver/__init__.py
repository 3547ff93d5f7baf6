"""draguard's NVML-backed DRA driver (kubelet plugin + ResourceSlice publisher)."""

__version__ = "0.1.0"
