"""tensorboard-gradients: per-layer gradient statistics and a Gradients tab for TensorBoard."""

import pathlib

from setuptools import find_packages, setup

ROOT = pathlib.Path(__file__).parent

setup(
    name="tensorboard-gradients",
    version="0.1.0",
    description="A TensorBoard plugin that shows per-layer gradient norms over steps and flags "
    "vanishing and exploding gradients.",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",
    # static/ (the tab's ES modules, shipped inside the package: TensorBoard's CSP forbids CDNs)
    # is a data-only package with no __init__.py, so find_packages does not list it.
    packages=find_packages(include=["tensorboard_gradients", "tensorboard_gradients.*"])
    + ["tensorboard_gradients.static"],
    package_data={"tensorboard_gradients": ["static/*.js", "static/*.css"]},
    include_package_data=True,
    install_requires=[
        "tensorboard>=2.16",
        "numpy>=1.23",
        "werkzeug>=1.0",
        # C CRC32C for event records: TensorBoard's pure-Python fallback costs ~1 ms per 5 KB.
        "google-crc32c>=1.5",
    ],
    extras_require={
        "tensorflow": ["tensorflow>=2.16"],
        "tensorflow-cpu": ["tensorflow-cpu>=2.16"],
        "torch": ["torch>=2.1"],
        "lightning": ["lightning>=2.1"],
        "transformers": ["transformers>=4.41", "accelerate>=0.26"],
        "jax": ["jax>=0.4.20", "optax>=0.1.7"],
        # Logdirs in buckets (s3://, gs://), read through fsspec (format/storage.py).
        "s3": ["s3fs>=2023.1"],
        "gcs": ["gcsfs>=2023.1"],
        # The demo's data: scikit-learn's bundled digits (nothing downloaded at run time).
        "demo": ["tensorflow-cpu>=2.16", "scikit-learn>=1.3"],
        # The documentation site (mkdocs.yml): `./dev docs` serves it, `./dev test` builds it
        # with --strict. Pinned: the theme and the API pages' renderer change their output.
        "docs": ["mkdocs==1.6.1", "mkdocs-material==9.8.1", "mkdocstrings==1.0.8",
                 "mkdocstrings-python==2.0.11"],
        # Playwright drives the system's Chromium (Debian `chromium`); it downloads no browser.
        # The end-to-end test runs the demo.
        # torch pinned: on this project's machines 2.13.0 resolves to a CPU wheel on disk, where
        # an unpinned torch would pull the multi-GB CUDA build from PyPI.
        # deepspeed pinned: the ZeRO tests read its partitions (public and `_hp_mapping`).
        # transformers pinned: the validation set's GPT-2 (benchmarks/validation.py) is built from
        # its GPT2Config (no weights downloaded); it pulls no torch of its own. The framework
        # integrations are tested against pinned versions (lightning, accelerate for the
        # Trainer, flax and optax, tensorboardX); build and twine check the wheel and sdist;
        # IPython gives the notebook extension's (%tensorboard) output for the proxy test.
        # pytest-xdist: `./dev test` runs pytest in two workers (most tests wait on processes).
        # The bucket tests read from real servers on loopback: moto's S3 server and a GCS
        # emulator, with the s3fs and gcsfs they were tested with.
        "test": ["pytest>=7", "pytest-xdist>=3", "setuptools>=61", "wheel", "playwright>=1.40",
                 "scikit-learn>=1.3",
                 "torch==2.13.0", "jax==0.10.2", "deepspeed==0.19.8", "transformers==5.18.0",
                 "accelerate==1.15.0", "lightning==2.6.6", "flax==0.12.8", "optax==0.2.8",
                 "tensorboardX==2.6.5", "build>=1.2", "twine>=5", "ipython>=8",
                 "s3fs==2026.9.0", "gcsfs==2026.10.1", "moto[server]==5.2.6",
                 "gcp-storage-emulator==2026.7.19"],
    },
    entry_points={
        "tensorboard_plugins": ["gradients = tensorboard_gradients.server.plugin:GradientsLoader"],
        "console_scripts": ["tensorboard-gradients = tensorboard_gradients.cli:main"],
    },
    classifiers=[
        "Framework :: TensorFlow",
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
