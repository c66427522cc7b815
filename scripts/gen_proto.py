"""Regenerate the Python code for the API contract in proto/ into service/gpufair/v1/.

python scripts/gen_proto.py           # write the generated files
python scripts/gen_proto.py --check   # exit 1 if regeneration would change them (CI)
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT_PACKAGE = ROOT / "service" / "gpufair" / "v1"


def generate(out_root: Path) -> Path:
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    well_known = str(resources.files("grpc_tools") / "_proto")
    # Typed stubs for messages and services come from mypy-protobuf's plugins, installed beside
    # this interpreter by the test extras.
    bin_dir = Path(sys.executable).parent
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    package = out_root / "gpufair" / "v1"
    (package / "__init__.py").write_text('"""Generated from proto/gpufair/v1; do not edit."""\n')
    return package


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the checked-in code is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        names = sorted(p.name for p in fresh.iterdir() if p.is_file())
        if args.check:
            stale = [
                n
                for n in names
                if not (OUT_PACKAGE / n).exists()
                or not filecmp.cmp(fresh / n, OUT_PACKAGE / n, False)
            ]
            extra = sorted(p.name for p in OUT_PACKAGE.glob("*.py*") if p.name not in names)
            if stale or extra:
                print(f"generated code is stale: {stale + extra}; run python scripts/gen_proto.py")
                return 1
            print(f"generated code is up to date ({len(names)} files)")
            return 0
        OUT_PACKAGE.mkdir(parents=True, exist_ok=True)
        for old in OUT_PACKAGE.glob("*.py*"):
            old.unlink()
        for n in names:
            shutil.copy2(fresh / n, OUT_PACKAGE / n)
        print(f"wrote {len(names)} files to {OUT_PACKAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
