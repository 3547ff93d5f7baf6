"""The package layout: one import name, `draguard`, over the repository's top-level directories.

pyproject.toml holds the metadata; this file only maps directories to packages, which pyproject's
static tables cannot do for a tree of subpackages without listing each one.
"""

from setuptools import find_packages, setup

# Repository directory -> installed package. policies/ holds data only (the default policy YAML).
MAPPED = {"webhook": "draguard.webhook", "driver": "draguard.driver"}

packages = ["draguard", "draguard.policies"]
for found in find_packages(include=[f"{top}*" for top in MAPPED]):
    top, _, rest = found.partition(".")
    packages.append(MAPPED[top] + (f".{rest}" if rest else ""))

setup(
    packages=packages,
    package_dir={
        "draguard": "draguard", "draguard.policies": "policies", **{pkg: d for d, pkg in MAPPED.items()}
    },
    package_data={
        "draguard": ["py.typed"],
        "draguard.policies": ["*.yaml"],
        "draguard.webhook.policy": ["*.json"],
        "draguard.webhook.review.schemas": ["*.json.gz"],
        "draguard.driver": ["sim/topologies/*.yaml", "proto/*.proto", "*.json"],
    },
)
