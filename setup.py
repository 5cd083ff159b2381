"""The setuptools half of ferry's pip build, used where scikit-build-core is not installed (see
python/build_backend/ferry_build_backend.py). It configures CMake as pyproject.toml's
[tool.scikit-build] section does (Release, the Python extension and the ferry tool, no tests or
benchmarks), installs CMake's "python" component into a staging folder and packages python/ferry
with it. Extra CMake arguments come from $CMAKE_ARGS, as with scikit-build-core. Do not run this
file directly: `python3 -m pip install --no-build-isolation .`"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.install_lib import install_lib

ROOT = Path(__file__).resolve().parent
BUILD = ROOT / "build-pip"  # ignored by git, like every /build*/; reused by the next build


def version() -> str:
    """The version in CMakeLists.txt's project() line, the same regex as pyproject.toml's."""
    text = (ROOT / "CMakeLists.txt").read_text()
    match = re.search(r"project\(ferry VERSION ([0-9]+\.[0-9]+\.[0-9]+)", text)
    if match is None:
        raise RuntimeError("CMakeLists.txt: no `project(ferry VERSION x.y.z` line")
    return match.group(1)


class CMakeBuild(build_ext):
    """Builds `ferry._ferry` and the ferry tool with CMake; the tool waits in the staging
    folder for CMakeInstallLib."""

    def build_extension(self, ext: Extension) -> None:
        tree = Path(self.build_temp) / "cmake"
        stage = Path(self.build_temp) / "stage"
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(tree), "-DCMAKE_BUILD_TYPE=Release",
            "-DFERRY_BUILD_PYTHON=ON", "-DFERRY_PYTHON_WHEEL=ON", "-DFERRY_BUILD_TOOLS=ON",
            "-DFERRY_BUILD_TESTS=OFF", "-DFERRY_BUILD_BENCH=OFF",
            f"-DPython_EXECUTABLE={sys.executable}",
        ]
        if shutil.which("ninja") and not (tree / "CMakeCache.txt").exists():
            configure += ["-G", "Ninja"]
        configure += os.environ.get("CMAKE_ARGS", "").split()
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(tree), "-j", str(os.cpu_count() or 1)],
                       check=True)
        if stage.exists():
            shutil.rmtree(stage)
        subprocess.run(["cmake", "--install", str(tree), "--component", "python", "--prefix",
                        str(stage)], check=True)
        built = sorted((stage / "ferry").glob("_ferry*"))
        if len(built) != 1:
            raise RuntimeError(f"expected one _ferry module in {stage / 'ferry'}, found {built}")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[0], target)


class CMakeInstallLib(install_lib):
    """Installs the package, then the ferry tool into the scripts folder (a wheel's
    <name>.data/scripts, which pip puts on the environment's bin/)."""

    def run(self) -> None:
        super().run()
        tool = Path(self.get_finalized_command("build_ext").build_temp) / "stage" / "bin" / "ferry"
        scripts = self.get_finalized_command("install").install_scripts
        self.mkpath(scripts)
        self.copy_file(str(tool), os.path.join(scripts, "ferry"))


BUILD.mkdir(exist_ok=True)
setup(
    version=version(),
    packages=find_packages("python", include=["ferry", "ferry.*"]),
    package_dir={"": "python"},
    package_data={"ferry": ["py.typed", "*.pyi"]},
    include_package_data=False,
    ext_modules=[Extension("ferry._ferry", sources=[])],
    cmdclass={"build_ext": CMakeBuild, "install_lib": CMakeInstallLib},
    options={"build": {"build_base": str(BUILD / "setuptools")},
             "egg_info": {"egg_base": str(BUILD)}},
    zip_safe=False,
)
