"""fwrl: IMPALA / V-trace agents with fast-weight memories."""

from setuptools import find_packages, setup

EXTRAS = {
    "atari": ["ale-py>=0.12,<0.13"],
    # procgen2 and gym3 pin numpy<2 in their metadata but run on numpy 2; install
    # them with `pip install --no-deps procgen2 gym3` (README); this extra brings
    # their runtime dependencies.
    "procgen": ["gym", "cffi", "filelock", "glfw", "imageio", "imageio-ffmpeg", "moderngl"],
    "envpool": ["envpool>=1.2"],
    "minatar": ["minatar>=1.0.15"],
    "popgym": ["popgym>=1.0"],  # POPGym's tasks (numpy and gymnasium only)
    "ray": ["ray[default]>=2.9"],
    "kernels": ["triton>=3.2"],
    # fwrl report: rliable's statistics; rliable 1.2 pins arch < 8, whose releases do not import under pandas 3
    "report": ["rliable>=1.2", "pandas<3"],
    # episode videos (fwrl evaluate --video, fwrl train --video-every): ffmpeg through imageio-ffmpeg's binary
    "video": ["imageio", "imageio-ffmpeg"],
    # experiment tracking in Weights & Biases (fwrl train --wandb)
    "wandb": ["wandb>=0.19"],
    "test": ["pytest>=8", "pytest-xdist>=3.5", "pytest-timeout>=2.3", "hypothesis>=6", "ale-py>=0.12,<0.13", "triton>=3.2", "ray[default]>=2.9", "minatar>=1.0.15",
             "popgym>=1.0", "gym", "cffi", "filelock", "glfw", "imageio", "imageio-ffmpeg", "moderngl", "rliable>=1.2", "pandas<3", "wandb>=0.19"],
}
EXTRAS["all"] = sorted({d for deps in EXTRAS.values() for d in deps})

setup(
    name="fwrl",
    version="0.1.0",
    description="IMPALA / V-trace agents whose memory is a fast-weight programmer",
    packages=find_packages(include=["fwrl", "fwrl.*"]),
    package_data={"fwrl.settings": ["presets/*.yaml", "core_catalog.json"]},
    python_requires=">=3.10",
    # torch: install torch first (2.13.0 on the CPU machines); any torch >= 2.4 works.
    install_requires=[
        "torch>=2.4",
        "numpy",
        "gymnasium>=1.0",
        "pyyaml",
        "pydantic>=2.6",
        "rich",
        "tensorboard",
        "matplotlib",
    ],
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["fwrl=fwrl.launch.entry:main"]},
)
