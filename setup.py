"""What pyproject.toml cannot say: the repository's conf/ ships inside the wheel as the package data ``attnlab/conf``,
so that an installed (non-editable) attnlab finds its Hydra configs (src/attnlab/core/paths.py picks the checkout's conf/
when there is one, this copy otherwise). Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    # hydra_plugins is a namespace package (no __init__.py): Hydra finds its sweepers there (src/hydra_plugins/attnlab)
    packages=[*find_packages("src"), "hydra_plugins.attnlab", "attnlab.conf"],
    package_dir={"": "src", "attnlab.conf": "conf"},
    package_data={"attnlab.conf": ["**/*.yaml"], "attnlab.explorer": ["template.html"]},  # the explorer's page
    exclude_package_data={"attnlab.conf": ["local/*"]},  # machine-local overrides (git-ignored) stay on the machine
)
