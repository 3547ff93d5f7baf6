"""The release scripts (scripts/release/*.py) as modules, and a throw-away git repository to run them on."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "release"


def load(name: str) -> ModuleType:
    """scripts/release/<name>.py; the scripts import each other by bare name, as when run directly."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    module = importlib.import_module(name)
    assert Path(str(module.__file__)).parent == SCRIPTS, f"{name} resolved to {module.__file__}"
    return module


def git(repo: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(repo),
        "PATH": "/usr/bin:/bin:/usr/local/bin",
    }
    res = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True)
    return res.stdout.strip()


def new_repo(path: Path, version: str = "0.4.0") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    (path / "pyproject.toml").write_text(f'[project]\nname = "x"\nversion = "{version}"\n')
    commit(path, "start")
    return path


def commit(repo: Path, message: str) -> str:
    with (repo / "log.txt").open("a") as f:
        f.write(message + "\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")
