"""The package as a registry would get it: a wheel built from pyproject.toml installs into
a clean virtual environment, imports there, has the version written in one place
(``hoptrace_probe/_version.py``), every subpackage found by the build, ``py.typed`` and the
license text."""

import ast
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def source_version() -> str:
    tree = ast.parse((HERE / "hoptrace_probe" / "_version.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.targets[0].id == "__version__":
            return node.value.value
    raise AssertionError("no __version__ in _version.py")


def test_the_wheel_installs_into_a_clean_venv_with_its_version_and_types(tmp_path):
    # Built from a copy, so that no build files land in the work tree.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(HERE / name, src / name)
    shutil.copytree(HERE / "hoptrace_probe", src / "hoptrace_probe",
                    ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
                    "--no-deps", "-w", str(dist), str(src)], check=True, timeout=300)
    (wheel,) = dist.glob("hoptrace_probe-*.whl")
    version = source_version()
    assert wheel.name.startswith(f"hoptrace_probe-{version}-"), wheel.name

    names = set(zipfile.ZipFile(wheel).namelist())
    assert "hoptrace_probe/py.typed" in names
    assert "hoptrace_probe/carrier/mqtt_property.py" in names, "subpackages are found"
    assert not any(n.startswith(("tests/", "examples/")) for n in names), sorted(names)
    assert any(n.startswith("hoptrace_probe-") and n.endswith("/LICENSE") for n in names), \
        "the Apache-2.0 license text travels with the wheel"

    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    py = env / "bin" / "python"
    # This interpreter's pip installs into the new environment (pip's --python), which
    # then holds the standard library and this wheel only.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet",
                    "--disable-pip-version-check", "--no-deps", "--no-index", str(wheel)],
                   check=True, timeout=300)
    check = (
        "import importlib.metadata, pathlib, hoptrace_probe\n"
        "p = pathlib.Path(hoptrace_probe.__file__)\n"
        "assert 'site-packages' in str(p), p\n"
        "assert (p.parent / 'py.typed').is_file()\n"
        "print(hoptrace_probe.__version__, importlib.metadata.version('hoptrace-probe'))\n"
    )
    out = subprocess.run([str(py), "-c", check], cwd=tmp_path, check=True, capture_output=True,
                         text=True, timeout=60).stdout.split()
    assert out == [version, version]
