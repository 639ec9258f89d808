"""The wheels a bare GPU machine needs to run `bench/gpu/gpu_check.sh`: build them here, pick and verify them there.

    python bench/gpu/gpu_bundle.py build --out .gpu-bundle      # `make gpu-bundle`: needs package access
    python3 bench/gpu/gpu_bundle.py select .gpu-bundle          # on the GPU machine: the wheels it lacks, one a line
    python3 bench/gpu/gpu_bundle.py verify .gpu-bundle --checkout .   # the bundled zerotrain is this checkout's code

`build` makes a zerotrain wheel from the working tree (`pip wheel --no-deps`, from a copy of the package sources, so
the tree itself gains no build files) and downloads, for CPython 3.12 on manylinux x86_64, the wheels that the
runtime's import path (`zerotrain.runtime`, the engine, `zerotrain.runtime.examples.gpt`,
bench/compare/compare*.py) needs beyond what the GPU machine has: pydantic and everything it requires, at the
versions installed here (the versions the tests ran with). kopf and kubernetes are the operator's and are never
imported there; torch, numpy, safetensors, rich, prometheus-client and PyYAML are the machine's own. It writes
`bundle.json`: every wheel with its SHA-256, and the SHA-256 of every source file the zerotrain wheel was built from.

`select` and `verify` run on the GPU machine before anything is installed, so they use the standard library only.
`select` prints zerotrain's wheel and each dependency the machine lacks or has older than the bundle's (torch's
typing_extensions may be older than pydantic needs); `verify` fails when the checkout's sources differ from the
ones the bundle was built from (a bundle built before the code changed would test old code).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MAX_BUNDLE_BYTES = 60 * 2**20
# setuptools' package-dir mapping (pyproject.toml): installed package prefix -> folder in the checkout.
PACKAGE_DIRS = {"zerotrain/runtime/": "runtime/", "zerotrain/operator/": "operator/", "zerotrain/": "zerotrain/"}
SOURCE_DIRS = ("zerotrain", "runtime", "operator")
SOURCE_SUFFIXES = (".py", ".typed")
# What the runtime's import path needs that a machine with only torch and the scientific stack lacks; their own
# requirements are followed from the metadata installed here.
RUNTIME_ROOTS = ("pydantic",)
# Provided by the GPU machine, never bundled (torch above all: the machine's CUDA build must stay the one in use).
NEVER_BUNDLED = {"torch", "numpy", "safetensors", "rich", "prometheus-client", "pyyaml", "packaging"}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def normalize(name: str) -> str:
    """PEP 503 name: lower case, runs of -_. as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string (2.14.4rc1 -> (2, 14, 4)); () when it has none."""
    m = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_files(root: Path) -> dict[str, str]:
    """SHA-256 of every file the zerotrain wheel is built from: *.py and py.typed under the package folders."""
    out: dict[str, str] = {}
    for top in SOURCE_DIRS:
        for path in sorted((root / top).rglob("*")):
            rel = path.relative_to(root)
            if any(p == "__pycache__" or p.startswith(".") for p in rel.parts) or not path.is_file():
                continue
            if path.name.endswith(SOURCE_SUFFIXES):
                out[rel.as_posix()] = sha256(path)
    return out


def wheel_name_version(wheel: Path) -> tuple[str, str]:
    """(normalized distribution name, version) from a wheel's file name."""
    name, version = wheel.name.split("-")[:2]
    return normalize(name), version


def requirement_closure(roots: tuple[str, ...]) -> dict[str, str]:
    """The installed distributions `roots` need, themselves included (extras and non-matching markers skipped)."""
    seen: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = normalize(todo.pop())
        if name in seen or name in NEVER_BUNDLED:
            continue
        dist = metadata.distribution(name)
        seen[name] = dist.version
        for req in dist.requires or []:
            if ";" in req:
                marker = req.split(";", 1)[1]
                # Extras are never wanted; the platform markers that appear (Windows, old Pythons) never apply.
                if "extra" in marker or "platform_system" in marker or "python_version" in marker:
                    continue
            todo.append(re.split(r"[\s<>=!~;\[(]", req.strip(), maxsplit=1)[0])
    return seen


def _pip(python: str, *args: str) -> None:
    subprocess.run([python, "-m", "pip", *args], check=True)


def build_wheel(out: Path, python: str) -> Path:
    """zerotrain's wheel from a copy of the sources (pyproject.toml, README.md and the package folders)."""
    with tempfile.TemporaryDirectory(prefix="zt-wheel-") as tmp:
        src = Path(tmp, "src")
        src.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(ROOT / name, src / name)
        for rel in source_files(ROOT):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
        dist = Path(tmp, "dist")
        # The build backend (setuptools) is this environment's: no download, no isolation.
        _pip(python, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(dist), str(src))
        (wheel,) = dist.glob("zerotrain-*.whl")
        return Path(shutil.copy2(wheel, out / wheel.name))


def check_wheel_has_sources(wheel: Path, sources: dict[str, str]) -> None:
    """Every source file is in the wheel, byte for byte (a package missing from pyproject's list would not be)."""
    with zipfile.ZipFile(wheel) as z:
        packaged = {}
        for info in z.infolist():
            for prefix, folder in PACKAGE_DIRS.items():
                if info.filename.startswith(prefix):
                    packaged[folder + info.filename[len(prefix) :]] = hashlib.sha256(z.read(info)).hexdigest()
                    break
    missing = sorted(rel for rel, digest in sources.items() if packaged.get(rel) != digest)
    if missing:
        raise SystemExit(f"the zerotrain wheel lacks or differs in {len(missing)} source files: {missing[:5]}")


