from __future__ import annotations

import os

# cuBLAS needs a fixed workspace to run deterministically (the GPU tests, with the line below).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest
import torch

torch.use_deterministic_algorithms(True)


@pytest.fixture
def seed() -> int:
    torch.manual_seed(0)
    return 0


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
