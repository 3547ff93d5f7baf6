"""draguard: GPU admission policies, DRA linting and an NVML-backed DRA driver for Kubernetes.

The distribution's one import name. The build maps the repository's top-level `webhook/`, `driver/` and
`policies/` (the default policies, as data) to `draguard.webhook`, `draguard.driver` and
`draguard.policies` (setup.py).
"""

from pathlib import Path

__version__ = "0.1.0"

# In a checkout those directories sit beside this one, not inside it: search there too, so that
# `python -m draguard` and `import draguard.webhook` name the same code in the repository as installed.
_here = Path(__file__).resolve().parent
if not (_here / "webhook").is_dir() and (_here.parent / "webhook" / "__init__.py").is_file():
    __path__.append(str(_here.parent))
