"""draguard: GPU admission policies and DRA guard rails for Kubernetes."""

__version__ = "0.1.0"

#: the import prefix of draguard's packages: "" in the repository (top-level `webhook`, `driver`),
#: "draguard." when installed (`draguard.webhook`, `draguard.driver`); names spelled at run time use it
PREFIX = __name__.removesuffix("webhook")
