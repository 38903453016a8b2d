#!/usr/bin/env bash
# The wheels a lent GPU host needs to run this project (bench/on_gpu.sh installs them from .whl/ there): Prefect,
# pydantic, boto3, LitServe (bench.serve's peer) and what they need, for that host's Python 3.12, at the versions this checkout's .venv holds,
# less the packages the host's image already has (the device tool's KINDS.md, read 2026-11-17). Run it here, where
# pip reaches a package index; .whl/ is ignored by git and travels with the device tool's `carry`.
#
#   bash bench/gpu_wheels.sh && du -sh .whl      # about 46 MB; the device tool carries at most 64 MiB in all
set -euo pipefail
version() { .venv/bin/python -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
wanted=()
for name in prefect fastapi sqlalchemy pydantic; do
    wanted+=("$name==$(version $name)")
done
download=$(mktemp -d)
platforms=()
# In this order, the set that installed on the H200 host on 2026-11-26 (pip prefers the tags given first).
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1 manylinux_2_24 manylinux_2_31 \
    manylinux_2_34 manylinux_2_35; do
    platforms+=(--platform "${tag}_x86_64")
done
python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    -d "$download" "${wanted[@]}" boto3 asyncpg imagehash optuna "litserve==$(version litserve)"
# On the host's image already (a second copy would shadow it); docker: not imported by anything run there.
present=" absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers
flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx humanize hypothesis idna
imageio iniconfig interface-meta jax jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson
ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
numba-cuda numpy numpyro onnx onnx-ir onnxruntime onnxscript optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex
requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp docker "
rm -rf .whl
mkdir .whl
for wheel in "$download"/*.whl; do
    name=$(basename "$wheel" | cut -d- -f1 | tr '_A-Z' '-a-z')
    case "$present" in
    *[[:space:]]"$name"[[:space:]]*) ;;
    *) cp "$wheel" .whl/ ;;
    esac
done
rm -rf "$download"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >>.git/info/exclude
echo "$(ls .whl | wc -l) wheels in .whl/ ($(du -sh .whl | cut -f1)): carry it with the device tool's run (carry: [\".whl\"])"
