"""Maps the repository's top-level folders onto the `trex` import namespace.

The tree reads as the compiler pipeline (capture in trex_compiler/, then passes/, backends/, ...)
while users write `import trex`, `import trex.passes`. Every folder below is walked for packages,
so adding a sub-package needs no edit here. All other metadata is in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup

FOLDER_TO_PACKAGE = {
    "trex_compiler": "trex",
    "passes": "trex.passes",
    "backends": "trex.backends",
    "runtime": "trex.runtime",
    "cost_model": "trex.cost_model",
    "planner": "trex.planner",
    "workloads": "trex.workloads",
}

ROOT = Path(__file__).parent


def _packages() -> tuple[list[str], dict[str, str]]:
    packages, package_dir = [], {}
    for folder, package in FOLDER_TO_PACKAGE.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            relative = init.parent.relative_to(ROOT / folder)
            name = ".".join([package, *relative.parts])
            packages.append(name)
            package_dir[name] = str(init.parent.relative_to(ROOT))
    return packages, package_dir


packages, package_dir = _packages()
setup(
    packages=packages,
    package_dir=package_dir,
    package_data={name: ["*.json", "*.toml", "*.csv", "*.md", "data/*"] for name in packages},
)
