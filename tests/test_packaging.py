"""What `pip install` reads from pyproject.toml: no deprecation warning printed on every install."""

from __future__ import annotations

import warnings
from pathlib import Path

from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parents[1]


def test_the_project_metadata_applies_without_setuptools_deprecation_warnings():
    """setuptools printed its `project.license` table deprecation three times per `pip install`."""
    from setuptools.warnings import SetuptoolsDeprecationWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    deprecated = [str(w.message).splitlines()[0] for w in caught if issubclass(w.category, SetuptoolsDeprecationWarning)]
    assert deprecated == []
    assert dist.metadata.license_expression == "Apache-2.0"
