"""Alias of `bench/cost_model_validation.py`, the published-run validation issue 3 names (same arguments).

python bench/cost_model/validation.py [--csv PATH] [--json] [--host-sensitivity 13.5,27,36]
"""

import runpy
from pathlib import Path

if __name__ == "__main__":
    runpy.run_path(str(Path(__file__).resolve().parents[1] / "cost_model_validation.py"), run_name="__main__")
