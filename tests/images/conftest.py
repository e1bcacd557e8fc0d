"""The `images` marker: tests that build the Dockerfile's images with hack/images.sh and run them."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "images: builds the images with hack/images.sh (root, buildah) and runs them; skipped elsewhere"
    )
