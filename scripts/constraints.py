"""Write constraints.txt: the exact versions of gpufair's runtime dependencies (no extras), as
installed in this environment, for the Docker image's dependency layer.

python scripts/constraints.py           # write constraints.txt
python scripts/constraints.py --check   # exit 1 if it would change (or misses a dependency)

Run it after changing the dependencies in pyproject.toml (and installing them), then rebuild the
image: the layer with the dependencies is rebuilt only when this file changes.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "constraints.txt"
HEADER = (
    "# gpufair's runtime dependencies, pinned (scripts/constraints.py writes this file).\n"
    "# The Docker image installs exactly these, in a layer of their own.\n"
)


def _key(name: str) -> str:
    return canonicalize_name(name)


def closure(root: str = "gpufair") -> dict[str, str]:
    """Every distribution `root` needs at run time here (no extras of its own), with its
    installed version; markers are evaluated for this interpreter and platform."""
    seen: dict[str, str] = {}
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in done:
            continue
        done.add((name, extras))
        for line in md.distribution(name).requires or []:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is not None and not any(
                marker.evaluate({"extra": e}) for e in (extras or {""})
            ):
                continue
            dep = _key(requirement.name)
            seen.setdefault(dep, md.version(dep))
            todo.append((dep, frozenset(requirement.extras)))
    seen.pop(_key(root), None)
    return seen


def render() -> str:
    return HEADER + "".join(f"{n}=={v}\n" for n, v in sorted(closure().items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = render()
    if args.check:
        if OUT.read_text() != text:
            print("constraints.txt is out of date: run python scripts/constraints.py")
            return 1
        print(f"constraints.txt is up to date ({text.count('==')} packages)")
        return 0
    OUT.write_text(text)
    print(f"wrote constraints.txt ({text.count('==')} packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
