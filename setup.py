"""sol_control: an ament_python package that also installs with `pip install -e .`."""
import runpy
from glob import glob
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

PACKAGE = "sol_control"


def tree(pattern: str) -> list[str]:
    return sorted(p for p in glob(pattern, recursive=True) if not p.endswith("/"))


def data_files() -> list[tuple[str, list[str]]]:
    share = f"share/{PACKAGE}"
    files = [
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (share, ["package.xml"]),
        (f"{share}/launch", tree("launch/*")),
        (f"{share}/config", tree("config/*")),
    ]
    for bundle in sorted(glob("models/*/")):
        files.append((f"{share}/{bundle.rstrip('/')}", tree(f"{bundle}*.*")))
    return [(dest, srcs) for dest, srcs in files if srcs]


class BuildWithNative(build_py):
    """Also compile the native pass into the built package (sol_control/native/build.py: it never
    fails the install; without it ONNX Runtime runs every graph)."""

    def run(self):
        super().run()
        build = runpy.run_path("sol_control/native/build.py")
        build["build"](Path(self.build_lib) / PACKAGE / "native" / build["LIBRARY_NAME"])


setup(
    name=PACKAGE,
    cmdclass={"build_py": BuildWithNative},
    version="0.1.0",
    packages=find_packages(include=[PACKAGE, f"{PACKAGE}.*"]),
    package_data={f"{PACKAGE}.bench": ["data/*.json"]},  # the LM benchmark workload
    data_files=data_files(),
    python_requires=">=3.10",
    install_requires=["numpy", "pydantic>=2", "pyyaml", "onnxruntime", "opencv-python-headless", "gguf", "tokenizers",
                      "jinja2"],
    extras_require={
        # dev-only: data generation, training, export. torch is pinned: an unpinned torch pulls a
        # multi-GB CUDA build. The node never imports torch.
        "train": ["torch==2.13.0", "transformers==5.24.0", "onnxscript==0.7.2", "onnx-ir==1.1.0", "onnx==1.23.2",
                  "accelerate==1.15.0"],
        "sim": ["mujoco==4.0.0"],
    },
    zip_safe=False,  # the native pass is a shared library loaded from the package folder
    maintainer="sol_control developers",
    description="Quantized speculative decoding co-processor for ROS 2 robot cells",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "coprocessor = sol_control.ros.node:main",
            "cell_sim = sol_control.sim.bridge:main",
            "sol-control = sol_control.cli:main",
        ],
    },
)
