"""The one thing pyproject.toml cannot say: the top-level resources/ folder is installed
as the package attnviz.resources (see attnviz/assets.py)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["attnviz", "attnviz.*"]), "attnviz.resources"],
    package_dir={"attnviz.resources": "resources"},
)
