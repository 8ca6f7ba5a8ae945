"""The contract's generated code and vendored schema are what the sources and the installed wheel say.

* ``broker/_gen`` is exactly what ``scripts/gen_proto.py`` produces from ``proto/`` and
  ``third_party/protovalidate/`` (regenerate with ``python scripts/gen_proto.py``).
* The vendored ``buf/validate/validate.proto`` is the schema that the installed protovalidate wheel
  enforces. The wheel embeds it as a serialized ``FileDescriptorProto``; only file options differ,
  because the wheel was generated in Buf managed mode. When protovalidate is upgraded and its rules
  schema changes, this test fails until the matching upstream file is vendored.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parent.parent
GEN_SCRIPT = ROOT / "scripts" / "gen_proto.py"
VENDORED = ROOT / "third_party" / "protovalidate" / "buf" / "validate" / "validate.proto"


def load_gen_proto() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_proto", GEN_SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wheel_validate_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """The buf/validate/validate.proto descriptor that is compiled into the installed protovalidate wheel."""
    spec = importlib.util.find_spec("protovalidate._gen.buf.validate.validate_pb")
    assert spec is not None
    assert spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "file_desc":
            serialized = ast.literal_eval(node.args[0])
            assert isinstance(serialized, bytes)
            return descriptor_pb2.FileDescriptorProto.FromString(serialized)
    raise AssertionError(f"no file_desc(...) call in {spec.origin}")


def compile_vendored(tmp_path: Path) -> descriptor_pb2.FileDescriptorProto:
    out = tmp_path / "vendored.binpb"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{VENDORED.parents[2]}",
            f"--descriptor_set_out={out}",
            "buf/validate/validate.proto",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    assert [f.name for f in files] == ["buf/validate/validate.proto"]
    return files[0]


def without_file_options(fd: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    copy = descriptor_pb2.FileDescriptorProto()
    copy.CopyFrom(fd)
    copy.ClearField("options")
    return copy


def test_generated_code_is_fresh() -> None:
    done = subprocess.run(
        [sys.executable, str(GEN_SCRIPT), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout}{done.stderr}"


def test_generation_is_deterministic(tmp_path: Path) -> None:
    gen = load_gen_proto()
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    gen.generate(first)
    gen.generate(second)
    files = gen.generated_files(first)
    assert files == gen.generated_files(second)
    assert "candace/agent/v1/agent_pb2.py" in files
    assert "buf/validate/validate_pb2.pyi" in files


def test_check_names_the_stale_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gen = load_gen_proto()
    committed = tmp_path / "broker" / "_gen"
    committed.mkdir(parents=True)
    gen.generate(committed)
    stub = committed / "candace" / "agent" / "v1" / "agent_pb2.pyi"
    stub.write_text(stub.read_text(encoding="utf-8") + "# edited by hand\n", encoding="utf-8")
    (committed / "candace" / "agent" / "v1" / "old_pb2.py").write_text("", encoding="utf-8")
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    monkeypatch.setattr(gen, "OUT", committed)
    assert gen.check() == 1
    out = capsys.readouterr().out
    assert "generated code stale: broker/_gen/candace/agent/v1/agent_pb2.pyi" in out
    assert "broker/_gen/candace/agent/v1/old_pb2.py" in out
    assert "run: python scripts/gen_proto.py" in out


def test_generated_imports_point_into_broker() -> None:
    gen_dir = ROOT / "broker" / "_gen"
    agent = (gen_dir / "candace" / "agent" / "v1" / "agent_pb2.py").read_text(encoding="utf-8")
    assert "from broker._gen.buf.validate import validate_pb2 as " in agent
    for path in gen_dir.rglob("*.py*"):
        if path.suffix not in (".py", ".pyi"):
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            assert not line.startswith(("from buf", "import buf", "from candace", "import candace")), (
                f"{path}: {line}"
            )
    for directory in [gen_dir, *(p for p in gen_dir.rglob("*") if p.is_dir() and p.name != "__pycache__")]:
        assert (directory / "__init__.py").is_file(), directory


def test_generated_classes_live_in_broker() -> None:
    from broker._gen.candace.agent.v1 import agent_pb2

    assert agent_pb2.AgentMessage.__module__ == "broker._gen.candace.agent.v1.agent_pb2"
    assert agent_pb2.AgentMessage.DESCRIPTOR.full_name == "candace.agent.v1.AgentMessage"


def test_vendored_validate_proto_matches_wheel(tmp_path: Path) -> None:
    vendored = without_file_options(compile_vendored(tmp_path))
    wheel = without_file_options(wheel_validate_descriptor())
    assert vendored.name == wheel.name == "buf/validate/validate.proto"
    assert vendored.package == wheel.package == "buf.validate"
    assert [m.name for m in vendored.message_type] == [m.name for m in wheel.message_type]
    assert vendored == wheel
