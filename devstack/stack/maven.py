"""Jars from Maven Central for the stack's servers: single artifacts (Apicurio Registry, Trino)
copied with ``mvn dependency:copy`` into a work directory, tarballs unpacked safely; the
dependencies of a pom (Kafka, Kafka Connect and its plugins) copied with
``mvn dependency:copy-dependencies``."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tarfile
from pathlib import Path

from .paths import StackError
from .procs import find_executable

__all__ = [
    "INSTALL_MAVEN",
    "copy_and_unpack",
    "copy_artifact",
    "copy_dependencies",
    "install_directory",
    "pom_digest",
    "unpack_tarball",
]

#: How to get ``mvn`` when it is missing.
INSTALL_MAVEN = "install Maven (Debian/Ubuntu: `apt-get install -y maven`)"
# Pinned so the result does not depend on Maven's default. 2.8 (the default of Maven 3.8 and
# 3.9), because 3.x reads the artifact's POM first and fails where its parent POM is not on
# Maven Central (Apicurio's). The tarballs carry everything their servers need.
_COPY_GOAL = "org.apache.maven.plugins:maven-dependency-plugin:2.8:copy"


def _mvn(missing: str) -> str:
    """The ``mvn`` executable; StackError saying that ``missing`` (what is not cached) cannot be
    downloaded without it, and how to install it."""
    mvn = find_executable("mvn")
    if mvn is None:
        raise StackError(
            f"{missing} and `mvn` was not found to fetch from Maven Central: {INSTALL_MAVEN}"
        )
    return mvn


def _run_maven(cmd: list[str], cwd: Path, what: str) -> None:
    """Run one Maven command; StackError naming ``what`` with the tail of its output if it
    fails."""
    try:
        out = subprocess.run(
            cmd, cwd=cwd, capture_output=True, text=True, timeout=1800, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"`{' '.join(cmd)}` did not finish in 30 minutes") from exc
    if out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-30:])
        raise StackError(
            f"could not download {what} from Maven Central "
            f"(`{' '.join(cmd)}` exited {out.returncode}):\n{tail}"
        )


def copy_artifact(artifact: str, directory: Path) -> None:
    """Copy ``artifact`` (``group:artifact:version[:type[:classifier]]``) from Maven Central into
    ``directory``; :class:`StackError` naming the artifact and how to fix it otherwise."""
    mvn = _mvn(f"{artifact} is not cached")
    cmd = [mvn, "-q", "-B", _COPY_GOAL, f"-Dartifact={artifact}", f"-DoutputDirectory={directory}"]
    _run_maven(cmd, directory, artifact)


def pom_digest(pom: str) -> str:
    """The SHA-256 of a pom's text: what a cache directory filled from it records in its
    sentinel, so that editing the pom makes the next start download again."""
    return hashlib.sha256(pom.encode()).hexdigest()


def copy_dependencies(
    pom: str,
    work: Path,
    output: Path,
    what: str,
    *,
    profile: str | None = None,
    expect: str | None = None,
) -> None:
    """Copy the runtime dependencies of ``pom`` (its text, written to ``work/pom.xml``), with
    ``profile`` active if given, from Maven Central into ``output`` (``mvn
    dependency:copy-dependencies``). ``what`` names them in errors (``the Kafka 4.3.1 jars``);
    ``expect`` is a file name that must be in ``output`` afterwards."""
    mvn = _mvn(f"{what} are not cached")
    pom_file = work / "pom.xml"
    pom_file.write_text(pom, encoding="utf-8")
    cmd = [mvn, "-q", "-B", "-f", str(pom_file)]
    if profile:
        cmd.append(f"-P{profile}")
    cmd += ["dependency:copy-dependencies", f"-DoutputDirectory={output}", "-DincludeScope=runtime"]
    _run_maven(cmd, work, what)
    if expect is not None and not (output / expect).is_file():
        raise StackError(f"Maven resolved no {expect} for {what}")


def unpack_tarball(tarball: Path, destination: Path, artifact: str) -> None:
    """Unpack ``tarball`` (of ``artifact``) into ``destination``, refusing members that would
    land outside it."""
    try:
        with tarfile.open(tarball) as archive:
            archive.extractall(destination, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise StackError(f"could not unpack {artifact} ({exc})") from exc


def copy_and_unpack(artifact: str, tarball_name: str, work: Path) -> Path:
    """Copy ``artifact``, a tarball named ``tarball_name``, from Maven Central into ``work`` and
    unpack it there; the directory it unpacked into (the tarball itself removed)."""
    copy_artifact(artifact, work)
    tarball = work / tarball_name
    if not tarball.is_file():
        raise StackError(f"Maven copied no {tarball_name} for {artifact}")
    unpacked = work / "unpacked"
    unpack_tarball(tarball, unpacked, artifact)
    tarball.unlink()
    return unpacked


def install_directory(source: Path, root: Path, sentinel: str, artifact: str) -> None:
    """Move ``source`` to ``root`` (replacing what is there), then write ``root/sentinel``
    naming ``artifact``: written last, so an install cut short never looks complete."""
    if root.exists():
        shutil.rmtree(root)
    source.rename(root)
    (root / sentinel).write_text(artifact + "\n")
