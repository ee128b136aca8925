"""The wheel carries what an installed retool_exec needs: types, image inputs, the agent."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_ships_py_typed_agent_and_image_files(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    [wheel] = tmp_path.glob("retool_exec-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "retool_exec/py.typed" in names
    assert "retool_exec/backends/docker/agent/wire.py" in names
    assert "retool_exec/backends/docker/agent/supervisor.py" in names
    assert "retool_exec/backends/docker/image_files/preset-math.txt" in names
    assert "retool_exec/backends/docker/image_files/build-rootfs.sh" in names
    assert any(n.endswith("entry_points.txt") for n in names)


def test_agent_imports_nothing_from_the_package() -> None:
    """The agent is packed alone into the image: it must stand on the standard library."""
    imported = set()
    for path in (ROOT / "retool_exec/backends/docker/agent").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
