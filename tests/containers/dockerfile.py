"""A Dockerfile's build steps, replayed here without Docker: COPY copies from the build context into
a scratch directory that stands for the image's filesystem, and RUN runs its command with ``/bin/sh
-c`` in a scratch virtual environment whose Python sees this project's .venv (as the base image's
Python has Airflow), with container paths under the scratch directory and ARGs and ENVs set."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Step:
    instruction: str
    args: str


@dataclass
class Dockerfile:
    path: Path
    steps: list[Step] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> Dockerfile:
        text = re.sub(r"\\\n", " ", path.read_text())  # line continuations
        steps = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            instruction, _, args = line.partition(" ")
            steps.append(Step(instruction.upper(), args.strip()))
        return cls(path, steps)

    def of(self, instruction: str) -> list[str]:
        return [s.args for s in self.steps if s.instruction == instruction]

    def env(self) -> dict[str, str]:
        """The ENV the Dockerfile sets (``KEY=VALUE`` pairs)."""
        out = {}
        for args in self.of("ENV"):
            for pair in shlex.split(args):
                key, sep, value = pair.partition("=")
                assert sep, f"{self.path}: ENV {args!r}: use KEY=VALUE"
                out[key] = value
        return out

    def args(self) -> dict[str, str]:
        out = {}
        for args in self.of("ARG"):
            key, _, value = args.partition("=")
            out[key] = value
        return out


def scratch_venv(path: Path) -> Path:
    """A virtual environment whose Python also sees this project's .venv (after its own packages),
    with a ``pip`` command: what a RUN step finds in an image that has Airflow installed."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "project-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = path / "bin" / "pip"
    pip.write_text(f'#!/bin/sh\nexec "{python}" -m pip "$@"\n')
    pip.chmod(0o755)
    return path


class Build:
    """One replay of a Dockerfile: ``root`` is the image's filesystem, ``context`` the build context."""

    def __init__(self, dockerfile: Dockerfile, *, context: Path, root: Path, venv: Path, workdir: str = "/",
                 base_env: dict[str, str] | None = None) -> None:
        self.dockerfile = dockerfile
        self.context = context
        self.root = root
        self.venv = venv
        self.workdir = workdir
        self.env = {**(base_env or {}), **dockerfile.args()}

    def local(self, container_path: str) -> Path:
        return self.root / container_path.lstrip("/")

    def localize(self, text: str) -> str:
        """Absolute container paths under the directories the build writes become scratch paths."""
        roots = sorted({"/" + p.relative_to(self.root).parts[0] for p in self.root.iterdir()}, key=len, reverse=True)
        return re.sub(r"(?<![\w.:/@-])/[\w.@+/*-]*",
                      lambda m: str(self.root) + m.group(0) if any(m.group(0).startswith(r) for r in roots) else m.group(0),
                      text)

    def copy(self, args: str) -> None:
        parts = [p for p in shlex.split(args) if not p.startswith("--")]
        *sources, dest = parts
        target = self.local(dest if dest.startswith("/") else f"{self.workdir}/{dest}")
        for source in sources:
            src = self.context / source
            assert src.exists(), f"{self.dockerfile.path}: COPY {args}: {source} is not in the build context {self.context}"
            if src.is_dir():
                shutil.copytree(src, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                into = dest.endswith(("/", "/.")) or dest == "." or len(sources) > 1 or target.is_dir()
                (target if into else target.parent).mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target / src.name if into else target)

    def run(self, args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PIP_", "VIRTUAL_ENV"))}
        env.update({k: self.localize(v) for k, v in self.env.items()})
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        command = self.localize(args)
        cwd = self.local(self.workdir)
        cwd.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(["/bin/sh", "-c", command], env=env, cwd=cwd, capture_output=True, text=True,
                                timeout=timeout)
        assert result.returncode == 0, f"RUN {args}\n(here: {command})\nfailed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        return result

    def replay(self) -> list[subprocess.CompletedProcess]:
        """Every COPY, WORKDIR, ENV and RUN after FROM, in order; returns the RUN results."""
        results = []
        for step in self.dockerfile.steps:
            if step.instruction == "COPY":
                self.copy(step.args)
            elif step.instruction == "WORKDIR":
                self.workdir = step.args
            elif step.instruction == "ENV":
                self.env.update(Dockerfile(self.dockerfile.path, [step]).env())
            elif step.instruction == "RUN":
                results.append(self.run(step.args))
        return results
