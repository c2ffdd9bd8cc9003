"""The README's image commands, read without building: the wheels for an offline build
come from the base image's own Python, never the host's (wheels for the host's 3.11
do not install on the default base's 3.12). tests/image/test_image.py runs them."""

from __future__ import annotations

import shlex

from tests.image.recipe import ROOT, dockerfile_stages, readme_commands


def _builds() -> list[list[str]]:
    builds = []
    for command in readme_commands():
        words = shlex.split(command)
        assert words[:2] == ["docker", "build"] and "&&" not in words and "|" not in words, (
            f"{command!r}: every step is a docker build, so each runs with the base's Python")
        builds.append(words[2:])
    return builds


def _option(words: list[str], name: str) -> str | None:
    for i, word in enumerate(words):
        if word == name:
            return words[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def test_the_offline_wheels_are_exported_from_a_stage_of_the_base():
    builds = _builds()
    stages = dockerfile_stages()
    (export,) = [b for b in builds if _option(b, "--target")]
    target = _option(export, "--target")
    assert target in stages, f"--target {target}: no such stage"
    output = _option(export, "--output")
    assert output and output.startswith("type=local,dest="), output
    wheels_dir = output.removeprefix("type=local,dest=")
    # the exported stage holds what a stage FROM ${BASE} built with that base's pip
    sources = [stages[target].base, *stages[target].copies_from()]
    builders = [stages[s] for s in sources if s in stages]
    assert any(b.base == "${BASE}" and any("pip wheel" in line for line in b.lines)
               for b in builders), f"stage {target} does not come from pip wheel in ${{BASE}}"
    # and the offline build reads that directory
    offline = [b for b in builds if _option(b, "--build-arg") == f"WHEELS={wheels_dir}"]
    assert offline, f"no documented build with --build-arg WHEELS={wheels_dir}"
    assert builds.index(offline[0]) > builds.index(export)


def test_the_offline_build_installs_from_the_wheels_alone():
    build = dockerfile_stages()["build"]
    assert build.base == "${BASE}"
    assert any("pip install" in line and "--no-index" in line for line in build.lines)
    final = list(dockerfile_stages().values())[-1]
    assert final.base == "${BASE}", "the image's stage must be the last (the default target)"


def test_the_dockerfile_header_shows_the_readmes_offline_commands():
    header = [line.removeprefix("#").strip()
              for line in (ROOT / "Dockerfile").read_text().splitlines()
              if line.startswith("#")]
    for command in readme_commands():
        assert command in header, f"the Dockerfile's comment lacks {command!r}"
