"""Regenerate the P4Runtime Python bindings of the installed `p4runtime` package with a current protoc.

The p4runtime wheels on PyPI (1.6.0 too, although it asks for protobuf >= 4.21.6) ship _pb2 modules written by an
old protoc, which build their descriptors one by one: every protobuf since 4.21 refuses them ("Descriptors cannot be
created directly"). Their serialized file descriptors are in those modules, though, and protoc generates code from
descriptors as well as from .proto sources (--descriptor_set_in). So this script reads each module's descriptor
(without importing it), hands the set to grpcio-tools' protoc and writes the new modules over the old ones, in place.
Run by install/python.sh after pip; a second run finds modules that load and does nothing.

    python install/p4runtime_bindings.py [--protoc DIR]   regenerate if needed; prints what it did in one line
(DIR: where grpcio-tools was installed with pip --target, when not in this interpreter's environment). The _pb2_grpc
modules are kept: they only name the service's calls and load with any grpcio.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import any_pb2, descriptor_pb2
from google.rpc import status_pb2


def say(text: str) -> None:
    print(f"install/p4runtime_bindings.py: {text}")


def package_root() -> Path:
    spec = importlib.util.find_spec("p4")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("install/p4runtime_bindings.py: the p4runtime package is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def old_descriptor(module: Path) -> bytes | None:
    """The serialized FileDescriptorProto an old-protoc module passes as serialized_pb=; None for a current one."""
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "serialized_pb":
                    return ast.literal_eval(keyword.value)
    return None


def descriptor_set(old: dict[Path, bytes]) -> tuple[descriptor_pb2.FileDescriptorSet, list[str]]:
    """The old modules' files plus what they import from protobuf and googleapis (already current there)."""
    found = descriptor_pb2.FileDescriptorSet()
    for module in (any_pb2, status_pb2):
        module.DESCRIPTOR.CopyToProto(found.file.add())
    names = []
    for serialized in old.values():
        found.file.add().ParseFromString(serialized)
        names.append(found.file[-1].name)
    return found, names


def protoc_env(protoc_dir: str) -> dict[str, str]:
    """grpcio-tools lives apart (--protoc DIR, pip's --target): it asks for a setuptools the virtualenv does not pin."""
    env = dict(os.environ)
    if protoc_dir:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [protoc_dir, env.get("PYTHONPATH")]))
    return env


def regenerate(root: Path, old: dict[Path, bytes], protoc_dir: str) -> None:
    found, names = descriptor_set(old)
    with tempfile.TemporaryDirectory() as tmp:
        set_path = Path(tmp) / "p4runtime.pb"
        set_path.write_bytes(found.SerializeToString())
        out = Path(tmp) / "out"
        out.mkdir()
        protoc = [sys.executable, "-m", "grpc_tools.protoc", f"--descriptor_set_in={set_path}", f"--python_out={out}"]
        done = subprocess.run([*protoc, *names], capture_output=True, text=True, env=protoc_env(protoc_dir))
        if done.returncode != 0:
            sys.exit(f"install/p4runtime_bindings.py: protoc failed: {done.stderr.strip()}")
        for made in out.rglob("*.py"):
            target = root.parent / made.relative_to(out)
            target.write_text(made.read_text())


def main() -> None:
    if sys.argv[1:] and (sys.argv[1] != "--protoc" or len(sys.argv) != 3):
        sys.exit("usage: install/p4runtime_bindings.py [--protoc DIR]")
    protoc_dir = sys.argv[2] if sys.argv[1:] else ""
    root = package_root()
    old = {m: d for m in sorted(root.rglob("*_pb2.py")) if (d := old_descriptor(m)) is not None}
    if not old:
        say(f"the P4Runtime bindings in {root} are current")
        return
    regenerate(root, old, protoc_dir)
    still_old = [m for m in old if old_descriptor(m) is not None]
    if still_old:
        sys.exit(f"install/p4runtime_bindings.py: {still_old[0]} was not regenerated")
    say(f"regenerated {len(old)} P4Runtime modules in {root} with protoc from grpcio-tools")


if __name__ == "__main__":
    main()