def download(out: Path, python: str, python_version: str, dists: dict[str, str]) -> None:
    """Binary wheels of `dists` for CPython `python_version` on manylinux x86_64 (pure-Python ones fit any)."""
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    args = ["download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version", python_version]
    args += ["--implementation", "cp", *platforms, "--dest", str(out)]
    _pip(python, *args, *(f"{name}=={version}" for name, version in sorted(dists.items())))


def build(out: Path, python_version: str) -> int:
    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("*.whl"), out / "bundle.json"]:
        old.unlink(missing_ok=True)  # one version of each distribution, nothing left from an older build
    python = sys.executable
    sources = source_files(ROOT)
    wheel = build_wheel(out, python)
    check_wheel_has_sources(wheel, sources)
    dists = requirement_closure(RUNTIME_ROOTS)
    download(out, python, python_version, dists)
    wheels = sorted(out.glob("*.whl"))
    names = [wheel_name_version(w)[0] for w in wheels]
    problems = [f"{n}: more than one wheel" for n in sorted(set(names)) if names.count(n) > 1]
    problems += [f"{n}: must not be bundled" for n in names if n in NEVER_BUNDLED]
    problems += [f"{n}: not downloaded" for n in dists if n not in names]
    total = sum(w.stat().st_size for w in wheels)
    if total > MAX_BUNDLE_BYTES:
        problems.append(f"{total} bytes, more than {MAX_BUNDLE_BYTES}")
    if problems:
        print("gpu bundle: " + "; ".join(problems), file=sys.stderr)
        return 1
    manifest: dict[str, Any] = {
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python_version": python_version,
        "platforms": list(PLATFORMS),
        "wheels": [
            {
                "file": w.name,
                "name": n,
                "version": wheel_name_version(w)[1],
                "sha256": sha256(w),
                "bytes": w.stat().st_size,
            }
            for w, n in zip(wheels, names, strict=True)
        ],
        "total_bytes": total,
        "sources": sources,
    }
    (out / "bundle.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for w in manifest["wheels"]:
        print(f"  {w['file']}  {w['bytes'] / 2**20:.2f} MiB")
    print(
        f"gpu bundle: {out} ({len(wheels)} wheels, {total / 2**20:.2f} MiB, cp{python_version.replace('.', '')}, "
        f"{len(sources)} source files) in {time.monotonic() - t0:.0f} s"
    )
    return 0


def _manifest(bundle: Path) -> dict[str, Any]:
    path = bundle / "bundle.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no bundle there; run `make gpu-bundle` on a machine with package access")
    return json.loads(path.read_text())


def select(bundle: Path) -> list[Path]:
    """zerotrain's wheel, and every other bundled wheel whose distribution is absent here or older."""
    chosen = []
    for w in _manifest(bundle)["wheels"]:
        path = bundle / w["file"]
        if not path.is_file() or sha256(path) != w["sha256"]:
            raise SystemExit(f"{path}: missing or not the file bundle.json lists; rebuild with `make gpu-bundle`")
        try:
            have = metadata.version(w["name"]) if w["name"] != "zerotrain" else None
        except metadata.PackageNotFoundError:
            have = None
        if have is not None and release(have) >= release(w["version"]):
            print(
                f"gpu bundle: {w['name']} {have} is installed (bundle has {w['version']}): not installed",
                file=sys.stderr,
            )
            continue
        why = "absent" if have is None else f"installed {have} is older"
        print(f"gpu bundle: {w['name']} {w['version']} ({why})", file=sys.stderr)
        chosen.append(path)
    return chosen


def stale_sources(bundle: Path, checkout: Path) -> list[str]:
    """Source files that differ between the checkout and the bundle's zerotrain wheel (changed, new or gone)."""
    built = _manifest(bundle)["sources"]
    here = source_files(checkout)
    return sorted(rel for rel in set(built) | set(here) if built.get(rel) != here.get(rel))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="zerotrain's wheel and the dependencies the GPU machine lacks")
    b.add_argument("--out", type=Path, default=ROOT / ".gpu-bundle")
    b.add_argument("--python-version", default="3.12", help="the GPU machine's Python (wheel tags cpXY)")
    s = sub.add_parser("select", help="print the wheels this interpreter lacks, one path a line")
    s.add_argument("bundle", type=Path)
    v = sub.add_parser("verify", help="exit 1 when the checkout's sources differ from the bundled wheel's")
    v.add_argument("bundle", type=Path)
    v.add_argument("--checkout", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    if args.command == "build":
        return build(args.out.resolve(), args.python_version)
    if args.command == "select":
        print("\n".join(str(p) for p in select(args.bundle)))
        return 0
    stale = stale_sources(args.bundle, args.checkout)
    if stale:
        shown = ", ".join(stale[:8]) + (f" and {len(stale) - 8} more" if len(stale) > 8 else "")
        print(
            f"gpu bundle is stale: {len(stale)} source files differ from the checkout ({shown}); "
            "rebuild it with `make gpu-bundle` (or pass --allow-stale-bundle)",
            file=sys.stderr,
        )
        return 1
    print(f"gpu bundle: zerotrain wheel matches the checkout ({len(_manifest(args.bundle)['sources'])} source files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
