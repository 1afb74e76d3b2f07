"""`sam build` the stack and report each function's and the layer's deployment package size against Lambda's
limits: 50 MB zipped for a direct upload, 250 MB unzipped for a function together with its layers.

    python -m infra.sam_package_sizes [--sam .venv-sam/bin/sam] [--build-dir .aws-sam/build] [--out FILE.json]
    python -m infra.sam_package_sizes --no-build   # only measure an existing build

`sam build` installs each code folder's requirements with the runtime's Python version (python3.12 for this
template) and no container, so that interpreter must exist here: the script looks for `python3.12` on PATH,
then in pyenv's versions, and puts its folder first on PATH for sam. Zipped sizes are measured by zipping the
built folder with deflate, as `sam package`/`sam deploy` do.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = REPO_ROOT / "template.yaml"
ZIPPED_LIMIT = 50 * 1024 * 1024  # direct upload of a .zip (sam deploy goes through S3, where only the next applies)
UNZIPPED_LIMIT = 250 * 1024 * 1024  # a function's code and all its layers, unzipped


class SamBuildError(RuntimeError):
    """sam build could not run or failed; the message says why."""


@dataclass(frozen=True)
class Package:
    name: str
    kind: str  # "function" or "layer"
    zipped: int
    unzipped: int
    files: int
    layers: tuple[str, ...] = ()
    with_layers_unzipped: int = 0

    @property
    def within_limits(self) -> bool:
        total = self.with_layers_unzipped or self.unzipped
        return self.zipped <= ZIPPED_LIMIT and total <= UNZIPPED_LIMIT


def runtime_of(template_path: Path = TEMPLATE) -> str:
    """The template's Globals.Function.Runtime (e.g. "python3.12")."""
    from infra.local.cfn import load_template

    runtime: str = load_template(template_path)["Globals"]["Function"]["Runtime"]
    return runtime


def find_python(version: str) -> Path:
    """A working Python `version` ("3.12"): on PATH, else the newest pyenv build of it (a pyenv shim on PATH may
    exist and still refuse to run when that version is not the selected one, so each candidate is tried)."""
    candidates = [Path(found)] if (found := shutil.which(f"python{version}")) else []
    roots = [Path(os.environ["PYENV_ROOT"])] if os.environ.get("PYENV_ROOT") else []
    roots.append(Path.home() / ".pyenv")
    for root in roots:
        candidates += sorted((root / "versions").glob(f"{version}.*/bin/python{version}"), reverse=True)
    for candidate in candidates:
        probe = subprocess.run(
            [str(candidate), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    raise SamBuildError(
        f"sam build needs a python{version} interpreter (the template's runtime) and none was found on PATH "
        f"or under pyenv; install Python {version} (e.g. `pyenv install {version}`) and retry"
    )


def sam_build(
    sam: Path, build_dir: Path, cache_dir: Path | None, template_path: Path = TEMPLATE, *, cached: bool = True
) -> None:
    """Run `sam build` into build_dir. cached=False builds from scratch without SAM's caches (which sam keeps
    in cache_dir and .aws-sam/deps), so concurrent builds cannot meet there; pip's own cache still applies."""
    version = runtime_of(template_path).removeprefix("python")
    python = find_python(version)
    env = {**os.environ, "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["SAM_CLI_TELEMETRY"] = "0"
    command = [
        str(sam),
        "build",
        "--template-file",
        str(template_path),
        "--build-dir",
        str(build_dir),
    ]
    command += ["--cached", "--cache-dir", str(cache_dir)] if cached and cache_dir else ["--no-cached"]
    result = subprocess.run(
        command, cwd=template_path.parent, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    if result.returncode != 0:
        raise SamBuildError(f"sam build failed ({result.returncode}):\n{result.stdout[-4000:]}{result.stderr[-4000:]}")


def folder_sizes(folder: Path) -> tuple[int, int, int]:
    """(zipped bytes, unzipped bytes, files) of a folder zipped with deflate."""
    unzipped = files = 0
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.is_symlink():
                archive.write(path, path.relative_to(folder).as_posix())
                unzipped += path.stat().st_size
                files += 1
    return len(buffer.getvalue()), unzipped, files


def packages(build_dir: Path) -> list[Package]:
    """Every function and layer in a `sam build` output, with each function's total including its layers."""
    from infra.local.cfn import load_template

    built = load_template(build_dir / "template.yaml")
    resources: dict[str, Any] = built["Resources"]
    layer_ids = [k for k, r in resources.items() if r["Type"] == "AWS::Serverless::LayerVersion"]
    function_ids = [k for k, r in resources.items() if r["Type"] == "AWS::Serverless::Function"]
    global_layers = built.get("Globals", {}).get("Function", {}).get("Layers", [])

    layers = {name: Package(name, "layer", *folder_sizes(build_dir / name)) for name in layer_ids}
    result = list(layers.values())
    for name in function_ids:
        declared = resources[name]["Properties"].get("Layers", global_layers)
        used = tuple(ref["Ref"] for ref in declared if isinstance(ref, dict) and ref.get("Ref") in layers)
        zipped, unzipped, files = folder_sizes(build_dir / name)
        total = unzipped + sum(layers[layer].unzipped for layer in used)
        result.append(Package(name, "function", zipped, unzipped, files, used, total))
    return result


def mb(size: int) -> str:
    return f"{size / 1024 / 1024:.2f}"


def table(found: list[Package]) -> str:
    lines = [
        f"{'package':<24} {'kind':<9} {'zipped MB':>9} {'unzipped MB':>11} {'+layers MB':>10}  limits",
        "-" * 78,
    ]
    for p in found:
        with_layers = mb(p.with_layers_unzipped) if p.kind == "function" else ""
        verdict = "ok" if p.within_limits else "OVER"
        lines.append(f"{p.name:<24} {p.kind:<9} {mb(p.zipped):>9} {mb(p.unzipped):>11} {with_layers:>10}  {verdict}")
    lines.append(f"limits: {mb(ZIPPED_LIMIT)} MB zipped (direct upload), {mb(UNZIPPED_LIMIT)} MB unzipped with layers")
    return "\n".join(lines)


def report(found: list[Package]) -> dict[str, Any]:
    return {
        "limits": {"zipped_bytes": ZIPPED_LIMIT, "unzipped_with_layers_bytes": UNZIPPED_LIMIT},
        "packages": [{**asdict(p), "within_limits": p.within_limits} for p in found],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sam", type=Path, default=REPO_ROOT / ".venv-sam" / "bin" / "sam")
    parser.add_argument("--build-dir", type=Path, default=REPO_ROOT / ".aws-sam" / "build")  # where sam deploy looks
    parser.add_argument("--cache-dir", type=Path, default=REPO_ROOT / "build" / "sam-cache")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "build" / "sam-sizes.json")
    parser.add_argument("--no-build", action="store_true", help="measure an existing build only")
    args = parser.parse_args(argv)

    if not args.no_build:
        try:
            sam_build(args.sam, args.build_dir.resolve(), args.cache_dir.resolve())
        except SamBuildError as e:
            print(e, file=sys.stderr)
            return 2
    found = packages(args.build_dir)
    print(table(found))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report(found), indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(p.within_limits for p in found) else 1


if __name__ == "__main__":
    sys.exit(main())
