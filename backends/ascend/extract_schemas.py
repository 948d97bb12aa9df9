"""Copy the schemas of the operators trex emits from a torch_npu wheel into `data/torch_npu_schemas.txt`.

    python -m trex.backends.ascend.extract_schemas torch_npu-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl

(get the wheel with `pip download torch_npu==2.13.0 --no-deps`). The file records the wheel's name
and sha256 so a test can re-check it against the same wheel; the lines are the yaml's, unchanged.
"""

from __future__ import annotations

import argparse
import hashlib
import zipfile
from pathlib import Path

from trex.backends.ascend.schemas import DATA_FILE, EMITTED_OPS, YAML_IN_WHEEL, AscendSchemaError, schema_lines


def wheel_schemas(wheel: Path) -> dict[str, str]:
    """Every operator schema in the wheel's codegen yaml (name -> schema text)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            text = archive.read(YAML_IN_WHEEL).decode()
    except (OSError, KeyError, zipfile.BadZipFile) as error:
        raise AscendSchemaError(f"cannot read {YAML_IN_WHEEL} from {wheel}: {error}") from error
    return schema_lines(text)


def render(wheel: Path) -> str:
    schemas = wheel_schemas(wheel)
    missing = [op for op in EMITTED_OPS if op not in schemas]
    if missing:
        raise AscendSchemaError(f"{wheel.name} has no schema for {', '.join(missing)}")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    lines = [
        "# Schemas of the torch_npu operators trex's Ascend backend emits, copied unchanged from",
        f"# {YAML_IN_WHEEL} in the wheel below by trex.backends.ascend.extract_schemas.",
        f"# wheel: {wheel.name}",
        f"# sha256: {digest}",
    ]
    return "\n".join(lines + [schemas[op] for op in EMITTED_OPS]) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--out", type=Path, default=DATA_FILE)
    args = parser.parse_args(argv)
    args.out.write_text(render(args.wheel))
    print(f"wrote {len(EMITTED_OPS)} schemas to {args.out}")


if __name__ == "__main__":
    main()
